"""Run configuration: one frozen dataclass per section, built from a YAML preset plus overrides.

A preset (``configs/<name>.yaml``) is the single source of truth for a study. Its ``rl:``
mapping holds the sections of one RL run (model, data, rollout, algorithm, optim, schedule,
tracking); ``train_config_from_dict`` turns it into a validated ``TrainConfig``. Which runs a
study needs (the ``grid:`` mapping, named runs, ``load_train_config`` for one of them) is the
planner's question: rspo/plan.py.

Errors name the key: ``ConfigError: rl.algorithm.gamma_min: must lie in (0, 1], got 1.5``. A
setting's bounds and choices are stated once, on its field (rspo.constraints.setting): checked when
the section is built, and the source of the preset schema's ``rl`` sections (``rl_schema``; written
into workflow/schemas/preset.schema.yaml by scripts/preset_schema.py). A section's ``checks`` hold
what relates two fields or needs a reason.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rspo.backend_capabilities import CAPABILITIES
from rspo.chat import HAND_TEMPLATES
from rspo.constraints import Section, section_schema, setting
from rspo.method import (  # noqa: F401 (ALGOS, ConfigError, check_gamma_min: re-exported for the planner and commands)
    ALGOS,
    DEFAULT_GAMMA_MIN,
    GAMMA_MIN_BOUNDS,
    ROLLOUT_CORRECTIONS,
    ROUTING_MODES,
    ConfigError,
    check_gamma_min,
)

TASKS = ("countdown", "math", "code")
BACKENDS = tuple(CAPABILITIES)
OLD_VALUES = ("recompute", "rollout")
PROMPT_FORMATS = ("steps", "optimal_path", "search_path")
TEMPLATES = ("auto", "chat") + tuple(dict.fromkeys(t for ts in HAND_TEMPLATES.values() for t in ts))


def _err(key: str, msg: str) -> ConfigError:
    return ConfigError(f"{key}: {msg}")


# ----------------------------------------------------------------------------- sections


@dataclass(frozen=True)
class ModelConfig(Section):
    path: str = ""
    """Base checkpoint: a local Hugging Face folder (pretrained by `rspo pretrain`) or a hub id."""
    dtype: str = setting("float32", choices=("float32", "bfloat16", "float16"), noun="dtype")
    """Training dtype: float32 (CPU) or bfloat16 (GPU)."""
    device: str = setting("auto", choices=("auto", "cpu", "cuda"), noun="device")
    """auto (cuda if available, else cpu), cpu or cuda."""
    threads: int = setting(0, ge=0)
    """torch intra-op threads; 0 = the cores the job was given (Snakemake `threads`, OMP_NUM_THREADS)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (large models)."""
    cpu_offload: bool = False
    """torchrun on GPUs only: FSDP2's CPUOffloadPolicy: parameter shards, gradients and Adam's
    moments live on the host and the optimizer steps on the CPU (the GPU holds one gathered layer
    at a time). Trades a host<->GPU copy of the shards per step for 16 bytes per parameter / ranks
    of GPU memory (rspo.gpu_memory.plan)."""
    logits_chunk_tokens: int = setting(0, ge=0)
    """> 0: the old pass and the updates compute log-probs and entropy from the final hidden states
    this many positions at a time, recomputing each chunk's logits in backward, so no forward ever
    holds the (tokens x vocabulary) logits in fp32 (rspo.train.chunked_logprobs). 0: transformers' logits."""
    collective_timeout_min: int = setting(30, ge=1)
    """torchrun jobs: minutes a collective may wait for the other ranks before the job fails (the
    process group's timeout). A save, a long rollout on one rank and a slow filesystem all count;
    the paper presets allow 60."""


