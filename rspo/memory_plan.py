"""`python -m rspo plan-memory`: what one GPU (and one node's host memory) holds in each phase of a
preset's runs, term by term with its formula, checked against a GPU's usable memory before any GPU
hour is spent.

    python -m rspo plan-memory --preset configs/paper_large_math.yaml --gpu h100-80gb
    python -m rspo plan-memory --preset configs/paper_small.yaml --gpu-gib 40

It prints, per task of the preset and per phase (rollout, old pass, update, checkpoint save,
evaluation), each resident term in GiB with its formula, then one JSON line:
``{"preset", "gpu", "fits", "peak_gib", "peak_phase", "peak_task", "limit_gib", "host_peak_gib", ...}``.
The workflow runs it before submitting any job of a preset with ``device: cuda`` (rule-free, in
workflow/rules/common.smk) and stops when the plan does not fit, naming the phase, the numbers and
the settings to change (``--config skip_memory_check=true`` overrides; ``gpu=NAME`` picks the GPU).

The model's sizes come from its ``config.json`` (the fetched hub folder, the copy this package ships
for the presets' hub models, rspo/model_configs/, or the preset's ``pretrain.model`` for a model
pretrained here); parameter counts are exact (the model built on PyTorch's meta device, nothing
allocated).

What each phase holds, per GPU of a train job of W ranks (c = bytes of the compute dtype, 4 for the
fp32 master state; rspo.train.precision):
- training state: fp32 parameter shards 4P/W and Adam's two moments 8P/W in every phase, fp32
  gradient shards 4P/W from the first backward to the step (zero on the GPU with model.cpu_offload,
  which puts them in host memory);
- FSDP2 working set in the old pass and the updates: the root's parameters (embeddings, final norm,
  LM head) gathered in the compute dtype from forward to backward, two decoder layers gathered at
  once (the one computing, the one prefetched), and in backward one layer's gradients in the compute
  dtype plus their fp32 copy for the reduction, and the root's (rspo.distributed.shard_model);
- activations of one forward of T tokens (T: schedule.max_tokens_per_micro_batch, else the rows of a
  micro-batch times the longest row): what autograd keeps per token and layer
  (``layer_activation_elems``: attention inputs, q/k/v and their norms and rotations, the attention
  output and its log-sum-exp; the router's logits, probabilities and choices; per selected expert the
  gathered input, gate/up projections, activation, product and output), times L layers without
  gradient checkpointing, or the L layer inputs plus one layer's activations twice (recomputed, and
  their gradients) with it; plus the captured router logits (the raw capture keeps their graph), the
  logits (whole: T x V x 18 bytes, bf16 logits and fp32 copies for the log-softmax, probabilities
  and their gradients; chunked: ``model.logits_chunk_tokens`` x V x 18 bytes) and the micro-batch's
  slice of the old-router cache;
- the vLLM engine: ``vllm_gpu_memory_utilization`` x the GPU's memory while awake (vLLM reserves it:
  weights P x c / N over tensor-parallel size N, its activations, then KV cache), nothing while asleep
  (rollout.vllm_sleep frees weights and KV cache; assumed, not measured here);
- checkpoint save: the training state (DCP streams each shard to its file);
- evaluation (its own job): one engine over the job's GPUs at vLLM's default 0.9 of each GPU.
A plan fits when every phase's total is within the GPU's memory less ``RESERVED_GIB`` (CUDA context,
NCCL buffers, allocator fragmentation: an allowance, not a measurement). The engine must also hold
its weights and at least one longest sequence's KV cache within its share.

Host memory per node: every rank reads the checkpoint in its own dtype before sharding (ranks per
node x P x its bytes, at start), the offloaded state with model.cpu_offload (16 bytes x P x the
node's share of the ranks), and each rank's old-router cache (rows it holds x longest row x L x K x
3 bytes, plus 4E bytes per token and layer under logit replay). Compared with the job's mem_mb.

How well it holds: tests/test_memory_plan.py checks each term against what the trainer allocates
(the old-router cache, the state shards) and the whole update phase against torch's FSDP2 memory
tracker on fake tensors (no allocation) for Qwen3-MoE layers of the paper model's shape;
docs/cluster.md has the comparisons, the published figure it was checked against, and what was not
measured (GPU kernels' workspaces, NCCL buffers, vLLM's own activation peak).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GIB = 2**30
# nvidia-smi's memory.total of each GPU (GiB); usable = total - RESERVED_GIB
GPUS: dict[str, float] = {
    "h100-80gb": 79.65,  # 81,559 MiB (H100 SXM5 80GB)
    "a100-80gb": 80.0,  # 81,920 MiB (A100 SXM4 80GB)
    "h200-141gb": 140.4,  # 143,771 MiB (H200 141GB)
}
RESERVED_GIB = 2.0
# Measured with rspo.memory_sim (torch's FSDP2 memory tracker on fake tensors: Qwen3-30B-A3B layers,
# 8 ranks, bf16 over fp32 masters; docs/cluster.md, "How well the plan holds"):
SAVED_FACTOR = 1.13  # kept bytes per token and layer / (c x layer_activation_elems): 228 KB vs 202 KB counted
CKPT_INPUT = 2.0  # checkpointing keeps 2 x c x H per token and layer (input, rotary tables): 8.5 KB at H 2048
LAYER_BW_FACTOR = 1.4  # a checkpointed layer's backward holds 1.4 x its kept activations (recomputed + grads)
LAYER_FW_FACTOR = 0.7  # a layer's forward without grad holds 0.7 x (its transient intermediates)
GRAD_BUFFER = 4.0  # bytes per layer parameter of its backward: the unsharded grad (c) and the reduction input
LOGIT_BYTES_UPDATE = 13.1  # bytes per token and vocabulary entry at the logits' peak (update)
LOGIT_BYTES_OLD = 15.2  # ... in the no-grad old pass, with the entropy
EVAL_UTILIZATION = 0.9  # vLLM's default gpu_memory_utilization: an evaluation engine has the GPUs to itself
ENGINE_ACTIVATION_GIB = 2.0  # an allowance for vLLM's own forward activations at its batch size (not measured)
CONFIG_DIR = Path(__file__).resolve().parent / "model_configs"


class PlanError(ValueError):
    """The plan cannot be made (unknown GPU, model config not found); the message says why."""


# ------------------------------------------------------------------------------ the model


@dataclass(frozen=True)
class ModelShape:
    name: str
    layers: int
    moe_layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    experts: int
    top_k: int
    moe_inter: int
    shared_inter: int
    vocab: int
    qk_norm: bool
    params: int
    """Every parameter."""
    layer_params: int
    """The largest decoder layer's parameters."""
    root_params: int
    """Parameters outside the decoder layers (embeddings, final norm, LM head)."""
    ckpt_bytes: int
    """Bytes per parameter of the checkpoint's own dtype (what every rank reads at start)."""

    def layer_activation_elems(self) -> int:
        """Elements autograd keeps per token for one MoE decoder layer (see the module docstring)."""
        H, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        attn = 2 * H + 2 * (q + kv) + kv + q + 2 * self.heads  # norm in/out, q/k/v (rotated), output, lse
        if self.qk_norm:
            attn += q + kv  # q_norm / k_norm outputs
        router = 3 * self.experts + 6 * self.top_k  # logits, fp32 probabilities, chosen weights and indices
        experts = self.top_k * (3 * H + 4 * self.moe_inter)  # gathered input, gate/up, act, product, output
        shared = (2 * H + 4 * self.shared_inter) if self.shared_inter else 0
        return attn + 2 * H + router + experts + shared  # + the post-attention norm's input and output

    def kv_bytes_per_token(self, c: int, tp: int) -> int:
        """KV cache per token on one GPU of an engine over ``tp`` GPUs (KV heads split, or replicated
        when there are fewer heads than GPUs)."""
        return 2 * self.layers * max(1, math.ceil(self.kv_heads / tp)) * self.head_dim * c


