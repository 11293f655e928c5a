"""What to change when a preset's memory plan does not fit, ranked by the GiB each change saves.

Each setting the plan models that can lower a phase's peak is tried alone, by planning the preset
again with that one override, unless the preset already has it at its limit:

- ``model.gradient_checkpointing`` on (limit: on);
- ``model.logits_chunk_tokens`` 1,024 (limit: already chunked, at 1,024 or fewer);
- ``schedule.max_tokens_per_micro_batch`` halved (limit: one longest row, prompt + response, per forward);
- ``rollout.tensor_parallel_size`` doubled (limit: every GPU of the train job's node);
- ``rollout.vllm_sleep`` on (limit: on, or no vLLM engine);
- ``rollout.vllm_gpu_memory_utilization`` lowered by 0.1 (limit: 0.1 or less, or no vLLM engine);
- ``model.cpu_offload`` on (limit: on);
- twice the GPUs (``resources.train.processes``: FSDP shards the weights, gradients and Adam state over
  more ranks).

The changes that lower the peak come ranked by GiB saved, each saying whether it fits alone. Where none
but CPU offload or more GPUs fits, the advice says so: the other settings cannot help. Where even all
of them together do not fit, it says that too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rspo.backend_capabilities import capabilities
from rspo.gpu_memory.plan import RunPlan, plan_preset
from rspo.gpu_memory.verdict import summary

__all__ = ["Change", "candidates", "rank"]

CHUNK = 1024  # logits_chunk_tokens the advice proposes (the paper presets' value)
UTIL_STEP = 0.1
OFFLOAD = "model.cpu_offload"


@dataclass(frozen=True)
class Change:
    """One setting to try: ``--set key=value`` (``gpus``: the train job's GPU count instead)."""

    key: str
    value: Any
    gpus: int = 0
    per_node: int = 0

    @property
    def heavy(self) -> bool:
        """CPU offload or more GPUs: what remains when the other settings are at their limit."""
        return bool(self.gpus) or self.key == OFFLOAD

    @property
    def label(self) -> str:
        if not self.gpus:
            return f"{self.key}={self.value}"
        if self.per_node and self.gpus > self.per_node:  # the workflow's train job is one node (docs/cluster.md)
            return f"{self.gpus} GPUs ({self.gpus // self.per_node} nodes; the workflow trains on one)"
        return f"{self.gpus} GPUs"


def candidates(plans: list[RunPlan]) -> list[Change]:
    """The changes not at their limit in any of the preset's run configs (the worst plan's config
    decides the value proposed)."""
    worst = max(plans, key=lambda p: p.peak.total)
    cfg, setup = worst.cfg, worst.setup
    model, ro, sc = cfg.model, cfg.rollout, cfg.schedule
    out: list[Change] = []
    if not model.gradient_checkpointing:
        out.append(Change("model.gradient_checkpointing", "true"))
    if not model.logits_chunk_tokens or model.logits_chunk_tokens > CHUNK:
        out.append(Change("model.logits_chunk_tokens", CHUNK))
    row = cfg.data.max_prompt_tokens + ro.max_new_tokens
    budget = sc.max_tokens_per_micro_batch
    if not budget:
        out.append(Change("schedule.max_tokens_per_micro_batch", row))
    elif budget // 2 >= row:
        out.append(Change("schedule.max_tokens_per_micro_batch", budget // 2))
    engine = capabilities(ro.backend)  # an engine beside the trainer, sharded, put to sleep: vLLM's
    if engine.tensor_parallel and ro.tensor_parallel_size * 2 <= setup.per_node:
        out.append(Change("rollout.tensor_parallel_size", ro.tensor_parallel_size * 2))
    if engine.sleep and not ro.vllm_sleep:
        out.append(Change("rollout.vllm_sleep", "true"))
    if not engine.in_trainer and ro.vllm_gpu_memory_utilization - UTIL_STEP >= UTIL_STEP - 1e-9:
        out.append(Change("rollout.vllm_gpu_memory_utilization", round(ro.vllm_gpu_memory_utilization - UTIL_STEP, 2)))
    if not model.cpu_offload:
        out.append(Change(OFFLOAD, "true"))
    out.append(Change("", None, gpus=setup.world * 2, per_node=setup.per_node))
    return out


def _outcome(plans: list[RunPlan]) -> dict[str, Any]:
    """The plan's GPU peak, host peak per node against its limit and whether it fits: summary's fields."""
    s = summary("", "", plans)
    return {
        "peak_gib": s["peak_gib"],
        "host_gib": s["host_peak_gib"],
        "host_limit_gib": s["host_limit_gib"],
        "fits": s["fits"],
    }


def rank(
    preset: str, gib: float, hub_dir: str, overrides: list[str], gpus: int, plans: list[RunPlan]
) -> dict[str, Any]:
    """Each candidate planned alone: {"changes": [{"set", "saved_gib", "peak_gib", "host_gib", "fits"}]
    ranked by GiB saved (those that save), "together": every change that saves, planned together,
    "only": whether only CPU offload or more GPUs make it fit}."""
    from rspo.config import ConfigError

    base = _outcome(plans)["peak_gib"]
    rows, light_sets, heavy_labels, offload, more = [], [], set(), [], 0
    for c in candidates(plans):
        setting = [] if c.gpus else [f"{c.key}={c.value}"]
        try:
            tried = plan_preset(preset, gib, hub_dir, overrides=overrides + setting, gpus=c.gpus or gpus)
        except ConfigError:  # e.g. a batch that does not split over twice the ranks
            continue
        out = _outcome(tried)
        if base - out["peak_gib"] > 0.005:
            rows.append({"set": c.label, "saved_gib": round(base - out["peak_gib"], 2), **out})
            if c.heavy:
                heavy_labels.add(c.label)
            more = c.gpus or more
            (offload if c.key == OFFLOAD else light_sets).extend(setting)
    rows.sort(key=lambda r: -r["saved_gib"])
    together = None
    if len(rows) > 1:
        tried = plan_preset(preset, gib, hub_dir, overrides=overrides + light_sets + offload, gpus=more or gpus)
        together = {"set": [r["set"] for r in rows], **_outcome(tried)}
    light_fits = any(r["fits"] for r in rows if r["set"] not in heavy_labels) or (
        len(light_sets) > 1
        and _outcome(plan_preset(preset, gib, hub_dir, overrides=overrides + light_sets, gpus=gpus))["fits"]
    )
    heavy_fits = any(r["fits"] for r in rows if r["set"] in heavy_labels) or bool(together and together["fits"])
    return {"changes": rows, "together": together, "only": bool(heavy_fits and not light_fits)}