@dataclass(frozen=True)
class DataConfig(Section):
    task: str = setting("countdown", choices=TASKS, noun="task")
    """countdown | math | code: selects the verifier (one per task, shared with evaluation)."""
    train_path: str = ""
    """Training prompts (JSONL): Countdown records, or normalised math/code records."""
    val_paths: dict[str, str] = field(default_factory=dict)
    """Held-out sets scored during training, name -> JSONL path (logged as val/<name>/score)."""
    prompt_format: str = setting("steps", choices=PROMPT_FORMATS, noun="format")
    """Countdown text format: steps | optimal_path | search_path (see rspo.data.countdown)."""
    template: str = setting("auto", choices=TEMPLATES, noun="template")
    """Math/code prompts (rspo.chat): chat (the model's own chat template), a hand-written template
    (math: qwen_math | no | plain; code: chatml | plain), or auto (chat when the tokenizer has a
    chat template, else qwen_math / chatml). Countdown prompts use ``prompt_format``."""
    enable_thinking: bool | None = None
    """The chat template's thinking switch (Qwen3's hybrid models): true or false when the
    template has one (required then), left out otherwise; rewards then grade the text after the
    thinking block (rspo.chat)."""
    max_prompt_tokens: int = setting(512, ge=1)
    """Prompts longer than this are dropped when the data is loaded."""
    reward_workers: int = setting(1, ge=1)
    """Worker processes for the verifier (math-verify needs processes: it uses signal.alarm; code
    runs in sandboxes with time limits). A budget per node: the ranks of a torchrun job on one node
    share it (each gets reward_workers // ranks, at least 1), so the node's CPUs are not
    oversubscribed and correct programs do not hit their time limits."""

    def checks(self, prefix: str) -> None:
        if self.task in HAND_TEMPLATES and self.template not in ("auto", "chat") + HAND_TEMPLATES[self.task]:
            raise _err(
                f"{prefix}.template",
                f"{self.template!r} is not a {self.task} template; choose one of "
                f"{['auto', 'chat', *HAND_TEMPLATES[self.task]]}",
            )
        if self.enable_thinking is not None and not isinstance(self.enable_thinking, bool):
            raise _err(f"{prefix}.enable_thinking", f"must be true, false or left out, got {self.enable_thinking!r}")


