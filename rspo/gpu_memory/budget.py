"""What a preset's RL runs cost on a cluster, in one line beside the memory plan.

- **jobs x GPUs**: the preset's RL runs (one train job chain each) and the GPUs of a train job
  (``resources.train``; ``--gpus`` overrides them);
- **hours**: a floor per run, the rollout's decoding floor at the GPU's memory bandwidth
  (rspo.gpu_memory.rollout_time, per step) times the run's steps: the updates, the old pass and the
  evaluations come on top, so a run takes longer; against the job limit ``resources.train.runtime``
  (a run longer than one job resubmits and resumes: docs/cluster.md);
- **GPU-hours**: runs x GPUs x that floor;
- **disk**: per run, the sharded checkpoints it keeps (``schedule.keep_checkpoints``), each the fp32
  weights and Adam's two moments (12 bytes per parameter), plus the final model in its checkpoint
  dtype; for all runs;
- **host memory per node**: the plan's peak over its phases (``host_peak_gib``).

The floor needs a named GPU (``--gpu``); with ``--gpu-gib`` the hours are left out.
"""

from __future__ import annotations

from typing import Any

from rspo.config import load_preset
from rspo.gpu_memory.plan import GIB, RunPlan, with_gpus
from rspo.gpu_memory.rollout_time import rollout_time

__all__ = ["budget", "budget_line"]

CKPT_BYTES_PER_PARAM = 12  # fp32 weights (4) + Adam's first and second moments (4 + 4)


def budget(preset_path: str, plans: list[RunPlan], gpus: int = 0, gpu: str = "") -> dict[str, Any]:
    """The cost of the preset's RL runs (see the module docstring); ``gpu`` a name of GPU_SPECS."""
    from rspo.plan import Plan

    preset = load_preset(preset_path)
    plan = Plan(with_gpus(preset, gpus) if gpus else preset)
    res = plan.resources("train")
    per_run = max(int(res["processes"]), int(res["gpu"] or 0)) if res["gpu"] else 0
    by_task: dict[str, RunPlan] = {}
    for p in plans:
        by_task.setdefault(p.task, p)
    runs = {task: sum(1 for r in plan.runs.values() if r.task == task) for task in by_task}
    hours, disk = {}, 0.0
    for task, p in by_task.items():
        floor = rollout_time(p, gpu) if gpu else None
        if floor is not None:
            hours[task] = floor.seconds * p.cfg.schedule.total_steps / 3600
        keep = max(1, p.cfg.schedule.keep_checkpoints)
        one = p.model.params * (keep * CKPT_BYTES_PER_PARAM + p.model.ckpt_bytes)
        disk += runs[task] * one
    gpu_hours = sum(runs[t] * per_run * h for t, h in hours.items()) if per_run else None
    return {
        "runs": sum(runs.values()),
        "gpus_per_run": per_run,
        "job_h": round(float(res["runtime"]) / 60, 1),
        "run_h_floor": {t: round(h, 1) for t, h in hours.items()},
        "gpu_hours_floor": round(gpu_hours) if gpu_hours is not None and hours else None,
        "disk_gib": round(disk / GIB),
        "host_gib_per_node": max(round(max(ph.host_total for ph in p.phases) / GIB) for p in plans),
    }


def budget_line(b: dict[str, Any]) -> str:
    """``budget`` in one line."""
    hours = ", ".join(f"{t} at least {h} h" for t, h in b["run_h_floor"].items()) or "hours: name a GPU (--gpu)"
    gpu_hours = f"at least {b['gpu_hours_floor']:,} GPU-hours" if b["gpu_hours_floor"] else "GPU-hours: -"
    return (
        f"budget: {b['runs']} runs x {b['gpus_per_run']} GPUs, {hours} per run (the rollout's decoding floor; "
        f"jobs of {b['job_h']} h resubmit), {gpu_hours}; disk {b['disk_gib']:,} GiB (checkpoints kept + final "
        f"models); host memory {b['host_gib_per_node']} GiB per node"
    )
