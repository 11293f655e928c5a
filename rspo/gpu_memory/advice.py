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
from rspo.gpu_memory.plan import GIB, RunPlan, plan_preset

__all__ = ["Change", "candidates", "rank", "ranked_advice"]

CHUNK = 1024  # logits_chunk_tokens the advice proposes (the paper presets' value)
UTIL_STEP = 0.1


@dataclass(frozen=True)
class Change:
    """One setting to try: ``--set key=value`` (``gpus``: the train job's GPU count instead)."""

    key: str
    value: Any
    gpus: int = 0
    per_node: int = 0

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
        out.append(Change("model.cpu_offload", "true"))
    out.append(Change("", None, gpus=setup.world * 2, per_node=setup.per_node))
    return out


def _plan(preset: str, gib: float, hub_dir: str, overrides: list[str], gpus: int) -> list[RunPlan]:
    return plan_preset(preset, gib, hub_dir, overrides=overrides, gpus=gpus)


def _outcome(plans: list[RunPlan]) -> dict[str, Any]:
    """The GPU peak, the host peak per node against its limit, and whether the plan fits."""
    host = max(p.host_peak for p in plans) / GIB
    return {
        "peak_gib": round(max(p.peak.total for p in plans) / GIB, 2),
        "host_gib": round(host, 1),
        "host_limit_gib": round(min(p.setup.host_limit_gib for p in plans), 1),
        "fits": all(p.fits for p in plans),
    }


def _heavy(label: str) -> bool:
    return label.startswith("model.cpu_offload") or " GPUs" in label


def rank(
    preset: str, gib: float, hub_dir: str, overrides: list[str], gpus: int, plans: list[RunPlan]
) -> dict[str, Any]:
    """Each candidate planned alone: {"changes": [{"set", "saved_gib", "peak_gib", "host_gib", "fits"}]
    ranked by GiB saved (those that save), "together": every change that saves, planned together,
    "only": whether only CPU offload or more GPUs make it fit}."""
    from rspo.config import ConfigError

    base = _outcome(plans)["peak_gib"]
    rows, sets, more = [], [], 0
    for c in candidates(plans):
        try:
            tried = _plan(preset, gib, hub_dir, overrides + ([] if c.gpus else [f"{c.key}={c.value}"]), c.gpus or gpus)
        except ConfigError:  # e.g. a batch that does not split over twice the ranks
            continue
        out = _outcome(tried)
        if base - out["peak_gib"] > 0.005:
            rows.append({"set": c.label, "saved_gib": round(base - out["peak_gib"], 2), **out})
            if c.gpus:
                more = c.gpus
            else:
                sets.append(f"{c.key}={c.value}")
    rows.sort(key=lambda r: -r["saved_gib"])
    together = None
    if len(rows) > 1:
        together = {
            "set": [r["set"] for r in rows],
            **_outcome(_plan(preset, gib, hub_dir, overrides + sets, more or gpus)),
        }
    light = [r for r in rows if not _heavy(r["set"])]
    light_sets = [f for f in sets if not f.startswith("model.cpu_offload")]
    light_fits = any(r["fits"] for r in light) or (
        len(light_sets) > 1 and _outcome(_plan(preset, gib, hub_dir, overrides + light_sets, gpus))["fits"]
    )
    heavy_fits = any(r["fits"] for r in rows if _heavy(r["set"])) or bool(together and together["fits"])
    return {"changes": rows, "together": together, "only": bool(heavy_fits and not light_fits)}


def _words(r: dict[str, Any], limit_gib: float) -> str:
    host = (
        f", host {r['host_gib']} of {r['host_limit_gib']} GiB per node" if r["host_gib"] > r["host_limit_gib"] else ""
    )
    return f"{r['peak_gib']} of {limit_gib} GiB per GPU{host}: {'fits' if r['fits'] else 'does not fit'}"


def ranked_advice(r: dict[str, Any], limit_gib: float) -> str:
    """``rank``'s result in words."""
    if not r["changes"]:
        return (
            "no setting the plan models lowers the peak; every one is at its limit: only a GPU with more memory helps"
        )
    parts = [f"{c['set']} (-{c['saved_gib']} GiB: {_words(c, limit_gib)})" for c in r["changes"]]
    text = "each setting not at its limit, alone, by GiB saved: " + "; ".join(parts)
    t = r["together"]
    if t is not None and not any(c["fits"] for c in r["changes"]):
        text += f"; all of them together: {_words(t, limit_gib)}"
    if r["only"]:
        text += "; only CPU offload or more GPUs can make it fit (the other settings, alone or together, do not)"
    elif not any(c["fits"] for c in r["changes"]) and not (t and t["fits"]):
        text += "; nothing the plan models fits on this GPU: a GPU with more memory"
    return text