@dataclass(frozen=True)
class RolloutConfig(Section):
    backend: str = setting("hf", choices=BACKENDS, noun="backend")
    """hf (our KV-cache sampling loop on the training model, CPU/GPU) or vllm (a colocated vLLM
    engine: the GPU extra, or vLLM's CPU build; rspo.rollout.vllm)."""
    group_size: int = setting(8, ge=2)
    """G responses per prompt (paper Appendix A: G = 8)."""
    temperature: float = setting(1.0, gt=0)
    """Sampling temperature; the old pass and the updates score log-probs of the same
    temperature-scaled distribution (logits / temperature), so importance ratios compare the
    distribution that was sampled."""
    top_p: float = setting(1.0, gt=0, le=1)
    """Must be 1 for training: a truncated (top-p) sampler would need its truncation applied to
    every scored log-prob too; validation and evaluation decode separately."""
    max_new_tokens: int = setting(64, ge=1)
    """Response length cap (paper: 8K tokens; CPU presets use far less)."""
    val_temperature: float = setting(0.0, ge=0)
    """Decoding temperature of the periodic validation (0 = greedy)."""
    vllm_gpu_memory_utilization: float = setting(0.5, gt=0, le=1)
    """vLLM only: fraction of GPU memory the colocated engine may take."""
    tensor_parallel_size: int = setting(1, ge=1)
    """vLLM under torchrun: ranks that share one engine, each holding 1/N of every layer (a multiple
    of it must run on each node; rspo.rollout.colocate). 1: an engine per rank."""
    vllm_sleep: bool = False
    """vLLM on GPUs: free the engine's weights and KV cache while the old pass and the updates run
    (sleep mode, level 2); the sync wakes the weights, then the KV cache (rspo.rollout.colocate). Its
    CUDA graphs move to host memory while it sleeps. A no-op on vLLM's CPU build."""
    vllm_enforce_eager: bool = False
    """vLLM on GPUs: decode without CUDA graphs (slower; no graph pool in GPU memory). CPU engines
    always run eagerly."""
    dtype: str = setting("", choices=("", "float32", "bfloat16", "float16", "fp8"), noun="dtype")
    """The rollout engine's precision: "" (model.dtype: the trainer's compute dtype), float32,
    bfloat16, float16 or fp8. The vLLM engine runs in it; the hf backend decodes under autocast to it.
    fp8 (hf backend, one process): an FP8 W8A8 engine, the decoder's weights and the inputs of their
    products rounded to E4M3 while it decodes, bf16 arithmetic (rspo.rollout.fp8). Another precision
    than the trainer's makes the train-inference mismatch (docs/mismatch.md)."""
    old_values: str = setting("recompute", choices=OLD_VALUES, noun="source of the old values")
    """Where a step's old log-probs, entropy and router cache come from. "recompute" (the paper's,
    verl's and TRL's default): the old pass, a no-grad forward of the trainer over the step's rows.
    "rollout": recorded by the hf backend while it samples (it decodes with the training model in
    the trainer's precision), so the old pass is skipped. Not bit for bit the old pass: the decoding's
    KV-cache forwards (and, on the CPU, its eager attention) round differently (docs/performance.md
    measures by how much). hf backend, rollout.dtype the trainer's (""), one process, routing none or
    freeze (the replay modes need the old pass's own cache)."""

    def checks(self, prefix: str) -> None:
        if self.old_values == "rollout" and (not CAPABILITIES[self.backend].in_trainer or self.dtype):
            raise _err(
                f"{prefix}.old_values",
                "rollout needs an engine that decodes with the training model in its precision "
                f'(backend hf, dtype ""), got backend {self.backend!r}, dtype {self.dtype!r}: the old values '
                "would score another policy than the trainer's",
            )
        if self.top_p != 1.0:
            raise _err(
                f"{prefix}.top_p",
                f"must be 1.0 for RL training, got {self.top_p}: the old pass and the "
                "updates score the full temperature-scaled distribution, so a top-p sampler would make "
                "every importance ratio compare another distribution than the one sampled",
            )
        can = CAPABILITIES[self.backend]
        if (self.tensor_parallel_size > 1 and not can.tensor_parallel) or (self.vllm_sleep and not can.sleep):
            raise _err(prefix, "tensor_parallel_size > 1 and vllm_sleep need backend: vllm")
        if self.vllm_enforce_eager and not can.enforce_eager:
            raise _err(f"{prefix}.vllm_enforce_eager", "needs backend: vllm")
        if self.dtype == "fp8" and not can.fp8_decoding:
            raise _err(
                f"{prefix}.dtype",
                "fp8 rounds the hf backend's decoding weights (rspo.rollout.fp8); a vLLM engine in FP8 is "
                "vLLM's own quantization, not wired here",
            )


@dataclass(frozen=True)
class AlgorithmConfig(Section):
    algo: str = setting("gmpo", choices=ALGOS, noun="algorithm")
    """Base objective: grpo | gspo | gmpo (rspo.losses)."""
    router_shift: bool = False
    """Router-shift weighting (RS). RSPO = gmpo + router_shift."""
    gamma_min: float = setting(DEFAULT_GAMMA_MIN, gt=GAMMA_MIN_BOUNDS[0], le=GAMMA_MIN_BOUNDS[1])
    """Floor on gamma (paper: 0.8 in all experiments); also the threshold of router/shift_clipfrac."""
    stop_gradient: bool = True
    """Detach gamma (paper); False is the collapse ablation (Appendix B)."""
    routing: str = setting("none", choices=ROUTING_MODES, noun="routing mode")
    """Routing control: none | freeze | logit_replay | index_replay (Appendix D, during updates) |
    rollout_replay (R3, beyond the paper: the rollout engine's experts forced in the old pass and the
    updates; docs/mismatch.md)."""
    rollout_correction: str = setting("none", choices=ROLLOUT_CORRECTIONS, noun="correction")
    """Train-inference mismatch correction (beyond the paper; docs/mismatch.md): none | token_truncate
    (TIS) | token_mask (icepop) | sequence_truncate | sequence_mask (MIS), on the ratio old-pass
    probability / engine probability (rspo.losses.rollout_correction)."""
    rollout_correction_low: float = setting(0.5, ge=0, lt=1)
    """Lower bound of the correction's ratio for the mask modes (icepop: 0.5)."""
    rollout_correction_high: float = setting(2.0, gt=1)
    """Upper bound: the truncation of the truncate modes, the mask's top for the mask modes (verl
    and ms-swift use 2; TRL 1.16 3)."""
    clip_low: float | None = setting(None, ge=0)
    """None -> the paper's default for algo (rspo.method.OBJECTIVES: its clip)."""
    clip_high: float | None = setting(None, ge=0)
    entropy_coef: float = setting(0.0, ge=0)
    """Entropy bonus coefficient (0 in the paper)."""
    router_aux_loss_coef: float = setting(0.0, ge=0)
    """Load-balancing aux loss during RL (0 by default, as verl/NeMo do for GRPO on MoE)."""


