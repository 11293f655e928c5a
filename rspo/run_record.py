"""One record of a run, read once, and the study's words for a run, each defined once.

A run folder (``runs/<run>/`` of `rspo train`, a trial's run of `rspo sweep`, an archive's unpacked
run) holds ``run.json`` (its identity), ``config.json`` (the resolved config), ``final.json`` (the
result: steps, the collapse detector's verdict, the time account) and ``metrics.jsonl`` (one JSON
object per logged step; a later line wins, key by key, for a repeated step; step 0 carries the
validation before the first update). ``RunRecord.open(folder)`` reads them, ``metrics.jsonl`` once
(through rspo.jsonl), and every reader (rspo.report, rspo.bench, rspo.mlflow_sync, rspo.sweep, the
regime gates, the scripts) takes its numbers from it. ``Steps.parse`` reads a metrics file alone,
``Steps.from_lines`` lines already read (an archive member).

The metric names below are the ones the writers log (rspo.losses, rspo.train.step_metrics); they
import these constants, so a name is spelled in one place.

The study's facts about a run, each defined here and nowhere else:

- **collapsed** and its **onset**: the collapse detector's verdict and first step (rspo.train.collapse,
  recorded in final.json); ``onset`` is None for a run that never collapsed.
- **RS acts**: over the steps read (all of them, the steps before a collapse, or those after a change),
  the mean per-step router-shift ratio γ is at most ``RS_ACTIVE_GAMMA`` (the weight moves the ratio by
  1% on average) or at least ``RS_ACTIVE_UNDER`` of response tokens sit under γmin (``rs_acts``). Fixed
  on 2026-11-28 from the weight statistics alone (no outcome): the shipped natural and mismatch RS runs
  have 0.9985-0.9987 and at most 0.18%, the stress runs 0.975-0.984 and 4-14%.
- **learned**: the mean training reward of a window minus that of the first ``FIRST_STEPS`` steps
  (``learn_gain``) reaches ``learn_bar``: the one-sided 95% point of that difference for a flat series
  whose per-step SD is ``NOISE_SD`` (the largest measured over the shipped natural-regime non-RS runs),
  so a run that does not learn passes with probability at most 5% (a mean over ``seeds`` runs: the bar
  divided by sqrt(seeds), the same 5%); rounded up to 0.001.
- **late reward**: the mean training reward over the last third of the run's steps (``late_window``).
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from rspo.jsonl import iter_jsonl, iter_jsonl_lines, read_json

# ---------------------------------------------------------------------------- metric names (the writers import these)

REWARD = "critic/score/mean"
"""Mean training reward of a step's rollouts (at the rollout temperature)."""
GAMMA = "router/shift_ratio_mean"
"""Mean router-shift ratio γ over response tokens (before the floor)."""
GAMMA_UNDER = "router/shift_clipfrac"
"""Share of response tokens with γ under γmin."""
PPO_KL = "actor/ppo_kl"
PG_CLIPFRAC = "actor/pg_clipfrac"
PG_LOSS = "actor/pg_loss"
ROUTING_AGREEMENT = "rollout_corr/routing_agreement"
MISMATCH_KL = "rollout_corr/k3_kl"
ROUTER_LR_MULT = "actor/router_lr_mult"
STEP_S = "perf/step_s"


def val_score(split: str = "val") -> str:
    """The greedy held-out score of a validation split (logged at step 0 and every ``val_every``)."""
    return f"val/{split}/score"


# ---------------------------------------------------------------------------- the study's words for a run

FIRST_STEPS = 10
"""The first reward: the mean of the first 10 logged training steps."""
LATE_FRACTION = 1 / 3
"""The late reward: the mean over the last third of the steps."""
RS_ACTIVE_GAMMA, RS_ACTIVE_UNDER = 0.99, 0.01
NOISE_SD = 0.0749
"""The largest per-step training-reward SD of the 15 shipped natural-regime non-RS runs (each run's
SD of first differences / sqrt 2), the noise a learn test is calibrated on."""
Z_ONE_SIDED = 1.645
"""The one-sided 95% normal point: a flat series passes the learn test with probability 5%."""


def onset(final: dict[str, Any]) -> int | None:
    """The collapse step recorded in a final.json (or a trial record's run), None where it never collapsed."""
    step = final.get("collapse_step")
    return int(step) if final.get("collapsed") and step is not None else None


def rs_acts(gamma: float, under: float) -> bool:
    """Whether router-shift weighting acts on steps whose mean γ and share under γmin are these."""
    return gamma <= RS_ACTIVE_GAMMA or under >= RS_ACTIVE_UNDER


def learn_bar(window: int, seeds: int = 1, first: int = FIRST_STEPS) -> float:
    """The least ``learn_gain`` (reward fraction) that says a run learned: a flat series of per-step SD
    NOISE_SD reaches it with probability 5% (the mean of ``seeds`` such gains likewise)."""
    bar = Z_ONE_SIDED * NOISE_SD * math.sqrt(1 / window + 1 / first) / math.sqrt(seeds)
    return math.ceil(round(bar * 1000, 9)) / 1000


def learn_gain(reward: Sequence[float], window: Sequence[float]) -> float:
    """Mean of ``window`` (per-step training rewards) minus the mean of the run's first FIRST_STEPS."""
    return statistics.fmean(window) - statistics.fmean(reward[:FIRST_STEPS])


def learned(reward: Sequence[float], window: Sequence[float]) -> bool:
    return learn_gain(reward, window) >= learn_bar(len(window))


def late_window(values: Sequence[float]) -> list[float]:
    """The last third of a run's per-step values (at least one)."""
    return list(values[-max(1, round(len(values) * LATE_FRACTION)) :])


