"""Run configuration: one frozen dataclass per section, built from a YAML preset plus overrides.

A preset (``configs/<name>.yaml``) is the single source of truth for a study. Its ``rl:``
mapping holds the sections of one RL run (model, data, rollout, algorithm, optim, schedule,
tracking); ``train_config_from_dict`` turns it into a validated ``TrainConfig``. Which runs a
study needs (the ``grid:`` mapping, named runs, ``load_train_config`` for one of them) is the
planner's question: rspo/plan.py.

Errors name the key: ``ConfigError: rl.algorithm.gamma_min: must lie in (0, 1], got 1.5``.
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

from rspo.method import (  # noqa: F401 (ALGOS, ConfigError, check_gamma_min: re-exported for the planner and commands)
    ALGOS,
    DEFAULT_GAMMA_MIN,
    ROLLOUT_CORRECTIONS,
    ROUTING_MODES,
    ConfigError,
    check_gamma_min,
)

TASKS = ("countdown", "math", "code")
BACKENDS = ("hf", "vllm")


def _err(key: str, msg: str) -> ConfigError:
    return ConfigError(f"{key}: {msg}")


# ----------------------------------------------------------------------------- sections


@dataclass(frozen=True)
class ModelConfig:
    path: str = ""
    """Base checkpoint: a local Hugging Face folder (pretrained by `rspo pretrain`) or a hub id."""
    dtype: str = "float32"
    """Training dtype: float32 (CPU) or bfloat16 (GPU)."""
    device: str = "auto"
    """auto (cuda if available, else cpu), cpu or cuda."""
    threads: int = 0
    """torch intra-op threads; 0 = the cores the job was given (Snakemake `threads`, OMP_NUM_THREADS)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (large models)."""
    cpu_offload: bool = False
    """torchrun on GPUs only: FSDP2's CPUOffloadPolicy: parameter shards, gradients and Adam's
    moments live on the host and the optimizer steps on the CPU (the GPU holds one gathered layer
    at a time). Trades a host<->GPU copy of the shards per step for 16 bytes per parameter / ranks
    of GPU memory (rspo.gpu_memory.plan)."""
    logits_chunk_tokens: int = 0
    """> 0: the old pass and the updates compute log-probs and entropy from the final hidden states
    this many positions at a time, recomputing each chunk's logits in backward, so no forward ever
    holds the (tokens x vocabulary) logits in fp32 (rspo.train.memory). 0: transformers' logits."""
    collective_timeout_min: int = 30
    """torchrun jobs: minutes a collective may wait for the other ranks before the job fails (the
    process group's timeout). A save, a long rollout on one rank and a slow filesystem all count;
    the paper presets allow 60."""

    def validate(self, prefix: str) -> None:
        if self.logits_chunk_tokens < 0:
            raise _err(f"{prefix}.logits_chunk_tokens", f"must be >= 0, got {self.logits_chunk_tokens}")
        if self.collective_timeout_min < 1:
            raise _err(f"{prefix}.collective_timeout_min", f"must be >= 1, got {self.collective_timeout_min}")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise _err(f"{prefix}.dtype", f"must be float32, bfloat16 or float16, got {self.dtype!r}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise _err(f"{prefix}.device", f"must be auto, cpu or cuda, got {self.device!r}")
        if self.threads < 0:
            raise _err(f"{prefix}.threads", f"must be >= 0, got {self.threads}")


@dataclass(frozen=True)
class DataConfig:
    task: str = "countdown"
    """countdown | math | code: selects the verifier (one per task, shared with evaluation)."""
    train_path: str = ""
    """Training prompts (JSONL): Countdown records, or normalised math/code records."""
    val_paths: dict[str, str] = field(default_factory=dict)
    """Held-out sets scored during training, name -> JSONL path (logged as val/<name>/score)."""
    prompt_format: str = "steps"
    """Countdown text format: steps | optimal_path | search_path (see rspo.data.countdown)."""
    template: str = "auto"
    """Math/code prompts (rspo.chat): chat (the model's own chat template), a hand-written template
    (math: qwen_math | no | plain; code: chatml | plain), or auto (chat when the tokenizer has a
    chat template, else qwen_math / chatml). Countdown prompts use ``prompt_format``."""
    enable_thinking: bool | None = None
    """The chat template's thinking switch (Qwen3's hybrid models): true or false when the
    template has one (required then), left out otherwise; rewards then grade the text after the
    thinking block (rspo.chat)."""
    max_prompt_tokens: int = 512
    """Prompts longer than this are dropped when the data is loaded."""
    reward_workers: int = 1
    """Worker processes for the verifier (math-verify needs processes: it uses signal.alarm; code
    runs in sandboxes with time limits). A budget per node: the ranks of a torchrun job on one node
    share it (each gets reward_workers // ranks, at least 1), so the node's CPUs are not
    oversubscribed and correct programs do not hit their time limits."""

    def validate(self, prefix: str) -> None:
        if self.task not in TASKS:
            raise _err(f"{prefix}.task", f"unknown task {self.task!r}; choose one of {list(TASKS)}")
        if self.prompt_format not in ("steps", "optimal_path", "search_path"):
            raise _err(f"{prefix}.prompt_format", f"unknown format {self.prompt_format!r}")
        from rspo.chat import HAND_TEMPLATES

        templates = ("auto", "chat") + tuple(dict.fromkeys(t for ts in HAND_TEMPLATES.values() for t in ts))
        if self.template not in templates:
            raise _err(f"{prefix}.template", f"unknown template {self.template!r}; choose one of {list(templates)}")
        if self.task in HAND_TEMPLATES and self.template not in ("auto", "chat") + HAND_TEMPLATES[self.task]:
            raise _err(
                f"{prefix}.template",
                f"{self.template!r} is not a {self.task} template; choose one of "
                f"{['auto', 'chat', *HAND_TEMPLATES[self.task]]}",
            )
        if self.enable_thinking is not None and not isinstance(self.enable_thinking, bool):
            raise _err(f"{prefix}.enable_thinking", f"must be true, false or left out, got {self.enable_thinking!r}")
        if self.max_prompt_tokens < 1:
            raise _err(f"{prefix}.max_prompt_tokens", "must be >= 1")
        if self.reward_workers < 1:
            raise _err(f"{prefix}.reward_workers", "must be >= 1")


@dataclass(frozen=True)
class RolloutConfig:
    backend: str = "hf"
    """hf (our KV-cache sampling loop on the training model, CPU/GPU) or vllm (a colocated vLLM
    engine: the GPU extra, or vLLM's CPU build; rspo.rollout.vllm)."""
    group_size: int = 8
    """G responses per prompt (paper Appendix A: G = 8)."""
    temperature: float = 1.0
    """Sampling temperature; the old pass and the updates score log-probs of the same
    temperature-scaled distribution (logits / temperature), so importance ratios compare the
    distribution that was sampled."""
    top_p: float = 1.0
    """Must be 1 for training: a truncated (top-p) sampler would need its truncation applied to
    every scored log-prob too; validation and evaluation decode separately."""
    max_new_tokens: int = 64
    """Response length cap (paper: 8K tokens; CPU presets use far less)."""
    val_temperature: float = 0.0
    """Decoding temperature of the periodic validation (0 = greedy)."""
    vllm_gpu_memory_utilization: float = 0.5
    """vLLM only: fraction of GPU memory the colocated engine may take."""
    tensor_parallel_size: int = 1
    """vLLM under torchrun: ranks that share one engine, each holding 1/N of every layer (a multiple
    of it must run on each node; rspo.rollout.colocate). 1: an engine per rank."""
    vllm_sleep: bool = False
    """vLLM on GPUs: free the engine's weights and KV cache while the old pass and the updates run
    (sleep mode, level 2); the sync wakes the weights, then the KV cache (rspo.rollout.colocate). Its
    CUDA graphs move to host memory while it sleeps. A no-op on vLLM's CPU build."""
    vllm_enforce_eager: bool = False
    """vLLM on GPUs: decode without CUDA graphs (slower; no graph pool in GPU memory). CPU engines
    always run eagerly."""
    dtype: str = ""
    """The rollout engine's precision: "" (model.dtype: the trainer's compute dtype), float32,
    bfloat16, float16 or fp8. The vLLM engine runs in it; the hf backend decodes under autocast to it.
    fp8 (hf backend, one process): an FP8 W8A8 engine, the decoder's weights and the inputs of their
    products rounded to E4M3 while it decodes, bf16 arithmetic (rspo.rollout.fp8). Another precision
    than the trainer's makes the train-inference mismatch (docs/mismatch.md)."""

    def validate(self, prefix: str) -> None:
        if self.backend not in BACKENDS:
            raise _err(f"{prefix}.backend", f"unknown backend {self.backend!r}; choose one of {list(BACKENDS)}")
        if self.group_size < 2:
            raise _err(f"{prefix}.group_size", f"must be >= 2 (group-normalised advantages), got {self.group_size}")
        if self.temperature <= 0:
            raise _err(f"{prefix}.temperature", f"must be > 0 for sampling, got {self.temperature}")
        if self.top_p != 1.0:
            raise _err(
                f"{prefix}.top_p",
                f"must be 1.0 for RL training, got {self.top_p}: the old pass and the "
                "updates score the full temperature-scaled distribution, so a top-p sampler would make "
                "every importance ratio compare another distribution than the one sampled",
            )
        if self.max_new_tokens < 1:
            raise _err(f"{prefix}.max_new_tokens", "must be >= 1")
        if self.tensor_parallel_size < 1:
            raise _err(f"{prefix}.tensor_parallel_size", f"must be >= 1, got {self.tensor_parallel_size}")
        if self.backend != "vllm" and (self.tensor_parallel_size > 1 or self.vllm_sleep):
            raise _err(prefix, "tensor_parallel_size > 1 and vllm_sleep need backend: vllm")
        if self.backend != "vllm" and self.vllm_enforce_eager:
            raise _err(f"{prefix}.vllm_enforce_eager", "needs backend: vllm")
        if self.val_temperature < 0:
            raise _err(f"{prefix}.val_temperature", "must be >= 0")
        if self.dtype not in ("", "float32", "bfloat16", "float16", "fp8"):
            raise _err(
                f"{prefix}.dtype",
                f"must be empty (model.dtype), float32, bfloat16, float16 or fp8, got {self.dtype!r}",
            )
        if self.dtype == "fp8" and self.backend != "hf":
            raise _err(
                f"{prefix}.dtype",
                "fp8 rounds the hf backend's decoding weights (rspo.rollout.fp8); a vLLM engine in FP8 is "
                "vLLM's own quantization, not wired here",
            )


@dataclass(frozen=True)
class AlgorithmConfig:
    algo: str = "gmpo"
    """Base objective: grpo | gspo | gmpo (rspo.losses)."""
    router_shift: bool = False
    """Router-shift weighting (RS). RSPO = gmpo + router_shift."""
    gamma_min: float = DEFAULT_GAMMA_MIN
    """Floor on gamma (paper: 0.8 in all experiments); also the threshold of router/shift_clipfrac."""
    stop_gradient: bool = True
    """Detach gamma (paper); False is the collapse ablation (Appendix B)."""
    routing: str = "none"
    """Routing control: none | freeze | logit_replay | index_replay (Appendix D, during updates) |
    rollout_replay (R3, beyond the paper: the rollout engine's experts forced in the old pass and the
    updates; docs/mismatch.md)."""
    rollout_correction: str = "none"
    """Train-inference mismatch correction (beyond the paper; docs/mismatch.md): none | token_truncate
    (TIS) | token_mask (icepop) | sequence_truncate | sequence_mask (MIS), on the ratio old-pass
    probability / engine probability (rspo.losses.rollout_correction)."""
    rollout_correction_low: float = 0.5
    """Lower bound of the correction's ratio for the mask modes (icepop: 0.5)."""
    rollout_correction_high: float = 2.0
    """Upper bound: the truncation of the truncate modes, the mask's top for the mask modes (verl
    and ms-swift use 2; TRL 1.16 3)."""
    clip_low: float | None = None
    """None -> the paper's default for algo (rspo.losses.DEFAULT_CLIP)."""
    clip_high: float | None = None
    entropy_coef: float = 0.0
    """Entropy bonus coefficient (0 in the paper)."""
    router_aux_loss_coef: float = 0.0
    """Load-balancing aux loss during RL (0 by default, as verl/NeMo do for GRPO on MoE)."""

    def validate(self, prefix: str) -> None:
        if self.algo not in ALGOS:
            raise _err(f"{prefix}.algo", f"unknown algorithm {self.algo!r}; choose one of {list(ALGOS)}")
        check_gamma_min(self.gamma_min, f"{prefix}.gamma_min")
        if self.routing not in ROUTING_MODES:
            raise _err(
                f"{prefix}.routing", f"unknown routing mode {self.routing!r}; choose one of {list(ROUTING_MODES)}"
            )
        for name in ("clip_low", "clip_high"):
            v = getattr(self, name)
            if v is not None and v < 0:
                raise _err(f"{prefix}.{name}", f"must be >= 0, got {v}")
        if self.rollout_correction not in ROLLOUT_CORRECTIONS:
            raise _err(
                f"{prefix}.rollout_correction",
                f"unknown correction {self.rollout_correction!r}; choose one of {list(ROLLOUT_CORRECTIONS)}",
            )
        if not 0 <= self.rollout_correction_low < 1 < self.rollout_correction_high:
            raise _err(
                f"{prefix}.rollout_correction_low",
                f"the bounds must satisfy 0 <= low < 1 < high, got ({self.rollout_correction_low}, "
                f"{self.rollout_correction_high})",
            )
        if self.entropy_coef < 0 or self.router_aux_loss_coef < 0:
            raise _err(prefix, "entropy_coef and router_aux_loss_coef must be >= 0")


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-6
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    grad_clip: float = 1.0
    """Global grad-norm clip (verl default 1.0)."""
    warmup_steps: int = 0
    """Linear warmup in optimiser updates, then constant (verl's default schedule)."""
    max_nonfinite_in_row: int = 3
    """Stop the run after this many consecutive updates skipped for NaN/inf loss or gradients."""
    router_lr_mult: float = 1.0
    """Learning rate of the router weights (``mlp.gate.weight``) as a multiple of ``lr``. Not in
    the paper (1 = one lr for all weights). Above 1 it is the stress regime's controlled variable:
    router drift made large on purpose, to test whether RS delays or prevents collapse."""

    def validate(self, prefix: str) -> None:
        if self.lr <= 0:
            raise _err(f"{prefix}.lr", f"must be > 0, got {self.lr}")
        if self.router_lr_mult <= 0:
            raise _err(f"{prefix}.router_lr_mult", f"must be > 0, got {self.router_lr_mult}")
        if self.grad_clip <= 0:
            raise _err(f"{prefix}.grad_clip", f"must be > 0, got {self.grad_clip}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise _err(f"{prefix}.betas", f"must be two numbers in [0, 1), got {self.betas}")
        if self.warmup_steps < 0 or self.max_nonfinite_in_row < 1:
            raise _err(prefix, "warmup_steps must be >= 0 and max_nonfinite_in_row >= 1")


@dataclass(frozen=True)
class ScheduleConfig:
    total_steps: int = 100
    """Rollout steps."""
    prompts_per_step: int = 256
    """Global batch in prompts (paper small setting: 256)."""
    mini_batch_prompts: int = 64
    """Prompts per optimiser update (paper: 64 -> 4 updates per step, updates 2..4 off-policy)."""
    micro_batch_size: int = 0
    """Responses per forward/backward for gradient accumulation; 0 = the whole mini-batch."""
    max_tokens_per_micro_batch: int = 0
    """> 0: the rows of a forward (old pass and updates) are packed, longest first, so that rows x
    the widest row's tokens stay within this budget (rspo.train.memory); gradients accumulate to the
    whole mini-batch's. 0: no token bound (micro_batch_size rows)."""
    ppo_epochs: int = 1
    """Passes over the step's mini-batches."""
    val_every: int = 10
    """Validate every N steps (and at step 0 and the last step); 0 disables."""
    val_size: int = 0
    """Held-out prompts per validation set; 0 = all."""
    ckpt_every: int = 10
    """Checkpoint every N steps (and at the end)."""
    keep_checkpoints: int = 1
    """How many step checkpoints to keep."""

    def validate(self, prefix: str) -> None:
        for name in ("total_steps", "prompts_per_step", "mini_batch_prompts", "ppo_epochs"):
            if getattr(self, name) < 1:
                raise _err(f"{prefix}.{name}", f"must be >= 1, got {getattr(self, name)}")
        if self.prompts_per_step % self.mini_batch_prompts != 0:
            raise _err(
                f"{prefix}.mini_batch_prompts",
                f"{self.mini_batch_prompts} does not divide prompts_per_step={self.prompts_per_step}",
            )
        for name in ("micro_batch_size", "max_tokens_per_micro_batch", "val_every", "val_size", "ckpt_every"):
            if getattr(self, name) < 0:
                raise _err(f"{prefix}.{name}", "must be >= 0")
        if self.keep_checkpoints < 1:
            raise _err(f"{prefix}.keep_checkpoints", "must be >= 1")


@dataclass(frozen=True)
class TrackingConfig:
    experiment: str = "rspo"
    """MLflow experiment (one per preset)."""
    tracking_uri: str = ""
    """MLflow store; empty -> $MLFLOW_TRACKING_URI, else sqlite under the preset's results folder."""
    router_diagnostics: bool = True
    """Log router/shift_* for every run (RS or not). False skips the router cache when nothing
    else needs it (used by `rspo bench` to measure a plain GMPO baseline)."""
    collapse_window: int = 5
    """Collapse detector: steps over which the reward drop must be sustained."""
    collapse_drop: float = 0.5
    """... relative drop of the windowed training reward below its running best."""
    collapse_kl_spike: float = 5.0
    """... together with |ppo_kl| or grad_norm above this multiple of its running median."""

    def validate(self, prefix: str) -> None:
        if self.collapse_window < 1:
            raise _err(f"{prefix}.collapse_window", "must be >= 1")
        if not 0 < self.collapse_drop <= 1:
            raise _err(f"{prefix}.collapse_drop", f"must lie in (0, 1], got {self.collapse_drop}")
        if self.collapse_kl_spike <= 1:
            raise _err(f"{prefix}.collapse_kl_spike", "must be > 1")


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
        for name in SECTIONS:
            getattr(self, name).validate(f"rl.{name}")

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


def _check_type(key: str, value: Any, tp: Any) -> Any:
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
                return _check_type(key, value, arg)
            except ConfigError:
                continue
        raise _err(key, f"expected {tp}, got {type(value).__name__} {value!r}")
    if origin is dict:
        if not isinstance(value, dict):
            raise _err(key, f"expected a mapping, got {type(value).__name__}")
        kt, vt = typing.get_args(tp)
        return {_check_type(f"{key}.{k}", k, kt): _check_type(f"{key}.{k}", v, vt) for k, v in value.items()}
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise _err(key, f"expected a list, got {type(value).__name__}")
        args = typing.get_args(tp)
        if len(args) != len(value):
            raise _err(key, f"expected {len(args)} items, got {len(value)}")
        return tuple(_check_type(f"{key}[{i}]", v, a) for i, (v, a) in enumerate(zip(value, args)))
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
    kwargs = {k: _check_type(f"{prefix}.{k}", v, hints[k]) for k, v in data.items()}
    return cls(**kwargs)


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
