"""Where a run's wall time goes: its steps (rollout, reward, old pass, update, weight sync), in-run
validation, checkpoint saves, the final checkpoint, start-up (the process's start to the run loop:
imports, model and data load, engine build, a resume's checkpoint read) and the rest (tracking,
metric files, progress), per job and summed over the jobs of a resumed run.

The trainer keeps one ``TimeAccount``: the steps' phases come from each step's ``perf/*_s`` metrics
(rspo.train.step_metrics), validation and saves are timed where they run, start-up is the time from
the job's process start (rspo.train.time_limit.job_process_start: under torchrun the launcher's) to
the run loop, and "other" is the job's wall time less all of these. The run folder keeps the
account as of the newest checkpoint's end (``time_account.json``, rspo.train.run_folder: written
after each save completes and again when a job stops at its time limit; the checkpoint's own copy,
taken before the save, is the fallback), and a resumed job adds its own to it, so a run resumed
over several jobs reports all of them, the saves and a stopped job's end included. The time a
killed job spent after its last save is not counted: its steps are redone and counted by the job
that redoes them. ``final.json`` holds it under ``time_account`` and MLflow as ``time/<part>_s``
metrics; ``rspo report time`` prints it per run and summed over a study.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

STEP_PARTS = ("rollout", "reward", "old_pass", "update", "sync")
PARTS = ("startup", *(f"step_{p}" for p in STEP_PARTS), "validation", "checkpoint", "final_save", "other")


@dataclass
class TimeAccount:
    """Seconds per part of one job (``seconds``), plus what earlier jobs of the run spent (``earlier``)."""

    started: float
    """Wall-clock second of the job's process start."""
    seconds: dict[str, float] = field(default_factory=dict)
    earlier: dict[str, float] = field(default_factory=dict)
    jobs_before: int = 0

    def add(self, part: str, s: float) -> None:
        if part not in PARTS or part == "other":
            raise ValueError(f"unknown part {part!r} of a run's time; parts: {PARTS[:-1]}")
        self.seconds[part] = self.seconds.get(part, 0.0) + s

    def loop_started(self) -> None:
        """The run loop begins: everything since the process started was start-up."""
        self.seconds["startup"] = time.time() - self.started

    def add_step(self, metrics: dict[str, float]) -> None:
        for p in STEP_PARTS:
            self.add(f"step_{p}", float(metrics.get(f"perf/{p}_s", 0.0)))

    def job(self, now: float | None = None) -> dict[str, float]:
        """This job's account: every part, "other" the rest of its wall time, and ``wall``."""
        wall = (time.time() if now is None else now) - self.started
        out = {p: round(self.seconds.get(p, 0.0), 3) for p in PARTS if p != "other"}
        out["other"] = round(max(0.0, wall - sum(self.seconds.values())), 3)
        out["wall"] = round(wall, 3)
        return out

    def total(self, now: float | None = None) -> dict[str, float]:
        """The run's account so far: this job's plus the earlier jobs' (from the checkpoint)."""
        job = self.job(now)
        return {k: round(v + self.earlier.get(k, 0.0), 3) for k, v in job.items()}

    def state(self, now: float | None = None) -> dict:
        """What a checkpoint keeps: the account up to now, and how many jobs it spans."""
        return {"seconds": self.total(now), "jobs": self.jobs_before + 1}

    def restore(self, state: dict | None) -> None:
        if state:
            self.earlier = {k: float(v) for k, v in state.get("seconds", {}).items()}
            self.jobs_before = int(state.get("jobs", 0))

    def summary(self, now: float | None = None) -> dict:
        """``final.json``'s ``time_account``: the run's parts in seconds, its step total and non-step
        share, and the jobs it spans."""
        total = self.total(now)
        steps = sum(total[f"step_{p}"] for p in STEP_PARTS)
        wall = total["wall"]
        return {
            **total,
            "steps": round(steps, 3),
            "non_step_share": round(1 - steps / wall, 4) if wall > 0 else None,
            "jobs": self.jobs_before + 1,
        }
