"""A training job that stops cleanly before its time limit, so that the next job resumes it.

A SLURM job is killed at its limit (SIGTERM, then SIGKILL 30 s later: too soon to write a checkpoint of
a 30B model), and a paper run takes longer than one job may (the paper presets' 300 steps: an
estimated 60-100 h against 72 h jobs; docs/cluster.md). ``TimeLimit`` knows the job's deadline (its
wall-clock limit, given by ``rspo train --time-limit-min``, less a margin) and the longest step and
checkpoint save seen so far; before each step the trainer asks ``must_stop()``: when the next step
and the save after it would not end before the deadline, it saves a checkpoint and returns, and
``rspo train`` exits with ``EXIT_TIME_LIMIT`` (75, sysexits' EX_TEMPFAIL: "try again"). The train
rule resubmits such a job (Snakemake's ``retries``), and the new job resumes from the checkpoint.
A signal asks for the same (``watch(signal)``, SIGUSR1 sent by hand to a rank's process). SLURM's
``--signal=USR1@<seconds>`` is not used: it reaches every process of the job step, and torchrun's agent
and Snakemake's job step have no handler for it (they would die). Under torchrun the ranks decide
together (one rank's deadline or signal stops all of them at the same step boundary): ``must_stop`` is
a collective.

The deadline is counted from the job's start, not from the first step (``TimeLimit.for_job``,
``job_deadline``): reading the weights, verifying and reading a checkpoint, compiling and capturing
graphs all come out of the job's limit. Where SLURM exports the job's end time
(``SLURM_JOB_END_TIME``, SLURM 23.02 and later) the deadline is that less the margin; else its start
time (``SLURM_JOB_START_TIME``) plus the limit; else the start of the job's process (under torchrun,
the launcher that started the ranks) plus the limit. ``rspo train`` prints the start-up time.
SLURM's job-step plugin passes only a few ``SLURM_*`` variables to the inner ``srun``, and a stale
variable can be inherited: an end time in the past or beyond now + the job's limit, or a start time in
the future, is ignored with a one-line warning naming it, and the next source is used (a start time
more than the limit ago is kept: a start-up that used the whole limit still makes its one step).
"""

from __future__ import annotations

import logging
import os
import signal
import time

log = logging.getLogger(__name__)

EXIT_TIME_LIMIT = 75  # sysexits.h EX_TEMPFAIL


def job_process_start() -> float:
    """Wall-clock second at which this job's process started: under torchrun the launcher's (this
    rank's parent), else this process's."""
    import psutil

    me = psutil.Process()
    parent = me.parent() if "TORCHELASTIC_RUN_ID" in os.environ else None
    return (parent or me).create_time()


def job_deadline(limit_s: float, margin_s: float, env=None, now: float | None = None) -> tuple[float | None, str]:
    """(wall-clock deadline, what it was counted from) of a job with a limit of ``limit_s`` seconds
    (0: none) and ``margin_s`` kept free at the end (module docstring)."""
    env = os.environ if env is None else env
    now = time.time() if now is None else now
    if limit_s <= 0:
        return None, ""
    end, start = env.get("SLURM_JOB_END_TIME", ""), env.get("SLURM_JOB_START_TIME", "")
    if str(end).isdigit():
        if now < float(end) <= now + limit_s:
            return float(end) - margin_s, "SLURM's end time of the job"
        where = "in the past" if float(end) <= now else "beyond now + the job's limit"
        log.warning("SLURM_JOB_END_TIME=%s is %s (now %d, limit %d s); ignored", end, where, now, limit_s)
    if str(start).isdigit():
        if float(start) <= now:  # a start up to and past the limit ago is a slow start-up: its one step
            return float(start) + limit_s - margin_s, "SLURM's start time of the job"
        log.warning("SLURM_JOB_START_TIME=%s is in the future (now %d); ignored", start, now)
    return job_process_start() + limit_s - margin_s, "the start of the job's process"


class TimeLimit:
    def __init__(self, dist, limit_s: float = 0.0, margin_s: float = 0.0) -> None:
        """A deadline ``limit_s`` - ``margin_s`` from now (``for_job``: from the job's start)."""
        self.dist = dist
        self.deadline = time.monotonic() + limit_s - margin_s if limit_s > 0 else None
        self.counted_from = "now"
        self.requested = False
        self.watching = False
        self.step_s = 0.0  # the longest step so far (rollout, updates, sync, validation)
        self.save_s = 0.0  # the longest checkpoint save so far

    @classmethod
    def for_job(cls, dist, limit_s: float, margin_s: float, env=None) -> TimeLimit:
        """The deadline of the job this process runs in, counted from the job's start (``job_deadline``)."""
        tl = cls(dist)
        wall, tl.counted_from = job_deadline(limit_s, margin_s, env)
        if wall is not None:
            tl.deadline = time.monotonic() + (wall - time.time())
        return tl

    def remaining_s(self) -> float | None:
        """Seconds to the deadline (None without one)."""
        return None if self.deadline is None else self.deadline - time.monotonic()

    @property
    def active(self) -> bool:
        return self.deadline is not None or self.watching

    def watch(self, signum: int = signal.SIGUSR1) -> None:
        """Stop at the next step boundary when ``signum`` arrives."""

        def handler(_signum, _frame) -> None:
            self.requested = True

        signal.signal(signum, handler)
        self.watching = True

    def record_step(self, seconds: float) -> None:
        self.step_s = max(self.step_s, seconds)

    def record_save(self, seconds: float) -> None:
        self.save_s = max(self.save_s, seconds)

    def must_stop(self) -> bool:
        """Whether to stop before the next step (every rank calls this when any deadline or signal is
        watched: the answer is the same on all of them). A save not yet seen is assumed to take a step."""
        if not self.active:
            return False
        late = (
            self.deadline is not None and time.monotonic() + self.step_s + max(self.save_s, self.step_s) > self.deadline
        )
        return self.dist.any(self.requested or late)
