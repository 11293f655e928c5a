"""What one GPU (and one node's host memory) holds in each phase of a preset's training step, in the
order the trainer runs them, term by term with its formula and its source, checked against the
GPU's memory before any GPU hour is spent (``python -m rspo plan-memory``).

The phases are the trainer's own (rspo.phase_memory): resume, engine start, rollout, old
pass, update, optimizer step, sync, KV wake, checkpoint save, and the evaluation job.
Per GPU of a train job of W ranks (c = bytes of the compute dtype; P parameters; N the engine's
tensor-parallel size; rspo.train.precision):

- training state: fp32 parameter shards 4P/W and Adam's two moments 8P/W in every phase (in host
  memory with model.cpu_offload); fp32 gradient shards 4P/W from the first backward of a mini-batch
  through its optimizer step, and in the resume (DCP's load initialises the optimizer state by one
  zero-gradient step, ``_init_optim_state``). The trainer releases them after the step's last
  optimizer step, so the sync, the KV wake and the save hold none;
- FSDP2 working set in the old pass and the updates: the root's parameters (embeddings, final norm,
  LM head) gathered in the compute dtype from forward to backward, two decoder layers gathered at
  once (the one computing, the one prefetched), and in backward one layer's gradients in the compute
  dtype plus their fp32 copy for the reduction (rspo.distributed.shard_model);
- activations of one forward of T tokens (T: schedule.max_tokens_per_micro_batch, else the rows of a
  micro-batch times the longest row): what autograd keeps per token and layer
  (``ModelShape.layer_activation_elems``), times L layers without gradient checkpointing, or the L
  layer inputs plus one layer's activations twice (recomputed, and their gradients) with it; plus
  the captured router logits, the logits (whole: T x V x 13-15 bytes; chunked:
  ``model.logits_chunk_tokens`` x V) and the micro-batch's slice of the old-router cache;
- the vLLM engine: ``vllm_gpu_memory_utilization`` x the GPU while fully awake (vLLM reserves it:
  weights c x P / N, its activations, then KV cache); with rollout.vllm_sleep nothing from the
  release to the sync, its weights alone in the sync (woken with ``tags=["weights"]``; one gathered
  layer of the training model streams into them), all of it again from the KV wake on. The same
  gathered layer streams at the engine's start (it is built on dummy weights and loaded from the
  training model while it holds its whole share) and in the final checkpoint's save after the last
  step (planned in checkpoint_save, the larger of the two saves);
- outside torch's tensors, every phase: the CUDA context, each NCCL communicator the job creates
  (counted from the code: ``nccl_communicators``), vLLM's all-reduce buffers (tensor parallel > 1),
  its CUDA graph pool (inside the engine's share while the engine is awake: vLLM 0.32 profiles it
  before it sizes the KV cache; ``sleep_mode_offload_cudagraph`` moves it to host memory while the
  engine sleeps, and the weights' wake at the sync maps it back, beside the weights alone;
  rollout.vllm_enforce_eager removes it), and an allowance for the allocator's fragmentation. These
  are allowances taken from published measurements, not measured here: each says where it comes from.

A plan fits when every phase's total is within the GPU's memory (CUDA's total, ``GPUS``) and the engine
holds its weights and one longest sequence's KV cache within its share. Host memory per node: every
rank reads the checkpoint in its own dtype at start (before the resume), the offloaded state with
model.cpu_offload, and each rank's old-router cache (pinned once, rspo.train.row_cache.HostBuffers).

How well it holds: the same step run by the trainer's own code on fake tensors
(rspo.gpu_memory.simulate, ``plan-memory --simulate``) agrees with each phase's tensor terms within
5% (tests/test_gpu_memory_simulate.py); the constants below marked "measured" were fitted on that
simulation; docs/cluster.md has the tables.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from rspo.backend_capabilities import capabilities
from rspo.config import load_preset
from rspo.gpu_memory.shape import ModelShape, PlanError, dtype_bytes, model_shape
from rspo.phase_memory import PHASES
from rspo.preset import Preset

__all__ = ["GPUS", "PlanError", "RunPlan", "Setup", "kv_cache_tokens", "plan_preset", "plan_run", "planned_phases"]

GIB = 2**30
# Each GPU's memory as CUDA reports it (torch.cuda.mem_get_info's total): what vLLM's share
# (gpu_memory_utilization x total) and torch's allocator see; nvidia-smi's memory.total is larger
# (81,559 MiB = 79.65 GiB on an H100 80GB, where CUDA gives 79.19). The A100 and H200 entries are
# nvidia-smi's figures, not yet read through CUDA: give --gpu-gib the mem_get_info total there.
GPUS: dict[str, float] = {
    "h100-80gb": 79.19,  # H100 SXM5 80GB: torch.cuda.mem_get_info total (nvidia-smi 81,559 MiB)
    "a100-80gb": 80.0,  # 81,920 MiB (A100 SXM4 80GB)
    "h200-141gb": 139.8,  # H200 141GB: torch.cuda total_memory on a lent H200 (nvidia-smi 143,771 MiB)
}
# Measured on the trainer's step on fake tensors (rspo.gpu_memory.simulate; Qwen3-30B-A3B layers over
# 8 ranks, bf16 over fp32 master weights; docs/cluster.md):
SAVED_FACTOR = 1.13  # kept bytes per token and layer / (c x layer_activation_elems)
CKPT_INPUT = 2.0  # checkpointing keeps 2 x c x H per token and layer (input, rotary tables)
LAYER_BW_FACTOR = 1.4  # a checkpointed layer's backward holds 1.4 x its kept activations (recomputed + grads)
LAYER_FW_FACTOR = 0.7  # a layer's forward without grad holds 0.7 x (its transient intermediates)
GRAD_BUFFER = 4.0  # bytes per layer parameter of its backward: the unsharded grad (c) and the reduction input
LOGIT_BYTES_UPDATE = 13.1  # bytes per token and vocabulary entry at the logits' peak (update)
LOGIT_BYTES_OLD = 15.2  # ... in the no-grad old pass, with the entropy
SYNC_LAYER_COPIES = 2.0  # a sync holds a gathered layer in the compute dtype and its checkpoint-format copy
ADAM_TEMPORARIES = 2.5  # the per-tensor AdamW step (foreach=False under FSDP2): temporaries of one fp32 shard
# Allowances (published or read in the sources, not measured here):
CUDA_CONTEXT_GIB = 0.8  # the CUDA context with its kernels loaded and their workspaces, per process and GPU:
# the smoke model on one H100 (torch 2.11, hf backend, bf16; tensors of a few MiB) measured 0.83 GiB
NCCL_COMM_GIB = 1.0  # per NCCL communicator: 0.54-0.69 GB per group on 4 x A100 (NVIDIA/nccl#964),
# ~1.6 GB for one on H100 with NVLS (NVIDIA/nccl#864); the GPU jobs set NCCL_NVLS_ENABLE=0
VLLM_ALLREDUCE_GIB = 0.1  # vLLM's custom all-reduce: 8 MiB buffers + metadata + registered graph inputs
CUDA_GRAPH_GIB = 1.5  # vLLM's CUDA graph pool for decode batch sizes up to 512 (reported 0.5-2 GiB)
# vLLM 0.32 profiles the graphs' memory before it sizes the KV cache (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS,
# on by default: v1/worker/gpu_worker.py subtracts it from gpu_memory_utilization x total)
GRAPHS_IN_SHARE = "inside gpu_memory_utilization (vLLM 0.32 profiles it before sizing the KV cache)"
FRAGMENTATION = 0.03  # of the tensors' bytes, with expandable_segments:True (verl, torchtitan set it)
ENGINE_ACTIVATION_GIB = 2.0  # vLLM's own forward activations at its batch size, within its share
SLEEP_HOST_COPY_GIB = 3.0  # per rank: vLLM 0.32's sleep (any level) copies its "runtime" and "cudagraph"
# tags to pinned host memory (cumem.py), about 1.5-3 GiB per rank; planned at the upper end
EVAL_UTILIZATION = 0.9  # vLLM's default gpu_memory_utilization: an evaluation engine has the GPUs to itself


@dataclass
class Term:
    name: str
    bytes: float
    formula: str
    kind: str = "tensor"
    """tensor (what the simulation measures) | runtime (CUDA context, NCCL, graphs, all-reduce
    buffers: outside torch's tensors) | allowance (fragmentation)."""


@dataclass
class Phase:
    name: str
    terms: list[Term] = field(default_factory=list)
    host: list[Term] = field(default_factory=list)

    def add(self, name: str, nbytes: float, formula: str, *, kind: str = "tensor", host: bool = False) -> None:
        (self.host if host else self.terms).append(Term(name, float(nbytes), formula, kind))

    @property
    def total(self) -> float:
        return sum(t.bytes for t in self.terms)

    @property
    def tensors(self) -> float:
        """The tensor terms alone (what the simulation on fake tensors measures)."""
        return sum(t.bytes for t in self.terms if t.kind == "tensor")

    @property
    def host_total(self) -> float:
        return sum(t.bytes for t in self.host)


@dataclass(frozen=True)
class Setup:
    """Where a run config runs: what the plan needs beyond the config."""

    gpu_gib: float
    world: int = 1
    """Ranks (GPUs) of the train job."""
    per_node: int = 1
    """Its ranks on one node."""
    host_limit_gib: float = math.inf
    """The train job's host memory (resources.train.mem_mb)."""
    eval_gpus: int = 0
    """GPUs of an evaluation job (0: no evaluation phase)."""
    eval_tokens: int = 0
    """The longest sequence an evaluation engine must hold (prompt + budget)."""


@dataclass
class RunPlan:
    task: str
    run: str
    cfg: Any = field(repr=False)
    model: ModelShape
    setup: Setup
    phases: list[Phase]
    notes: list[str]
    engine_short: str = ""
    """Why an engine cannot hold its weights and one sequence in its share ('' when it can)."""

    @property
    def gpu_gib(self) -> float:
        return self.setup.gpu_gib

    @property
    def limit_gib(self) -> float:
        return self.setup.gpu_gib

    @property
    def peak(self) -> Phase:
        return max(self.phases, key=lambda p: p.total)

    @property
    def host_peak(self) -> float:
        return max(ph.host_total for ph in self.phases)

    @property
    def fits(self) -> bool:
        gpu_ok = self.peak.total <= self.limit_gib * GIB
        return gpu_ok and not self.engine_short and self.host_peak <= self.setup.host_limit_gib * GIB

    def phase(self, name: str) -> Phase:
        return next(p for p in self.phases if p.name == name)


def nccl_communicators(world: int, tp: int, vllm: bool) -> list[tuple[str, str]]:
    """(name, source) of each NCCL communicator a training rank creates, counted from the code."""
    comms = []
    if world > 1:
        comms.append(
            ("FSDP2's process group", "rspo.distributed.init_distributed (torch NCCL, lazily at its first use)")
        )
    if vllm and tp > 1:
        src = "vllm/distributed/parallel_state.py 0.32: a device communicator per group of > 1 ranks"
        comms.append(("vLLM tensor-parallel pynccl", src))
        comms.append(("vLLM tensor-parallel device group", src + " (torch NCCL)"))
        comms.append(("vLLM expert-parallel pynccl (MoE models: tp x dp ranks)", src))
    return comms


def plan_run(cfg, model: ModelShape, setup: Setup, task: str = "") -> RunPlan:
    """Per-GPU phases of one run config (rspo.config.TrainConfig) in the trainer's order."""
    W, per_node = max(1, setup.world), max(1, setup.per_node)
    gpu = setup.gpu_gib * GIB
    c = dtype_bytes(cfg.model.dtype)
    P, L, Lm, K, E, V, H = (
        model.params,
        model.layers,
        model.moe_layers,
        model.top_k,
        model.experts,
        model.vocab,
        model.hidden,
    )
    ro, sc = cfg.rollout, cfg.schedule
    N = ro.tensor_parallel_size
    vllm = not capabilities(ro.backend).in_trainer  # an engine beside the trainer
    offload = cfg.model.cpu_offload
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
    sleep = vllm and ro.vllm_sleep
    graphs = vllm and not ro.vllm_enforce_eager
    comms = nccl_communicators(W, N, vllm)
    notes.append(
        f"NCCL communicators per rank: {len(comms)}" + "".join(f"\n     - {name}: {src}" for name, src in comms)
    )

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

    def engine(ph: Phase, held: str) -> None:
        """held: all | weights | none (asleep) -- what the engine holds in this phase."""
        if not vllm:
            return
        if held == "all":
            ph.add("vLLM engine (reserved)", util * gpu, f"vllm_gpu_memory_utilization {util} x {setup.gpu_gib} GiB")
        elif held == "weights":
            ph.add("vLLM engine weights (awake)", c * P / N, f"{c} B x {P:.4g} / tensor parallel {N}")
        else:
            ph.add("vLLM engine (asleep)", 0.0, "rollout.vllm_sleep: weights and KV cache freed")

    def runtime(ph: Phase, engine: str, engine_built: bool = True) -> None:
        """What lives outside torch's tensors (allowances; see the constants). ``engine``: what the
        engine holds (all | weights | none), which decides where its CUDA graphs are."""
        ph.add("CUDA context", CUDA_CONTEXT_GIB * GIB, f"{CUDA_CONTEXT_GIB} GiB (allowance)", kind="runtime")
        n = len(comms) if engine_built else len(nccl_communicators(W, N, False))
        if n:
            ph.add(
                "NCCL communicators",
                n * NCCL_COMM_GIB * GIB,
                f"{n} x {NCCL_COMM_GIB} GiB (allowance, counted from the code)",
                kind="runtime",
            )
        if not engine_built:
            return
        if vllm and N > 1:
            ph.add("vLLM all-reduce buffers", VLLM_ALLREDUCE_GIB * GIB, f"{VLLM_ALLREDUCE_GIB} GiB", kind="runtime")
        if graphs and engine == "all":
            ph.add("vLLM CUDA graph pool (in the engine's share)", 0.0, GRAPHS_IN_SHARE, kind="runtime")
        elif graphs and engine == "weights":
            ph.add(
                "vLLM CUDA graph pool (woken with the weights)",
                CUDA_GRAPH_GIB * GIB,
                f"{CUDA_GRAPH_GIB} GiB (allowance): wake_up(tags=['weights']) maps every non-deferrable tag back",
                kind="runtime",
            )
        elif graphs:
            ph.add(
                "vLLM CUDA graph pool (offloaded)", 0.0, "sleep_mode_offload_cudagraph: in host memory", kind="runtime"
            )

    def fragmentation(ph: Phase) -> None:
        ph.add(
            "allocator fragmentation",
            FRAGMENTATION * ph.tensors,
            f"{FRAGMENTATION:.0%} of the tensors (allowance; expandable_segments:True)",
            kind="allowance",
        )

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

    # host: every rank reads the checkpoint in its dtype at start; each rank's old-router cache
    rows_held = (sc.prompts_per_step * G // W) if (W > 1 and sc.ppo_epochs == 1) else sc.prompts_per_step * G
    cache_per_token = 3 * Lm * K + (4 * E * Lm if cfg.algorithm.routing == "logit_replay" else 0)
    host_load = per_node * model.ckpt_bytes * P
    host_cache = per_node * rows_held * row * cache_per_token

    phases: dict[str, Phase] = {name: Phase(name) for name in PHASES if name != "evaluation"}
    sync_layer = SYNC_LAYER_COPIES * c * model.layer_params  # a weight stream's peak (sync, first load, final save)
    sync_layer_formula = (
        f"{SYNC_LAYER_COPIES} x {c} B x {model.layer_params:.4g} (the largest layer, gathered and converted)"
    )

    def adam_step(ph: Phase) -> None:
        """What the AdamW step allocates beyond the state: one process steps every tensor at once
        (foreach), FSDP2 one shard at a time (rspo.train.optim)."""
        if offload:
            return
        if W == 1:
            ph.add("AdamW foreach temporaries (one process)", 4 * P, f"4 B x {P:.4g}")
        else:
            big = model.largest_param / W
            ph.add(
                "AdamW temporaries (one shard)",
                ADAM_TEMPORARIES * 4 * big,
                f"{ADAM_TEMPORARIES} x 4 B x {big:.4g} (the largest shard)",
            )

    ph = phases["resume"]  # DCP: a zero-gradient step allocates the optimizer state; no engine yet
    state(ph, grads=True)
    adam_step(ph)
    runtime(ph, "none", engine_built=False)
    ph.add(
        "checkpoints read at start (node)", host_load, f"{per_node} ranks x {P:.4g} x {model.ckpt_bytes} B", host=True
    )
    for name in ("engine_start", "rollout"):
        ph = phases[name]
        state(ph, grads=False)
        engine(ph, "all")
        runtime(ph, "all")
    # the engine starts on dummy weights; its real ones come from the training model as every later
    # sync's do (rspo.rollout.vllm), while it holds its whole share
    if vllm:
        phases["engine_start"].add("a gathered layer (the engine's first load)", sync_layer, sync_layer_formula)
    if capabilities(ro.backend).in_trainer:  # the decoder's KV cache in the trainer's memory
        kv = model.kv_bytes_per_token(c, 1) * (sc.prompts_per_step * G // W) * row
        phases["rollout"].add("generation KV cache", kv, f"{model.kv_bytes_per_token(c, 1)} B/token x rows x {row}")
    for name, backward in (("old_pass", False), ("update", True)):
        ph = phases[name]
        state(ph, grads=False)
        engine(ph, "none" if sleep else "all")
        forward_terms(ph, backward)
        peak_terms(ph, backward)
        runtime(ph, "none" if sleep else "all")
        ph.add(
            "old-router caches (node)",
            host_cache,
            f"{per_node} ranks x {rows_held} rows x {row} x {cache_per_token} B",
            host=True,
        )
    ph = phases["optimizer_step"]
    state(ph, grads=not offload)
    engine(ph, "none" if sleep else "all")
    adam_step(ph)
    runtime(ph, "none" if sleep else "all")
    ph = phases["sync"]  # gradients released; the weights awake; one gathered layer streams in
    state(ph, grads=False)
    engine(ph, "weights" if sleep else "all")
    ph.add("a gathered layer (sync)", sync_layer, sync_layer_formula)
    runtime(ph, "weights" if sleep else "all")
    for name in ("kv_wake", "checkpoint_save"):
        ph = phases[name]
        state(ph, grads=False)
        engine(ph, "all")
        runtime(ph, "all")
    # the larger of the two saves: the sharded checkpoint (no gather) and, after the last step, the
    # final Hugging Face checkpoint, streamed through the sync's gathers (rspo.train.checkpoint)
    phases["checkpoint_save"].add("a gathered layer (the final checkpoint)", sync_layer, sync_layer_formula)
    if sleep:  # while the engine sleeps, its runtime buffers and graphs wait in pinned host memory
        for name in ("old_pass", "update", "optimizer_step"):
            phases[name].add(
                "vLLM's sleep copies (node)",
                per_node * SLEEP_HOST_COPY_GIB * GIB,
                f"{per_node} ranks x {SLEEP_HOST_COPY_GIB} GiB (allowance: runtime and cudagraph tags, pinned)",
                host=True,
            )
    out = list(phases.values())
    short = []

    def engine_fits(label: str, tp: int, share: float, seq: int) -> None:
        """An engine holds its weights, one longest sequence's KV cache and its activations in its share."""
        weights = c * P / tp
        kv = model.kv_bytes_per_token(c, tp) * seq
        need = weights + kv + ENGINE_ACTIVATION_GIB * GIB + (CUDA_GRAPH_GIB * GIB if graphs else 0.0)
        tokens = kv_cache_tokens(model, c, tp, share, graphs)
        notes.append(
            f"{label} engine: weights {weights / GIB:.2f} GiB (P x {c} B / tensor parallel {tp}) + one {seq}-token "
            f"sequence's KV {kv / GIB:.2f} GiB + {ENGINE_ACTIVATION_GIB} GiB activations"
            f"{f' + {CUDA_GRAPH_GIB} GiB CUDA graphs' if graphs else ''} = {need / GIB:.2f} GiB of its "
            f"{share / GIB:.2f} GiB; KV cache for about {tokens / 1e6:.2f}M tokens"
        )
        if need > share:
            short.append(
                f"the {label} engine needs {need / GIB:.1f} GiB per GPU (weights {weights / GIB:.1f} at tensor "
                f"parallel {tp}) but has {share / GIB:.1f} GiB"
            )

    if vllm:
        engine_fits("rollout", N, util * gpu, row)
        if setup.eval_gpus:
            ev = Phase("evaluation")
            ev.add(
                "vLLM engine (reserved)",
                EVAL_UTILIZATION * gpu,
                f"{EVAL_UTILIZATION} x {setup.gpu_gib} GiB ({setup.eval_gpus} GPUs)",
            )
            ev.add("CUDA context", CUDA_CONTEXT_GIB * GIB, f"{CUDA_CONTEXT_GIB} GiB (allowance)", kind="runtime")
            if setup.eval_gpus > 1:
                ev.add(
                    "NCCL communicators",
                    2 * NCCL_COMM_GIB * GIB,
                    f"2 x {NCCL_COMM_GIB} GiB (tensor and expert parallel)",
                    kind="runtime",
                )
                ev.add("vLLM all-reduce buffers", VLLM_ALLREDUCE_GIB * GIB, f"{VLLM_ALLREDUCE_GIB} GiB", kind="runtime")
            ev.add("vLLM CUDA graph pool (in the engine's share)", 0.0, GRAPHS_IN_SHARE, kind="runtime")
            out.append(ev)
            engine_fits(
                "evaluation",
                setup.eval_gpus,
                EVAL_UTILIZATION * gpu,
                cfg.data.max_prompt_tokens + max(setup.eval_tokens, 1),
            )
    for ph in out:
        if any(t.kind == "tensor" and t.bytes for t in ph.terms):
            fragmentation(ph)
    return RunPlan(task, cfg.run_name, cfg, model, setup, out, notes, "; ".join(short))


def kv_cache_tokens(model: ModelShape, c: int, tp: int, share: float, graphs: bool) -> float:
    """Tokens an engine's KV cache holds: its share less its weights, its activations and (captured)
    its CUDA graphs, over the KV bytes of a token on one of its GPUs (rspo.gpu_memory.rollout_time
    reads the same number)."""
    rest = share - c * model.params / tp - ENGINE_ACTIVATION_GIB * GIB - (CUDA_GRAPH_GIB * GIB if graphs else 0.0)
    return max(0.0, rest) / model.kv_bytes_per_token(c, tp)


# ------------------------------------------------------------------------------ a preset, a running trainer


def preset_setup(preset: dict[str, Any], gpu_gib: float) -> Setup:
    """The train and evaluation jobs' resources of a preset (rspo.plan.Plan.resources)."""
    from rspo.plan import Plan

    plan = Plan(preset)
    res_train, res_eval = plan.resources("train"), plan.resources("evaluate")
    W = max(1, int(res_train["processes"]))
    eval_new = max((plan.spec.evaluation(f).max_new_tokens for f in plan.spec.evaluated), default=0)
    return Setup(
        gpu_gib=gpu_gib,
        world=W,
        per_node=min(W, max(1, int(res_train.get("gpu") or 1))),
        host_limit_gib=float(res_train["mem_mb"]) / 1024,  # MiB -> GiB
        eval_gpus=max(1, int(res_eval.get("gpu") or 1)),
        eval_tokens=eval_new,
    )


def plan_preset(
    preset_path: str, gpu_gib: float, hub_dir: str = "results/hub", overrides=(), gpus: int = 0
) -> list[RunPlan]:
    """One RunPlan per task and distinct memory-relevant run config of the preset's grid, with the
    ``overrides`` (``key=value`` of the rl config, as `rspo train --set`) and, with ``gpus``, a train
    job of that many GPUs (data-parallel ranks; a node holds at most as many as the preset's job asks)."""
    from rspo.grid import train_config
    from rspo.plan import Plan

    preset = with_gpus(load_preset(preset_path), gpus) if gpus else load_preset(preset_path)
    plan = Plan(preset)
    setup = preset_setup(preset, gpu_gib)
    out: list[RunPlan] = []
    shapes: dict[str, ModelShape] = {}
    seen = set()
    for run in plan.runs.values():
        cfg = train_config(plan.spec, run, list(overrides))  # the Run in hand: no lookup by name
        key = (run.task, cfg.algorithm.routing, cfg.model.path)
        if key in seen:
            continue
        seen.add(key)
        if cfg.model.path not in shapes:
            path = plan.hub_model(run.task) or cfg.model.path
            shapes[cfg.model.path] = model_shape(path, plan.spec, run.task, hub_dir)
        out.append(plan_run(cfg, shapes[cfg.model.path], setup, run.task))
    return out


def with_gpus(preset: dict[str, Any], gpus: int) -> dict[str, Any]:
    """The preset with a train job of ``gpus`` ranks: resources.train.processes, and its GPUs per
    node capped at what the preset's job asks (more ranks than that are more nodes)."""
    import copy

    out = copy.deepcopy(preset)
    train = out.setdefault("resources", {}).setdefault("train", {})
    per_node = int(train.get("gpu") or gpus)
    train.update(processes=gpus, gpu=min(gpus, per_node))
    return out


def planned_phases(cfg, dist, gpu_bytes: int) -> dict[str, float] | None:
    """The plan's total (GiB) per phase for a running trainer on a GPU of ``gpu_bytes`` (the first
    step's memory is printed beside it); None when the model's shape cannot be read."""
    try:
        shape = model_shape(cfg.model.path, Preset({}), cfg.data.task)
    except (PlanError, OSError, ValueError):
        return None
    setup = Setup(gpu_gib=gpu_bytes / GIB, world=dist.world_size, per_node=dist.local_world_size)
    return {ph.name: ph.total / GIB for ph in plan_run(cfg, shape, setup).phases}