@dataclass(frozen=True)
class OptimConfig(Section):
    lr: float = setting(1e-6, gt=0)
    weight_decay: float = setting(0.0, ge=0)
    betas: tuple[float, float] = setting((0.9, 0.999), ge=0, lt=1)
    eps: float = setting(1e-8, gt=0)
    grad_clip: float = setting(1.0, gt=0)
    """Global grad-norm clip (verl default 1.0)."""
    warmup_steps: int = setting(0, ge=0)
    """Linear warmup in optimiser updates, then constant (verl's default schedule)."""
    max_nonfinite_in_row: int = setting(3, ge=1)
    """Stop the run after this many consecutive updates skipped for NaN/inf loss or gradients."""
    router_lr_mult: float = setting(1.0, gt=0)
    """Learning rate of the router weights (``mlp.gate.weight``) as a multiple of ``lr``. Not in
    the paper (1 = one lr for all weights). Above 1 it is the stress regime's controlled variable:
    router drift made large on purpose, to test whether RS delays or prevents collapse. With
    ``router_lr_mult_final`` set it is the multiplier before ``router_lr_change``'s first step."""
    router_lr_mult_final: float | None = setting(None, gt=0)
    """Not in the paper: a router-lr schedule. None: ``router_lr_mult`` throughout. Set: the multiplier
    the router reaches at rollout step ``router_lr_change[1]`` and keeps (the small study's
    learn-then-drift and build-up-drift trials: router drift that starts after the policy learned)."""
    router_lr_change: tuple[int, int] = setting((0, 0), ge=0)
    """(start, end) rollout steps of the schedule, 0-based (the step being trained; step t is logged as
    t + 1): ``router_lr_mult`` before start, ``router_lr_mult_final`` from end on, linear in between;
    start == end is a step function at start (x1 until S, then x150: ``(S, S)``)."""

    def checks(self, prefix: str) -> None:
        start, end = self.router_lr_change
        if end < start:
            raise _err(f"{prefix}.router_lr_change", f"end {end} is before start {start}")
        if self.router_lr_mult_final is None and self.router_lr_change != (0, 0):
            raise _err(
                f"{prefix}.router_lr_change",
                f"{list(self.router_lr_change)} without router_lr_mult_final: the schedule has nothing to change to",
            )