def _shape_from_config(name: str, config, ckpt_bytes: int) -> ModelShape:
    import warnings

    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Initializing zero-element tensors")  # an empty shared expert
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    layers = model.model.layers
    layer_params = max(sum(p.numel() for p in layer.parameters()) for layer in layers)
    params = sum(p.numel() for p in model.parameters())
    in_layers = sum(p.numel() for layer in layers for p in layer.parameters())
    experts = getattr(config, "num_experts", None) or config.num_local_experts
    sparse = [i for i, layer in enumerate(layers) if getattr(getattr(layer, "mlp", None), "gate", None) is not None]
    return ModelShape(
        name=name,
        layers=len(layers),
        moe_layers=len(sparse),
        hidden=config.hidden_size,
        heads=config.num_attention_heads,
        kv_heads=config.num_key_value_heads,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
        experts=int(experts),
        top_k=int(config.num_experts_per_tok),
        moe_inter=int(getattr(config, "moe_intermediate_size", None) or config.intermediate_size),
        shared_inter=int(getattr(config, "shared_expert_intermediate_size", 0) or 0),
        vocab=config.vocab_size,
        qk_norm=config.model_type in ("qwen3_moe", "olmoe"),
        params=params,
        layer_params=layer_params,
        root_params=params - in_layers,
        ckpt_bytes=ckpt_bytes,
    )


