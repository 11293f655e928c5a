"""The memory plan in words (rspo.gpu_memory.plan makes it): the JSON summary of a preset's plans, the
term-by-term rendering ``plan-memory`` prints, its verdict first in one line, and what to change when
a preset does not fit (the workflow's message, workflow/rules/common.smk)."""

from __future__ import annotations

from typing import Any

from rspo.gpu_memory.plan import GIB, RunPlan

__all__ = ["advice", "fit_line", "ranked_advice", "render", "summary", "verdict"]


def summary(preset_name: str, gpu: str, plans: list[RunPlan]) -> dict[str, Any]:
    """The JSON line: fits, the peak phase, each phase's largest total over the preset's runs."""
    worst = max(plans, key=lambda p: p.peak.total)
    host = max(ph.host_total for p in plans for ph in p.phases)
    short = [p.engine_short for p in plans if p.engine_short]
    host_short = [p for p in plans if p.host_peak > p.setup.host_limit_gib * GIB]
    phases: dict[str, float] = {}
    for p in plans:
        for ph in p.phases:
            phases[ph.name] = round(max(phases.get(ph.name, 0.0), ph.total / GIB), 2)
    return {
        "preset": preset_name,
        "gpu": gpu,
        "fits": all(p.fits for p in plans),
        "peak_gib": round(worst.peak.total / GIB, 2),
        "peak_phase": worst.peak.name,
        "peak_task": worst.task,
        "limit_gib": round(worst.limit_gib, 2),
        "phases": phases,
        "host_peak_gib": round(host / GIB, 1),
        "host_limit_gib": round(min(p.setup.host_limit_gib for p in plans), 1),
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
            lines.append(f"  -- {ph.name}: {ph.total / GIB:.2f} GiB of {p.limit_gib:.2f} per GPU")
            for t in ph.terms:
                lines.append(f"     {t.bytes / GIB:8.2f} GiB  {t.name:40s} {t.formula}")
            if ph.host:
                lines.append(f"     host per node: {ph.host_total / GIB:.1f} GiB")
                for t in ph.host:
                    lines.append(f"     {t.bytes / GIB:8.2f} GiB  {t.name:40s} {t.formula}")
    return "\n".join(lines)


def verdict(s: dict[str, Any]) -> str:
    """The plan's verdict in words (``s``: ``summary``): fits or not, the peak phase and by how much,
    the workflow's advice when it does not fit, and the host memory against its limit."""
    gpu = f"{s['peak_gib']} of {s['limit_gib']} GiB per GPU on {s['gpu']}"
    host = f"host memory per node: {s['host_peak_gib']} of {s['host_limit_gib']} GiB (resources.train.mem_mb)"
    if s["fits"]:
        spare = round(s["limit_gib"] - s["peak_gib"], 2)
        peak = f"the {s['peak_phase']} phase of task {s['peak_task']}"
        return f"fits: the peak is {peak}, {gpu} ({spare} GiB to spare); {host}"
    over = round(s["peak_gib"] - s["limit_gib"], 2)
    by = f" ({over} GiB over)" if over > 0 else ""
    return f"does not fit{by}: {advice(s)}; {host}"


def fit_line(s: dict[str, Any]) -> str:
    """One line for a plan that fits (a dry run's verdict): 'fits X of Y GiB on Z'."""
    where = f"(peak: {s['peak_phase']}, task {s['peak_task']})"
    return f"fits {s['peak_gib']} of {s['limit_gib']} GiB per GPU on {s['gpu']} {where}"


def advice(s: dict[str, Any]) -> str:
    """What to change when a plan does not fit (the workflow's message)."""
    if s.get("host", "ok") != "ok" and s["peak_gib"] <= s["limit_gib"] and s.get("engine", "ok") == "ok":
        return f"the train job {s['host']}, resources.train.mem_mb gives {s['host_limit_gib']} GiB: raise it"
    if s.get("engine", "ok") != "ok" and s["peak_gib"] <= s["limit_gib"]:
        return f"{s['engine']} on {s['gpu']}: raise rollout.tensor_parallel_size or rollout.vllm_gpu_memory_utilization"
    said = (
        f"the {s['peak_phase']} phase of task {s['peak_task']} needs {s['peak_gib']} GiB per GPU, {s['limit_gib']} GiB "
    )
    said += f"are on {s['gpu']}"
    if "advice" in s:  # plan-memory planned each setting not at its limit (rspo.gpu_memory.advice)
        return f"{said}; {ranked_advice(s['advice'], s['limit_gib'])}"
    return f"{said}: `rspo plan-memory` ranks the settings not at their limit by the GiB each saves"


def _words(r: dict[str, Any], limit_gib: float) -> str:
    host = (
        f", host {r['host_gib']} of {r['host_limit_gib']} GiB per node" if r["host_gib"] > r["host_limit_gib"] else ""
    )
    return f"{r['peak_gib']} of {limit_gib} GiB per GPU{host}: {'fits' if r['fits'] else 'does not fit'}"


def ranked_advice(r: dict[str, Any], limit_gib: float) -> str:
    """rspo.gpu_memory.advice.rank's result in words."""
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