@dataclass(frozen=True)
class ScheduleConfig(Section):
    total_steps: int = setting(100, ge=1)
    """Rollout steps."""
    prompts_per_step: int = setting(256, ge=1)
    """Global batch in prompts (paper small setting: 256)."""
    mini_batch_prompts: int = setting(64, ge=1)
    """Prompts per optimiser update (paper: 64 -> 4 updates per step, updates 2..4 off-policy)."""
    micro_batch_size: int = setting(0, ge=0)
    """Responses per forward/backward for gradient accumulation; 0 = the whole mini-batch."""
    max_tokens_per_micro_batch: int = setting(0, ge=0)
    """> 0: the rows of a forward (old pass and updates) are packed, longest first, so that rows x
    the widest row's tokens stay within this budget (rspo.train.micro_batches); gradients accumulate to the
    whole mini-batch's. 0: no token bound (micro_batch_size rows)."""
    ppo_epochs: int = setting(1, ge=1)
    """Passes over the step's mini-batches."""
    val_every: int = setting(10, ge=0)
    """Validate every N steps (and at step 0 and the last step); 0 disables."""
    val_size: int = setting(0, ge=0)
    """Held-out prompts per validation set; 0 = all."""
    ckpt_every: int = setting(10, ge=0)
    """Checkpoint every N steps (and at the end)."""
    keep_checkpoints: int = setting(1, ge=1)
    """How many step checkpoints to keep."""

    def checks(self, prefix: str) -> None:
        if self.prompts_per_step % self.mini_batch_prompts != 0:
            raise _err(
                f"{prefix}.mini_batch_prompts",
                f"{self.mini_batch_prompts} does not divide prompts_per_step={self.prompts_per_step}",
            )


@dataclass(frozen=True)
class TrackingConfig(Section):
    experiment: str = setting("rspo", nonempty=True)
    """MLflow experiment (one per preset)."""
    tracking_uri: str = ""
    """MLflow store; empty -> $MLFLOW_TRACKING_URI, else sqlite under the preset's results folder."""
    router_diagnostics: bool = True
    """Log router/shift_* for every run (RS or not). False skips the router cache when nothing
    else needs it (used by `rspo bench` to measure a plain GMPO baseline)."""
    collapse_window: int = setting(5, ge=1)
    """Collapse detector: steps over which the reward drop must be sustained."""
    collapse_drop: float = setting(0.5, gt=0, le=1)
    """... relative drop of the windowed training reward below its running best."""
    collapse_kl_spike: float = setting(5.0, gt=1)
    """... together with |ppo_kl| or grad_norm above this multiple of its running median."""
    collapse_sustain: int = setting(10, ge=0)
    """... or that drop held for this many steps in a row, with or without a spike (0: off)."""


# Settings that change how a run executes, not what it computes (TrainConfig.fingerprint).
EXECUTION_ONLY: tuple[str, ...] = (
    "model.collective_timeout_min",
    "model.cpu_offload",
    "model.logits_chunk_tokens",
    "schedule.max_tokens_per_micro_batch",
    "rollout.tensor_parallel_size",
    "rollout.vllm_sleep",
    "rollout.vllm_enforce_eager",
)
# Settings added after runs existed, with the value those runs had: counted in the fingerprint
# only where they differ from it (TrainConfig.fingerprint).
ADDED_LATER: dict[str, Any] = {
    "data.template": "auto",
    "data.enable_thinking": None,
    "rollout.dtype": "",
    "algorithm.rollout_correction": "none",
    "algorithm.rollout_correction_low": 0.5,
    "algorithm.rollout_correction_high": 2.0,
    "tracking.collapse_sustain": 0,
    "rollout.old_values": "recompute",
    "optim.router_lr_mult_final": None,
    "optim.router_lr_change": (0, 0),
}

# Settings removed after runs existed: the one value every such run had (put back into the fingerprint,
# so those runs keep their identity) and why it went (told to a preset that still sets it).
REMOVED: dict[str, tuple[Any, str]] = {
    "algorithm.kl_coef": (0.0, "a KL penalty was never implemented (only 0 was accepted; the paper uses none)"),
    "tracking.log_every": (1, "every step was always logged; the setting did nothing"),
}


def removed_reason(key_path: str) -> str | None:
    """The message for a removed setting (``...<section>.<name>``, e.g. ``rl.algorithm.kl_coef``), or None."""
    key = ".".join(key_path.split(".")[-2:])
    if key not in REMOVED:
        return None
    return f"{key_path}: removed ({REMOVED[key][1]}); delete it from the preset"


SECTIONS: dict[str, type] = {
    "model": ModelConfig,
    "data": DataConfig,
    "rollout": RolloutConfig,
    "algorithm": AlgorithmConfig,
    "optim": OptimConfig,
    "schedule": ScheduleConfig,
    "tracking": TrackingConfig,
}