def _dtype_bytes(name: str | None) -> int:
    return {"float32": 4, "bfloat16": 2, "float16": 2}.get(str(name or "float32").replace("torch.", ""), 4)


def model_config(path: str, preset: dict[str, Any], task: str, hub_dir: str = "results/hub"):
    """(name, transformers config, checkpoint bytes per parameter) of the model a task's runs start
    from: a hub id (the fetched folder's config.json, else the copy in rspo/model_configs), a local
    folder, or the preset's pretrain.model for a model pretrained here."""
    from transformers import AutoConfig

    from rspo.hub import is_hub_id, slug

    if path and is_hub_id(path):
        for f in (Path(hub_dir) / slug(path) / "config.json", CONFIG_DIR / f"{slug(path)}.json"):
            if f.is_file():
                data = json.loads(f.read_text())
                return path, AutoConfig.for_model(**data), _dtype_bytes(data.get("torch_dtype") or data.get("dtype"))
        raise PlanError(
            f"no config.json for {path}: fetch the model first (python -m rspo fetch-model --model {path} "
            f"--out {hub_dir}/{slug(path)}) or add its config.json to {CONFIG_DIR}"
        )
    if path and Path(path, "config.json").is_file():
        data = json.loads(Path(path, "config.json").read_text())
        return path, AutoConfig.from_pretrained(path), _dtype_bytes(data.get("torch_dtype") or data.get("dtype"))
    # pretrained here: the preset's pretrain.model (math/code bases: with pretrain.text_model on top)
    from rspo.models import moe_config
    from rspo.tokenizer import build_tokenizer

    arch = dict((preset.get("pretrain") or {}).get("model") or {})
    if task != "countdown":
        arch.update((preset.get("pretrain") or {}).get("text_model") or {})
    tok = build_tokenizer()
    config = moe_config(arch, len(tok), tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)
    return f"pretrained here ({arch.get('arch', 'qwen2_moe')})", config, 4


_SHAPES: dict[str, ModelShape] = {}


