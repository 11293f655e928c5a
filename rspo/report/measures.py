"""What the claims table measures in one run (rspo.report.claims compares two methods' runs).

Each measure returns a ``Measured``: the value, its within-run noise (the SD that evaluating or
logging alone puts on it, which floors the spread of the claims' intervals), the run's level where
a floor or ceiling can saturate the comparison, and, where the value is undefined, why (never a
sentinel number).

Outcomes (points are percentages):

- ``reward``: mean training reward (``critic/score/mean``, sampled at the rollout temperature) over
  the last third of the run's steps: the outcome the paper plots for Countdown (Fig. 1). Noise: the
  block jackknife of that mean (batch means of 5 steps; rspo.report.inference).
- ``reward_drop``: how far the run fell from its own best: the best minus the last of its
  consecutive ``DROP_WINDOW``-step means of the training reward. Noise: the block jackknife of the
  drop (a pair of same-seed runs: of the difference of their drops, step by step).
- ``acc``: greedy accuracy of the final checkpoint on the preset's held-out splits pooled (problems
  weighted equally; eval/<run>/countdown.json, whose per-problem ``scores`` pair two runs for the
  McNemar noise of a difference). Noise of one run: binomial.
- ``steps``: the collapse detector's onset step, or the run's length when it never fired (censored).

Trends of Sec. 3.3 (Fig. 6), from per-step metrics, over the steps BEFORE the run collapsed (a
collapsed run's signals are those of a dead policy: a line through a collapse and what follows
reverses the sign) and undefined with fewer than ``MIN_TREND_STEPS``:

- ``gamma_fall``: minus the least-squares slope of ``router/shift_ratio_mean`` per 100 steps;
- ``gclip_rise``: the slope of ``router/shift_clipfrac`` (points per 100 steps);
- ``kl_vol_growth`` / ``clip_vol_growth``: log2 of sd(last fifth) / sd(first fifth) of
  ``actor/ppo_kl`` / ``actor/pg_clipfrac`` (each fifth at least 5 steps; undefined where a fifth is
  flat: a flat series has no volatility to compare);
- ``kl_vol``: log2 of the SD of per-step ``actor/ppo_kl`` (undefined for a flat series);
- ``agreement``: the mean over steps of ``rollout_corr/routing_agreement`` (points);
- ``mismatch_kl``: log2 of the mean over steps of ``rollout_corr/k3_kl`` (undefined where it is 0:
  an engine that equals the trainer).
Noise of a trend: the delete-one-block jackknife of the same statistic over the same steps (no
random numbers: rspo.report.inference).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from rspo.jsonl import read_json
from rspo.report.inference import block_jackknife_sd, mcnemar_sd
from rspo.run_record import (
    FIRST_STEPS,
    GAMMA,
    GAMMA_UNDER,
    MISMATCH_KL,
    PG_CLIPFRAC,
    PPO_KL,
    REWARD,
    ROUTING_AGREEMENT,
    RunRecord,
    Steps,
    late_window,
)

TREND_MEASURES = ("gamma_fall", "gclip_rise", "kl_vol_growth", "clip_vol_growth", "kl_vol", "agreement", "mismatch_kl")
OUTCOMES = ("reward", "reward_drop", "acc", "steps")
MIN_TREND_STEPS = 10
DROP_WINDOW = 10
SATURATED = 1.0
"""A level (points) within this of 0 or 100 is at the floor or the ceiling."""


class TooShortError(ValueError):
    """A run too short for the measure at all (the smoke preset's 2-step runs): its claim gets no row."""


@dataclass(frozen=True)
class Measured:
    value: float
    noise: float = math.nan
    level: float | None = None
    """The run's level (points) where the comparison can saturate (reward, accuracy), else None."""
    why: str = ""
    """Why ``value`` is nan."""
    samples: tuple[float, ...] = field(default=(), repr=False)
    """What the value is a statistic of, in an order two runs share (``pair_noise``): acc the
    per-problem scores in the evaluation's order; reward / reward_drop the per-step rewards (points)
    of the window(s) it reads, by step."""

    @property
    def defined(self) -> bool:
        return math.isfinite(self.value)


def undefined(why: str) -> Measured:
    return Measured(math.nan, why=why)


@dataclass(frozen=True)
class RunFacts:
    """What the preconditions of a claim read from one run."""

    collapsed: bool
    collapse_step: int | None
    steps: int
    reward_first: float
    """Mean training reward (points) of the first FIRST_STEPS steps (rspo.run_record)."""
    reward_late: float
    min_gamma: float
    """Smallest per-step mean router-shift ratio."""
    max_gamma_clip: float
    """Largest per-step share of tokens under gamma_min."""
    mean_gamma: float = math.nan
    """Mean over steps of the per-step mean router-shift ratio (how much RS weights, over the run)."""
    mean_gamma_clip: float = math.nan
    """Mean over steps of the share of response tokens under gamma_min (where RS's weight is floored)."""

    @property
    def late_steps(self) -> int:
        """How many steps the late reward averages (rspo.run_record.late_window: the last third)."""
        return len(late_window(range(self.steps)))


# ---------------------------------------------------------------------------- reading run files


def series(metrics_path: Path, key: str, until: int | None = None) -> tuple[list[float], list[float]]:
    """(steps, values) of a per-step training metric on steps >= 1 (and < ``until``) of a metrics.jsonl
    (rspo.run_record.Steps: the last line wins for a repeated step)."""
    steps, values = Steps.parse(metrics_path).series(key, until=until)
    return [float(x) for x in steps], values


def run_facts(run_dir: Path) -> RunFacts:
    record = RunRecord.open(run_dir)
    steps = record.steps
    reward, gamma, clip = steps.values(REWARD), steps.values(GAMMA), steps.values(GAMMA_UNDER)
    late = late_window(reward)
    mean_gamma, mean_clip = steps.rs_activity()
    return RunFacts(
        collapsed=record.collapsed,
        collapse_step=record.onset,
        steps=record.n_steps,
        reward_first=100 * statistics.fmean(reward[:FIRST_STEPS]) if reward else math.nan,
        reward_late=100 * statistics.fmean(late) if reward else math.nan,
        min_gamma=min(gamma) if gamma else math.nan,
        max_gamma_clip=max(clip) if clip else math.nan,
        mean_gamma=mean_gamma,
        mean_gamma_clip=mean_clip,
    )


# ---------------------------------------------------------------------------- outcomes


def pooled_accuracy(path: Path, splits: list[str]) -> Measured:
    """Accuracy (%) over the given splits of an eval countdown.json, problems weighted equally."""
    data = read_json(path)
    ok = n = 0.0
    scores: list[float] = []
    for s in splits:
        entry = (data.get("splits") or {}).get(s)
        if not entry:
            raise ValueError(f"{path}: no splits.{s}")
        ok += float(entry["accuracy"]) * int(entry["n"])
        n += int(entry["n"])
        scores += [float(x) for x in entry.get("scores") or []]
    p = ok / n
    value = 100.0 * p
    return Measured(value, 100.0 * math.sqrt(p * (1 - p) / n), level=value, samples=tuple(scores))


def late_reward(metrics_path: Path) -> Measured:
    _, values = series(metrics_path, REWARD)
    if len(values) < MIN_TREND_STEPS:
        raise TooShortError(f"{metrics_path}: {len(values)} training steps; the late reward needs {MIN_TREND_STEPS}")
    return _window_mean([100 * v for v in late_window(values)])


def _window_mean(window: list[float]) -> Measured:
    """The mean of a window of per-step values, its within-run noise the block jackknife, the steps kept
    as its samples (paired differences of same-seed runs: pair_noise)."""
    noise = block_jackknife_sd(len(window), lambda idx: statistics.fmean(window[i] for i in idx))
    value = statistics.fmean(window)
    return Measured(value, noise, level=value, samples=tuple(window))


def reward_over(metrics_path: Path, first: int, last: int) -> Measured:
    """Mean training reward (points) of steps ``first``..``last`` (the late reward's window of another
    run, measured on this one: the mismatch regime's cost to a control, rspo.report.claims)."""
    steps, values = series(metrics_path, REWARD)
    window = [100 * v for x, v in zip(steps, values) if first <= x <= last]
    if len(window) != last - first + 1:
        raise TooShortError(f"{metrics_path}: steps {first}-{last} are not all logged")
    return _window_mean(window)


def _drop_at(values: list[float], idx) -> float:
    """Best minus last of the consecutive DROP_WINDOW-step means of ``values`` (whole windows), each
    window's mean over the steps of ``idx`` in it (all of them: the drop itself; fewer: its jackknife)."""
    k = len(values) // DROP_WINDOW
    kept = [[values[i] for i in idx if i // DROP_WINDOW == w] for w in range(k)]
    means = [statistics.fmean(x) for x in reversed(kept) if x]
    return max(means) - means[0] if len(means) == k else math.nan


def drop_noise(a: list[float], b: list[float] | None = None) -> float:
    """The block jackknife of a drop (of ``a``) or of a pair's difference of drops (``a`` - ``b``, the
    same steps: same-seed runs share each step's prompts), blocks of 5 steps inside the windows."""
    if b is None:
        return block_jackknife_sd(len(a), lambda idx: _drop_at(a, idx))
    return block_jackknife_sd(len(a), lambda idx: _drop_at(a, idx) - _drop_at(b, idx))


def reward_drop(metrics_path: Path) -> Measured:
    """How far the training reward fell from its best DROP_WINDOW-step mean to its last (points)."""
    _, values = series(metrics_path, REWARD)
    k = len(values) // DROP_WINDOW
    if k < 2:
        raise TooShortError(f"{metrics_path}: {len(values)} training steps; a drop needs {2 * DROP_WINDOW}")
    windowed = [100 * v for v in values[len(values) - k * DROP_WINDOW :]]
    noise = drop_noise(windowed)
    return Measured(
        _drop_at(windowed, range(len(windowed))),
        noise,
        level=statistics.fmean(windowed[-DROP_WINDOW:]),
        samples=tuple(windowed),
    )


def steps_to_collapse(run_dir: Path) -> Measured:
    """The collapse detector's onset step, or the run's length when it never fired (censored)."""
    from rspo.config import TrackingConfig

    record = RunRecord.open(run_dir)
    value = float(record.onset if record.onset is not None else record.n_steps)
    window = float(record.collapse_window or TrackingConfig().collapse_window)
    return Measured(value, window / 2)  # a collapse is dated within the detector's window


# ---------------------------------------------------------------------------- trends


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys against xs (nan when xs are all equal)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx > 0 else math.nan


def log2_sd(values: list[float]) -> float:
    """log2 of the sample SD; nan for a flat series (no volatility to take a log of)."""
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return math.log2(sd) if sd > 0 else math.nan


def volatility_growth(values: list[float]) -> float:
    """log2 of sd(last fifth) / sd(first fifth) of a per-step series (each part >= 5 steps)."""
    k = max(5, len(values) // 5)
    return log2_sd(values[-k:]) - log2_sd(values[:k])


def _log2_mean(values: list[float]) -> float:
    mean = statistics.fmean(values)
    return math.log2(mean) if mean > 0 else math.nan


TRENDS = {
    # measure: (metric, statistic of (steps, values), why it can be undefined)
    "gamma_fall": (GAMMA, lambda x, y: -100.0 * slope(x, y), ""),
    "gclip_rise": (GAMMA_UNDER, lambda x, y: 100.0 * 100.0 * slope(x, y), ""),
    "kl_vol_growth": (PPO_KL, lambda x, y: volatility_growth(y), "a flat first or last fifth"),
    "clip_vol_growth": (PG_CLIPFRAC, lambda x, y: volatility_growth(y), "a flat first or last fifth"),
    "kl_vol": (PPO_KL, lambda x, y: log2_sd(y), "a flat series"),
    "agreement": (ROUTING_AGREEMENT, lambda x, y: 100.0 * statistics.fmean(y), ""),
    "mismatch_kl": (MISMATCH_KL, lambda x, y: _log2_mean(y), "a zero KL (engine equals trainer)"),
}


def trend_measure(measure: str, run_dir: Path) -> Measured:
    """A Sec. 3.3 trend of one run over the steps before its collapse onset (rspo.train.collapse)."""
    key, stat, why = TRENDS[measure]
    run_dir = Path(run_dir)
    record = RunRecord.open(run_dir)
    onset = record.onset if record.finished else None
    xs, ys = series(run_dir / "metrics.jsonl", key, until=onset)
    if len(xs) < MIN_TREND_STEPS:
        all_steps = len(series(run_dir / "metrics.jsonl", key)[0])
        if onset is None or all_steps < MIN_TREND_STEPS:
            raise TooShortError(
                f"{run_dir / 'metrics.jsonl'}: {key} is logged on {len(xs)} steps; a trend needs {MIN_TREND_STEPS}"
            )
        return undefined(f"collapsed at step {onset}, {len(xs)} steps before it; a trend needs {MIN_TREND_STEPS}")
    value = stat(xs, ys)
    if not math.isfinite(value):
        return undefined(why or "undefined")
    noise = block_jackknife_sd(len(xs), lambda idx: stat([xs[i] for i in idx], [ys[i] for i in idx]))
    return Measured(value, noise)


def pair_noise(measure: str, a: Measured, b: Measured) -> float:
    """SD of ``a.value - b.value`` from within-run noise alone, for two runs of the same seed. Where
    both carry aligned samples, the noise is that of the paired difference (same problems: McNemar;
    same steps, whose prompts same-seed runs share: the block jackknife of the mean per-step
    difference), which is far below the two runs' own noises combined; otherwise those combined."""
    if a.samples and len(a.samples) == len(b.samples):
        if measure == "acc":
            return mcnemar_sd(a.samples, b.samples)
        if measure == "reward":
            d = [x - y for x, y in zip(a.samples, b.samples)]
            return block_jackknife_sd(len(d), lambda idx: statistics.fmean(d[i] for i in idx))
        if measure == "reward_drop":
            return drop_noise(list(a.samples), list(b.samples))
    return math.hypot(a.noise, b.noise)


def run_measure(measure: str, run: str, *, eval_dir: Path, runs_dir: Path, splits: list[str]) -> Measured:
    if measure in TREND_MEASURES:
        return trend_measure(measure, Path(runs_dir) / run)
    if measure == "acc":
        return pooled_accuracy(Path(eval_dir) / run / "countdown.json", splits)
    if measure == "reward":
        return late_reward(Path(runs_dir) / run / "metrics.jsonl")
    if measure == "reward_drop":
        return reward_drop(Path(runs_dir) / run / "metrics.jsonl")
    if measure == "steps":
        return steps_to_collapse(Path(runs_dir) / run)
    raise ValueError(f"unknown measure {measure!r}")