def rl_schema() -> dict[str, Any]:
    """The JSON schema of a preset's ``rl`` mapping (and of each overlay on it), from the sections'
    dataclasses: what workflow/schemas/preset.schema.yaml holds under ``$defs/rl``."""
    props = {name: section_schema(cls) for name, cls in SECTIONS.items()}
    return {"type": "object", "additionalProperties": False, "properties": props}


@dataclass(frozen=True)
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    seed: int = 0
    preset: str = ""
    run_name: str = ""

    def __post_init__(self) -> None:
        for name in SECTIONS:  # each field's constraints (rspo.constraints), then the section's own checks
            getattr(self, name).validate(f"rl.{name}")
        if self.rollout.old_values == "rollout" and self.algorithm.routing not in ("none", "freeze"):
            raise _err(
                "rl.rollout.old_values",
                f"rollout needs routing none or freeze, got {self.algorithm.routing!r}: replay reads the old "
                "pass's router cache (its logits, or the experts of a forward the rollout does not run)",
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def fingerprint(self) -> str:
        """Hash of the resolved config: a run folder with another fingerprint is another run.

        Settings in ``EXECUTION_ONLY`` are left out: they change how a run executes (timeouts,
        memory layout), not what it computes, so changing one (say, a longer timeout after a job
        timed out) resumes the run instead of refusing its folder, and Snakemake does not rerun it.
        Settings added after runs already existed (``ADDED_LATER``) count only where they differ
        from their default, so a run configured before they existed keeps its identity; settings
        removed since (``REMOVED``) are put back with the one value they ever had, for the same reason."""
        d = self.to_dict()
        for key in EXECUTION_ONLY:
            section, name = key.split(".")
            d[section].pop(name, None)
        for key, default in ADDED_LATER.items():
            section, name = key.split(".")
            if d[section].get(name) == default:
                d[section].pop(name)
        for key, (value, _) in REMOVED.items():
            section, name = key.split(".")
            d[section][name] = value
        return hashlib.sha256(json.dumps(d, sort_keys=True, default=list).encode()).hexdigest()[:16]

    def flat_params(self) -> dict[str, str]:
        """Flattened `section/key` params for MLflow."""
        return flatten(self.to_dict())


# ----------------------------------------------------------------------------- strict parsing


def check_type(key: str, value: Any, tp: Any) -> Any:
    """Check value against annotation tp; ints are accepted where floats are expected."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return check_type(key, value, arg)
            except ConfigError:
                continue
        raise _err(key, f"expected {tp}, got {type(value).__name__} {value!r}")
    if origin is typing.Literal:
        if value not in typing.get_args(tp):
            raise _err(key, f"expected one of {list(typing.get_args(tp))}, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp):  # a section inside a section
        return build_section(tp, value, key)
    if origin is dict:
        if not isinstance(value, dict):
            raise _err(key, f"expected a mapping, got {type(value).__name__}")
        kt, vt = typing.get_args(tp)
        return {check_type(f"{key}.{k}", k, kt): check_type(f"{key}.{k}", v, vt) for k, v in value.items()}
    if origin is tuple and typing.get_args(tp)[-1:] == (Ellipsis,):  # a list of any length
        if not isinstance(value, (list, tuple)):
            raise _err(key, f"expected a list, got {type(value).__name__}")
        item = typing.get_args(tp)[0]
        return tuple(check_type(f"{key}[{i}]", v, item) for i, v in enumerate(value))
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise _err(key, f"expected a list, got {type(value).__name__}")
        args = typing.get_args(tp)
        if len(args) != len(value):
            raise _err(key, f"expected {len(args)} items, got {len(value)}")
        return tuple(check_type(f"{key}[{i}]", v, a) for i, (v, a) in enumerate(zip(value, args)))
    if tp is bool:
        if not isinstance(value, bool):
            raise _err(key, f"expected true/false, got {type(value).__name__} {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _err(key, f"expected an integer, got {type(value).__name__} {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _err(key, f"expected a number, got {type(value).__name__} {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise _err(key, f"expected a string, got {type(value).__name__} {value!r}")
        return value
    raise _err(key, f"unsupported annotation {tp}")  # pragma: no cover


def build_section(cls: type, data: dict[str, Any] | None, prefix: str) -> Any:
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise _err(prefix, f"expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    for name in unknown:
        if (why := removed_reason(f"{prefix}.{name}")) is not None:
            raise ConfigError(why)
    if unknown:
        raise _err(f"{prefix}.{unknown[0]}", f"unknown key; valid keys are {sorted(names)}")
    missing = [
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and f.name not in data
    ]
    if missing:
        raise _err(f"{prefix}.{missing[0]}", "required")
    kwargs = {k: check_type(f"{prefix}.{k}", v, hints[k]) for k, v in data.items()}
    return cls(**kwargs)


def build_checked(cls: type, data: dict[str, Any] | None, prefix: str) -> Any:
    """A section (rspo.constraints.Section) built from a preset's mapping, then checked: its fields'
    constraints and its own cross-field checks; a ConfigError names the key."""
    section = build_section(cls, data, prefix)
    section.validate(prefix)
    return section


def train_config_from_dict(rl: dict[str, Any], *, seed: int = 0, preset: str = "", run_name: str = "") -> TrainConfig:
    if not isinstance(rl, dict):
        raise _err("rl", f"expected a mapping, got {type(rl).__name__}")
    unknown = sorted(set(rl) - set(SECTIONS))
    if unknown:
        raise _err(f"rl.{unknown[0]}", f"unknown section; valid sections are {sorted(SECTIONS)}")
    sections = {name: build_section(cls, rl.get(name), f"rl.{name}") for name, cls in SECTIONS.items()}
    return TrainConfig(**sections, seed=seed, preset=preset, run_name=run_name)


def set_by_path(d: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    cur = d
    for k in keys[:-1]:
        nxt = cur.setdefault(k, {})
        if not isinstance(nxt, dict):
            raise _err(dotted, f"{k!r} is not a mapping")
        cur = nxt
    cur[keys[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """`section.key=value` with a YAML value (`algorithm.gamma_min=0.5`, `rollout.backend=vllm`)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected key=value")
    key, raw = text.split("=", 1)
    value = yaml.safe_load(raw)
    if isinstance(value, str):  # YAML 1.1 reads `1e-4` (no dot) as a string
        try:
            value = float(value) if any(c in value.lower() for c in ".e") else int(value)
        except ValueError:
            pass
    return key.strip(), value


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in d.items():
        key = f"{prefix}/{k}" if prefix else str(k)
        if isinstance(v, dict) and v:
            out.update(flatten(v, key))
        else:
            out[key] = json.dumps(v) if isinstance(v, (list, tuple, dict)) else str(v)
    return out


# ----------------------------------------------------------------------------- presets


def load_preset(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"preset file not found: {path}")
    try:  # libyaml's parser where PyYAML has it: SafeLoader's result, ~10x faster (Snakemake reads it per run)
        data = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a preset must be a mapping, got {type(data).__name__}")
    return data


def check_world_size(cfg: TrainConfig, world_size: int) -> None:
    """The step's prompts and every mini-batch's rows must split evenly over the ranks."""
    sc, G = cfg.schedule, cfg.rollout.group_size
    if sc.prompts_per_step % world_size:
        raise ConfigError(
            f"rl.schedule.prompts_per_step: {sc.prompts_per_step} prompts cannot be split over "
            f"{world_size} data-parallel processes (resources.train.processes or torchrun); "
            f"use a multiple of the world size"
        )
    rows = sc.mini_batch_prompts * G
    if rows % world_size:
        raise ConfigError(
            f"rl.schedule.mini_batch_prompts: a mini-batch of {sc.mini_batch_prompts} prompts x {G} "
            f"responses = {rows} rows cannot be split over {world_size} processes"
        )