def model_shape(path: str, preset: dict[str, Any], task: str, hub_dir: str = "results/hub") -> ModelShape:
    """The shape of the model a task's runs start from (see model_config; cached per config)."""
    name, config, ckpt = model_config(path, preset, task, hub_dir)
    key = json.dumps([name, config.to_dict(), ckpt], sort_keys=True, default=str)
    if key not in _SHAPES:
        _SHAPES[key] = _shape_from_config(name, config, ckpt)
    return _SHAPES[key]


# ------------------------------------------------------------------------------ the plan


@dataclass
class Term:
    name: str
    bytes: float
    formula: str


@dataclass
class Phase:
    name: str
    terms: list[Term] = field(default_factory=list)
    host: list[Term] = field(default_factory=list)

    def add(self, name: str, nbytes: float, formula: str, host: bool = False) -> None:
        (self.host if host else self.terms).append(Term(name, float(nbytes), formula))

    @property
    def total(self) -> float:
        return sum(t.bytes for t in self.terms)

    @property
    def host_total(self) -> float:
        return sum(t.bytes for t in self.host)


@dataclass
class RunPlan:
    task: str
    run: str
    cfg: Any = field(repr=False)
    model: ModelShape
    gpu_gib: float
    phases: list[Phase]
    notes: list[str]
    engine_short: str = ""
    """Why an engine cannot hold its weights and one sequence in its share ('' when it can)."""
    host_limit_gib: float = float("inf")
    """The train job's host memory (resources.train.mem_mb, MiB as SLURM counts them)."""

    @property
    def limit_gib(self) -> float:
        return self.gpu_gib - RESERVED_GIB

    @property
    def peak(self) -> Phase:
        return max(self.phases, key=lambda p: p.total)

    @property
    def host_peak(self) -> float:
        return max(ph.host_total for ph in self.phases)

    @property
    def fits(self) -> bool:
        gpu_ok = self.peak.total <= self.limit_gib * GIB
        return gpu_ok and not self.engine_short and self.host_peak <= self.host_limit_gib * GIB


