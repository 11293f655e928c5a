"""How long a step's rollout takes at the least, from the memory plan: the decoding time a colocated
vLLM engine needs when memory bandwidth is the only limit (``python -m rspo plan-memory`` prints it;
``rspo preflight`` adds it to its step estimate when its engine is the stand-in, which decodes
nothing).

Decoding a batch of sequences reads, per generated token of the batch, every weight the engine holds
on a GPU (with tens of sequences decoding at once, a MoE's tokens touch nearly every expert of each
layer: Qwen3-30B-A3B routes each token to 8 of 128) and the KV cache of every sequence in the batch;
at batch sizes far below the GPU's compute roof that reading is the time (the memory-bandwidth
roofline). Per engine and step (the plan's worst case: every prompt ``data.max_prompt_tokens``
long, every response ``rollout.max_new_tokens``):

- sequences: ``prompts_per_step x group_size`` over the job's engines (train ranks / tensor parallel);
- at once: as many as the KV cache holds whole (``rspo.gpu_memory.plan.kv_cache_tokens`` over prompt +
  response tokens), at most vLLM 0.32's ``max_num_seqs`` for the ``LLM`` class (1024 on an H100 or
  H200, 256 on an A100: ``EngineArgs.get_batch_defaults``);
- waves: sequences / at once, rounded up, each ``max_new_tokens`` decode iterations;
- bytes per iteration and GPU: the engine's weights (c x P / tensor parallel) plus the KV cache of
  the sequences at once, half their responses written on average;
- seconds: iterations x bytes / the GPU's memory bandwidth (``GPU_SPECS``: the vendors' datasheets).

What it leaves out, so real decoding is slower: prefill (compute-bound; one pass over the prompts),
kernels below the bandwidth roof (decoding kernels reach about 50-80% of it), scheduling, sampling,
and the tail of a wave whose last sequences run alone. Shorter responses are faster: with responses
of mean length m the iterations shrink by about m / max_new_tokens. It is a floor on the rollout of
a full-length step, to set beside the training part of the step that ``rspo preflight`` measures,
not a measurement. No model FLOPs utilisation is derived: the preflight's step is measured on a model
cut to a few layers and scaled, and a utilisation from a scaled time would measure the scaling.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rspo.backend_capabilities import capabilities
from rspo.gpu_memory.plan import GIB, RunPlan, kv_cache_tokens
from rspo.gpu_memory.shape import dtype_bytes

__all__ = ["GPU_SPECS", "RolloutTime", "rollout_time"]


@dataclass(frozen=True)
class GpuSpec:
    bandwidth: float
    """Memory bandwidth, bytes per second (datasheet)."""
    max_num_seqs: int
    """vLLM 0.32's default of the LLM class on this GPU."""


GPU_SPECS: dict[str, GpuSpec] = {
    "h100-80gb": GpuSpec(3.35e12, 1024),  # H100 SXM5: 3.35 TB/s HBM3
    "a100-80gb": GpuSpec(2.039e12, 256),  # A100 SXM4 80GB: 2,039 GB/s HBM2e
    "h200-141gb": GpuSpec(4.8e12, 1024),  # H200 SXM: 4.8 TB/s HBM3e
}


@dataclass(frozen=True)
class RolloutTime:
    sequences: int
    """Sequences one engine decodes per step."""
    kv_tokens: float
    """Tokens its KV cache holds."""
    at_once: int
    """Sequences decoded at once (0: not even one fits)."""
    waves: int
    iterations: int
    """Decode iterations per step (waves x max_new_tokens)."""
    bytes_per_iteration: float
    """Bytes one GPU reads per decode iteration."""
    seconds: float
    """The roofline time of the step's decoding (inf when no sequence fits)."""

    def line(self) -> str:
        if not self.at_once:
            return "rollout: the engine's KV cache cannot hold one full sequence; no decoding time"
        return (
            f"rollout: at least {self.seconds:.0f} s per step at the memory-bandwidth roof: {self.sequences} "
            f"sequences per engine, {self.at_once} at once (KV cache for {self.kv_tokens / 1e6:.2f}M tokens), "
            f"{self.waves} waves, {self.iterations} decode iterations of {self.bytes_per_iteration / GIB:.1f} GiB "
            "read per GPU "
            "(full-length responses; prefill and kernel efficiency left out: rspo.gpu_memory.rollout_time)"
        )


def rollout_time(plan: RunPlan, gpu: str) -> RolloutTime | None:
    """The step's decoding floor of a planned run on a named GPU (``GPU_SPECS``); None where the run
    has no vLLM engine (the hf backend generates in the trainer) or the GPU is not named."""
    cfg, model = plan.cfg, plan.model
    spec = GPU_SPECS.get(gpu)
    if spec is None or capabilities(cfg.rollout.backend).in_trainer:
        return None
    c = dtype_bytes(cfg.model.dtype)
    tp = cfg.rollout.tensor_parallel_size
    engines = max(1, max(1, plan.setup.world) // tp)
    sequences = math.ceil(cfg.schedule.prompts_per_step * cfg.rollout.group_size / engines)
    prompt, response = cfg.data.max_prompt_tokens, cfg.rollout.max_new_tokens
    share = cfg.rollout.vllm_gpu_memory_utilization * plan.setup.gpu_gib * GIB
    graphs = not cfg.rollout.vllm_enforce_eager
    kv_tokens = kv_cache_tokens(model, c, tp, share, graphs)
    at_once = min(spec.max_num_seqs, sequences, int(kv_tokens // (prompt + response)))
    if at_once < 1:
        return RolloutTime(sequences, kv_tokens, 0, 0, 0, 0.0, math.inf)
    waves = math.ceil(sequences / at_once)
    iterations = waves * response
    per_iteration = c * model.params / tp + at_once * (prompt + response / 2) * model.kv_bytes_per_token(c, tp)
    return RolloutTime(
        sequences, kv_tokens, at_once, waves, iterations, per_iteration, iterations * per_iteration / spec.bandwidth
    )