def noise_sd(values: Sequence[float]) -> float:
    """A per-step series' noise: SD of its first differences / sqrt 2 (a trend cancels out)."""
    diffs = [b - a for a, b in zip(values[:-1], values[1:])]
    return statistics.stdev(diffs) / math.sqrt(2)


# ---------------------------------------------------------------------------- per-step metrics


class Steps:
    """A run's per-step metrics: {step: {key: value}} with a later line winning key by key. Read-only:
    ``Steps.parse`` hands the same object to every reader of a file's version."""

    def __init__(self, rows: dict[int, dict[str, Any]], source: str) -> None:
        self.rows = dict(sorted(rows.items()))
        self.source = source

    @classmethod
    def from_lines(cls, lines: Iterable[tuple[int, dict[str, Any]]], source: str) -> Steps:
        rows: dict[int, dict[str, Any]] = {}
        for i, rec in lines:
            step = rec.get("step")
            if isinstance(step, bool) or not isinstance(step, int):
                raise ValueError(f"{source}:{i}: every line needs an integer 'step', got {step!r}")
            rows.setdefault(step, {}).update((k, v) for k, v in rec.items() if k != "step")
        return cls(rows, source)

    @classmethod
    def parse(cls, path: str | Path) -> Steps:
        path = Path(path)
        stat = path.stat() if path.is_file() else None
        return _parse(path, stat.st_mtime_ns if stat else 0, stat.st_size if stat else 0)

    @classmethod
    def from_text(cls, text: str, source: str) -> Steps:
        return cls.from_lines(iter_jsonl_lines(text.splitlines(), source), source)

    def series(self, key: str, *, after: int = 0, until: int | None = None) -> tuple[list[int], list[float]]:
        """(steps, values) of a finite numeric metric on steps > ``after`` (>= 1) and < ``until``."""
        steps, values = [], []
        for step, row in self.rows.items():
            v = row.get(key)
            if step > after and (until is None or step < until) and is_number(v) and math.isfinite(v):
                steps.append(step)
                values.append(float(v))
        return steps, values

    def values(self, key: str, **window: int | None) -> list[float]:
        return self.series(key, **window)[1]

    def at(self, key: str) -> dict[int, float]:
        """{step: value} of a metric on every step that logs it (step 0's validation included)."""
        return {s: float(r[key]) for s, r in self.rows.items() if is_number(r.get(key))}

    def rs_activity(self, *, after: int = 0, until: int | None = None) -> tuple[float, float]:
        """(mean γ, mean share under γmin) over the steps read (nan where none logs them)."""
        gamma, under = self.values(GAMMA, after=after, until=until), self.values(GAMMA_UNDER, after=after, until=until)
        return (statistics.fmean(gamma) if gamma else math.nan, statistics.fmean(under) if under else math.nan)


def is_number(v: Any) -> bool:
    """A metric value: an int or float, not a bool."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


@functools.lru_cache(maxsize=256)
def _parse(path: Path, mtime_ns: int, size: int) -> Steps:
    """One parse per version of a metrics file (a report reads each run for several measures)."""
    return Steps.from_lines(iter_jsonl(path), str(path))


# ---------------------------------------------------------------------------- a run folder

RUN_FILES = ("metrics.jsonl", "config.json", "run.json", "final.json")
"""What a finished run folder holds (and a run archive keeps of each run)."""


class RunRecord:
    """What one run folder holds; ``steps`` parses metrics.jsonl on first use, once."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.name = self.folder.name

    @classmethod
    def open(cls, folder: str | Path) -> RunRecord:
        folder = Path(folder)
        if not folder.is_dir():
            raise FileNotFoundError(f"no run folder {folder}")
        return cls(folder)

    def _json(self, name: str, required: bool = True) -> dict[str, Any]:
        path = self.folder / name
        if not path.is_file():
            if required:
                raise FileNotFoundError(f"{path}: missing (the run has not finished, or the folder is not a run)")
            return {}
        return read_json(path)

    @functools.cached_property
    def identity(self) -> dict[str, Any]:
        """run.json: the run's name, fingerprint, preset, method and seed (`rspo train` writes it first)."""
        return self._json("run.json")

    @functools.cached_property
    def config(self) -> dict[str, Any]:
        """config.json, the resolved config ({} where the folder has none)."""
        return self._json("config.json", required=False)

    @functools.cached_property
    def final(self) -> dict[str, Any]:
        return self._json("final.json")

    @property
    def finished(self) -> bool:
        return (self.folder / "final.json").is_file()

    @property
    def steps(self) -> Steps:
        return Steps.parse(self.metrics_path)

    @property
    def metrics_path(self) -> Path:
        return self.folder / "metrics.jsonl"

    @property
    def collapsed(self) -> bool:
        return bool(self.final.get("collapsed"))

    @property
    def onset(self) -> int | None:
        return onset(self.final)

    @property
    def n_steps(self) -> int:
        return int(self.final["steps"])

    @property
    def time_account(self) -> dict[str, float] | None:
        return self.final.get("time_account") or None

    @property
    def collapse_window(self) -> int | None:
        """The collapse detector's window in this run's config (None where the config does not say)."""
        value = (self.config.get("tracking") or {}).get("collapse_window")
        return None if value is None else int(value)

    def evaluation(self, eval_dir: str | Path, family: str) -> dict[str, Any]:
        """The run's evaluation on one benchmark family (``<eval_dir>/<run>/<family>.json``)."""
        path = Path(eval_dir) / self.name / f"{family}.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: missing (evaluate the run first)")
        return read_json(path)