def plan_run(cfg, preset: dict[str, Any], model: ModelShape, gpu_gib: float, task: str) -> RunPlan:
    """Per-GPU phases of one run config (rspo.config.TrainConfig) on a GPU of ``gpu_gib``."""
    from rspo.plan import Plan

    plan = Plan(preset)
    res_train, res_eval = plan.resources("train"), plan.resources("evaluate")
    W = max(1, int(res_train["processes"]))
    c = _dtype_bytes(cfg.model.dtype)
    P, L, Lm, K, E, V, H = (
        model.params,
        model.layers,
        model.moe_layers,
        model.top_k,
        model.experts,
        model.vocab,
        model.hidden,
    )
    N = cfg.rollout.tensor_parallel_size
    offload = cfg.model.cpu_offload
    sc, ro = cfg.schedule, cfg.rollout
    G = ro.group_size
    row = cfg.data.max_prompt_tokens + ro.max_new_tokens  # the longest row a forward can see
    rows_mb = sc.mini_batch_prompts * G // W  # this rank's rows of a mini-batch
    if sc.max_tokens_per_micro_batch:
        T = max(sc.max_tokens_per_micro_batch, row)  # a row longer than the budget gets a forward of its own
        t_formula = f"max_tokens_per_micro_batch {sc.max_tokens_per_micro_batch} (>= one row of {row})"
    else:
        rows = min(sc.micro_batch_size or rows_mb, rows_mb)
        T = rows * row
        t_formula = f"{rows} rows x {row} tokens (no token budget)"
    notes = [f"T = {T} tokens per forward: {t_formula}"]
    util = ro.vllm_gpu_memory_utilization
    per_node = min(W, max(1, int(res_train.get("gpu") or 1)))  # ranks of this job on one node

    def state(ph: Phase, grads: bool) -> None:
        if offload:
            ph.add(
                "training state (offloaded, node)",
                16 * P / W * per_node,
                f"16 B x {P:.4g} / {W} x {per_node}",
                host=True,
            )
            return
        ph.add("fp32 parameter shards", 4 * P / W, f"4 B x {P:.4g} / {W}")
        ph.add("Adam moments (fp32)", 8 * P / W, f"8 B x {P:.4g} / {W}")
        if grads:
            ph.add("fp32 gradient shards", 4 * P / W, f"4 B x {P:.4g} / {W}")

    def engine(ph: Phase, awake: bool) -> None:
        if ro.backend != "vllm":
            return
        if awake:
            ph.add(
                "vLLM engine (reserved)", util * gpu_gib * GIB, f"vllm_gpu_memory_utilization {util} x {gpu_gib} GiB"
            )
        else:
            ph.add("vLLM engine (asleep)", 0.0, "rollout.vllm_sleep: weights and KV cache freed")

    a = model.layer_activation_elems()
    saved = SAVED_FACTOR * c * a  # bytes one layer keeps per token for its backward (measured factor)
    chunk = cfg.model.logits_chunk_tokens
    logit_tokens = min(chunk, T) if chunk else T
    logit_fmt = f"chunk {chunk}" if chunk else f"{T} tokens"

    def forward_terms(ph: Phase, backward: bool) -> None:
        """What lives through the forward (and into the backward): gathered root, kept activations,
        captured router logits, the micro-batch's cache slice, the final hidden states."""
        if W > 1:
            ph.add(
                "root params gathered", c * model.root_params, f"{c} B x {model.root_params:.4g} (embeddings, LM head)"
            )
        elif c < 4 and backward:  # kept for the backward of the ops that used them; none without grad
            ph.add("autocast weight copies", c * P, f"{c} B x {P:.4g} (one process: bf16 casts of the fp32 weights)")
        if backward and cfg.model.gradient_checkpointing:
            ph.add(
                "checkpointed layer inputs",
                CKPT_INPUT * c * H * L * T,
                f"{CKPT_INPUT} x {c} B x H {H} x {L} layers x {T}",
            )
        elif backward:
            ph.add("kept activations", saved * L * T, f"{SAVED_FACTOR} x {c} B x {a} elems/token x {L} layers x {T}")
        ph.add("captured router logits", (c if backward else 4) * E * Lm * T, f"E {E} x {Lm} MoE layers x {T} tokens")
        ph.add("router cache slice", 3 * Lm * K * T, f"3 B x {Lm} x K {K} x {T}")
        if chunk:
            ph.add("final hidden states", c * H * T, f"{c} B x H {H} x {T}")

    def peak_terms(ph: Phase, backward: bool) -> None:
        """Two moments that never coincide; the larger counts: the logits' computation (at the end of
        the forward, before any gradient exists) and a decoder layer's (re)computation and backward."""
        logit_bytes = LOGIT_BYTES_UPDATE if backward else LOGIT_BYTES_OLD
        logits = logit_bytes * V * logit_tokens
        layer = (2 * c * model.layer_params if W > 1 else 0) + (
            GRAD_BUFFER * model.layer_params if backward and W > 1 else 0
        )
        if backward:
            per_token = (LAYER_BW_FACTOR if cfg.model.gradient_checkpointing else LAYER_BW_FACTOR - 1.0) * saved
        else:
            per_token = LAYER_FW_FACTOR * saved
        layer += per_token * T
        grads = 0.0 if offload or not backward else 4 * P / W  # gradient shards exist in the layer branch only
        if logits >= layer + grads:
            ph.add("logits (peak)", logits, f"{logit_bytes} B x V {V} x {logit_fmt}")
        else:
            if backward and not offload:
                ph.add("fp32 gradient shards", 4 * P / W, f"4 B x {P:.4g} / {W}")
            ph.add(
                "a layer's computation (peak)",
                layer,
                f"{'2 gathered layers + grad buffers + ' if W > 1 else ''}{per_token / 1024:.0f} KiB/token x {T}",
            )

    def optimizer_step(ph: Phase) -> None:
        """One process: the step holds weights, gradients and both moments (16 B per parameter)."""
        if W == 1 and not offload:
            ph.add("gradients at the step (one process)", 4 * P, f"4 B x {P:.4g}")

    # host: every rank reads the checkpoint in its dtype at start; each rank's old-router cache
    rows_held = (sc.prompts_per_step * G // W) if (W > 1 and sc.ppo_epochs == 1) else sc.prompts_per_step * G
    cache_per_token = 3 * Lm * K + (4 * E * Lm if cfg.algorithm.routing == "logit_replay" else 0)
    host_load = per_node * model.ckpt_bytes * P
    host_cache = per_node * rows_held * row * cache_per_token

    rollout = Phase("rollout")
    state(rollout, grads=False)
    engine(rollout, awake=True)
    if ro.backend == "hf":
        kv = model.kv_bytes_per_token(c, 1) * (sc.prompts_per_step * G // W) * row
        rollout.add("generation KV cache", kv, f"{model.kv_bytes_per_token(c, 1)} B/token x rows x {row}")
    old = Phase("old pass")
    state(old, grads=False)
    engine(old, awake=not ro.vllm_sleep)
    forward_terms(old, backward=False)
    peak_terms(old, backward=False)
    update = Phase("update")
    state(update, grads=False)
    engine(update, awake=not ro.vllm_sleep)
    forward_terms(update, backward=True)
    peak_terms(update, backward=True)
    step = Phase("optimizer step")
    state(step, grads=False)
    engine(step, awake=not ro.vllm_sleep)
    optimizer_step(step)
    save = Phase("checkpoint save")
    state(save, grads=False)
    engine(save, awake=True)
    for ph in (rollout, old, update, save):
        ph.add(
            "checkpoints read at start (node)",
            host_load,
            f"{per_node} ranks x {P:.4g} x {model.ckpt_bytes} B",
            host=True,
        )
        ph.add(
            "old-router caches (node)",
            host_cache,
            f"{per_node} ranks x {rows_held} rows x {row} x {cache_per_token} B",
            host=True,
        )
    # evaluation job: one engine over the job's GPUs
    phases = [rollout, old, update, step, save]
    short = []

    def engine_fits(label: str, tp: int, share: float, seq: int) -> None:
        """An engine holds its weights, one longest sequence's KV cache and its activations in its share."""
        weights = c * P / tp
        kv = model.kv_bytes_per_token(c, tp) * seq
        need = weights + kv + ENGINE_ACTIVATION_GIB * GIB
        notes.append(
            f"{label} engine: weights {weights / GIB:.2f} GiB (P x {c} B / tensor parallel {tp}) + one {seq}-token "
            f"sequence's KV {kv / GIB:.2f} GiB + {ENGINE_ACTIVATION_GIB} GiB activations = {need / GIB:.2f} GiB of its "
            f"{share / GIB:.2f} GiB"
        )
        if need > share:
            short.append(
                f"the {label} engine needs {need / GIB:.1f} GiB per GPU (weights {weights / GIB:.1f} at tensor "
                f"parallel {tp}) but has {share / GIB:.1f} GiB"
            )

    if ro.backend == "vllm":
        engine_fits("rollout", N, util * gpu_gib * GIB, row)
        n_eval = max(1, int(res_eval.get("gpu") or 1))  # an evaluation job's engine spans its GPUs
        evaluation = Phase("evaluation")
        evaluation.add(
            "vLLM engine (reserved)",
            EVAL_UTILIZATION * gpu_gib * GIB,
            f"{EVAL_UTILIZATION} x {gpu_gib} GiB ({n_eval} GPUs)",
        )
        phases.append(evaluation)
        eval_new = max((int(e.get("max_new_tokens", 0)) for e in (preset.get("eval") or {}).values()), default=0)
        engine_fits(
            "evaluation", n_eval, EVAL_UTILIZATION * gpu_gib * GIB, cfg.data.max_prompt_tokens + max(eval_new, 1)
        )
    host_limit = float(res_train["mem_mb"]) / 1024  # MiB -> GiB
    return RunPlan(task, cfg.run_name, cfg, model, gpu_gib, phases, notes, "; ".join(short), host_limit)


# ------------------------------------------------------------------------------ a preset


def plan_preset(preset_path: str, gpu_gib: float, hub_dir: str = "results/hub") -> list[RunPlan]:
    """One RunPlan per task and distinct memory-relevant run config of the preset's grid."""
    from rspo.config import load_preset
    from rspo.plan import Plan, load_train_config

    preset = load_preset(preset_path)
    plan = Plan(preset)
    out: list[RunPlan] = []
    shapes: dict[str, ModelShape] = {}
    seen = set()
    for name, run in plan.runs.items():
        cfg = load_train_config(preset_path, name)
        key = (run.task, cfg.algorithm.routing, cfg.model.path)
        if key in seen:
            continue
        seen.add(key)
        if cfg.model.path not in shapes:
            path = plan.hub_model(run.task) or cfg.model.path
            shapes[cfg.model.path] = model_shape(path, preset, run.task, hub_dir)
        out.append(plan_run(cfg, preset, shapes[cfg.model.path], gpu_gib, run.task))
    return out


def summary(preset_name: str, gpu: str, plans: list[RunPlan]) -> dict[str, Any]:
    worst = max(plans, key=lambda p: p.peak.total)
    host = max(ph.host_total for p in plans for ph in p.phases)
    short = [p.engine_short for p in plans if p.engine_short]
    host_short = [p for p in plans if p.host_peak > p.host_limit_gib * GIB]
    return {
        "preset": preset_name,
        "gpu": gpu,
        "fits": all(p.fits for p in plans),
        "peak_gib": round(worst.peak.total / GIB, 2),
        "peak_phase": worst.peak.name,
        "peak_task": worst.task,
        "limit_gib": round(worst.limit_gib, 2),
        "host_peak_gib": round(host / GIB, 1),
        "host_limit_gib": round(min(p.host_limit_gib for p in plans), 1),
        "engine": short[0] if short else "ok",
        "host": "ok" if not host_short else f"needs {host_short[0].host_peak / GIB:.0f} GiB of host memory per node",
    }


def render(plans: list[RunPlan]) -> str:
    lines = []
    for p in plans:
        m = p.model
        lines.append(
            f"== task {p.task} (run {p.run}), model {m.name}: {m.params / 1e9:.3f}B params, {m.layers} layers "
            f"({m.moe_layers} MoE, {m.experts} experts, top-{m.top_k}), vocab {m.vocab}"
        )
        for note in p.notes:
            lines.append(f"   {note}")
        for ph in p.phases:
            lines.append(f"  -- {ph.name}: {ph.total / GIB:.2f} GiB of {p.limit_gib:.2f} usable per GPU")
            for t in ph.terms:
                lines.append(f"     {t.bytes / GIB:8.2f} GiB  {t.name:34s} {t.formula}")
            if ph.host:
                lines.append(f"     host per node: {ph.host_total / GIB:.1f} GiB")
                for t in ph.host:
                    lines.append(f"     {t.bytes / GIB:8.2f} GiB  {t.name:34s} {t.formula}")
    return "\n".join(lines)


def advice(s: dict[str, Any]) -> str:
    """What to change when a plan does not fit (the workflow's message)."""
    if s.get("host", "ok") != "ok" and s["peak_gib"] <= s["limit_gib"] and s.get("engine", "ok") == "ok":
        return f"the train job {s['host']}, resources.train.mem_mb gives {s['host_limit_gib']} GiB: raise it"
    if s.get("engine", "ok") != "ok" and s["peak_gib"] <= s["limit_gib"]:
        return f"{s['engine']} on {s['gpu']}: raise rollout.tensor_parallel_size or rollout.vllm_gpu_memory_utilization"
    return (
        f"the {s['peak_phase']} phase of task {s['peak_task']} needs {s['peak_gib']} GiB per GPU, {s['limit_gib']} GiB "
        f"are usable on {s['gpu']}: lower schedule.max_tokens_per_micro_batch, set model.logits_chunk_tokens and "
        "model.gradient_checkpointing, raise rollout.tensor_parallel_size, set rollout.vllm_sleep, lower "
        "rollout.vllm_gpu_memory_utilization or set model.cpu_offload"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="rspo plan-memory", description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", required=True, help="configs/<preset>.yaml")
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--gpu", default="h100-80gb", help=f"one of {', '.join(GPUS)} (default h100-80gb)")
    group.add_argument("--gpu-gib", type=float, default=None, help="any other GPU: its memory in GiB")
    ap.add_argument("--hub-dir", default="results/hub", help="where fetched hub models are (their config.json)")
    ap.add_argument("--json-only", action="store_true", help="print the JSON line alone")
    ap.add_argument(
        "--simulate",
        action="store_true",
        help="also measure the old pass and the update on fake tensors (rspo.memory_sim; torchrun presets)",
    )
    args = ap.parse_args(argv)
    if args.gpu_gib is not None:
        gpu, gib = f"{args.gpu_gib:g}gib", args.gpu_gib
    elif args.gpu in GPUS:
        gpu, gib = args.gpu, GPUS[args.gpu]
    else:
        print(
            f"rspo plan-memory: unknown GPU {args.gpu!r}; choose one of {', '.join(GPUS)} or give --gpu-gib",
            file=sys.stderr,
        )
        return 2
    from rspo.config import ConfigError, load_preset

    try:
        plans = plan_preset(args.preset, gib, args.hub_dir)
    except (PlanError, ConfigError, FileNotFoundError) as e:
        print(f"rspo plan-memory: {e}", file=sys.stderr)
        return 2
    s = summary(str(load_preset(args.preset).get("preset", Path(args.preset).stem)), gpu, plans)
    if not args.json_only:
        print(render(plans))
    if args.simulate:
        s["simulated"] = simulated(args.preset, plans, args.hub_dir)
    print(json.dumps(s))
    return 0


def simulated(preset_path: str, plans: list[RunPlan], hub_dir: str) -> dict[str, dict[str, float]]:
    """The old pass and the update of each task's first plan, measured on fake tensors
    (rspo.memory_sim) beside the plan's totals without the engine."""
    from rspo.config import load_preset
    from rspo.memory_sim import simulate
    from rspo.plan import Plan

    preset = load_preset(preset_path)
    W = max(1, int(Plan(preset).resources("train")["processes"]))
    out: dict[str, dict[str, float]] = {}
    for p in {p.task: p for p in reversed(plans)}.values():
        if W == 1:
            print(f"simulate: task {p.task} runs in one process, on real tensors: scripts/memory_plan_check.py")
            continue
        _, config, _ = model_config(Plan(preset).hub_model(p.task) or p.cfg.model.path, preset, p.task, hub_dir)
        row = p.cfg.data.max_prompt_tokens + p.cfg.rollout.max_new_tokens
        T = int(p.notes[0].split()[2])
        for ph in p.phases:
            if ph.name not in ("old pass", "update"):
                continue
            planned = sum(t.bytes for t in ph.terms if not t.name.startswith("vLLM")) / GIB
            sim = simulate(p.cfg, config, W, T, row, "update" if ph.name == "update" else "old")
            out[f"{p.task}/{ph.name}"] = {"plan_gib": round(planned, 2), "simulated_gib": round(sim, 2)}
            print(f"simulate: task {p.task}, {ph.name}: plan {planned:.2f} GiB, simulated {sim:.2f} GiB (no engine)")
    return out
