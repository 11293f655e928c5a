"""A training job that stops cleanly before its time limit, so that the next job resumes it.

A SLURM job is killed at its limit (SIGTERM, then SIGKILL 30 s later: too soon to write a checkpoint of
a 30B model), and a paper run takes longer than one job may (the paper presets' 300 steps: an
estimated 60-100 h against 72 h jobs; docs/cluster.md). ``TimeLimit`` knows the job's deadline (its
wall-clock limit, given by ``rspo train --time-limit-min``, less a margin) and the longest step and
checkpoint save seen so far; before each step the trainer asks ``must_stop()``: when the next step
and the save after it would not end before the deadline, it saves a checkpoint and returns, and
``rspo train`` exits with ``EXIT_TIME_LIMIT`` (75, sysexits' EX_TEMPFAIL: "try again"). The train
rule resubmits such a job (Snakemake's ``retries``), and the new job resumes from the checkpoint.
A signal asks for the same (``watch(signal)``, SIGUSR1: SLURM sends it ahead of the limit with
``--signal=USR1@<seconds>``). Under torchrun the ranks decide together (one rank's deadline or signal
stops all of them at the same step boundary): ``must_stop`` is a collective.
"""

from __future__ import annotations

import signal
import time

EXIT_TIME_LIMIT = 75  # sysexits.h EX_TEMPFAIL


class TimeLimit:
    def __init__(self, dist, limit_s: float = 0.0, margin_s: float = 0.0) -> None:
        self.dist = dist
        self.deadline = time.monotonic() + limit_s - margin_s if limit_s > 0 else None
        self.requested = False
        self.watching = False
        self.step_s = 0.0  # the longest step so far (rollout, updates, sync, validation)
        self.save_s = 0.0  # the longest checkpoint save so far

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
