"""The statistics behind the claims table (rspo.report.claims): an interval over seeds whose spread
is never below the measurement's own noise, the smallest effect a design can detect, one-sided
p-values with Holm's correction, and the noise estimates themselves.

- ``interval``: Student's t over the seeds' paired differences, with the standard deviation
  floored at the noise of one difference (``floor``). Three seeds whose differences happen to be
  equal would otherwise give a zero-width interval (a sample SD of 0), which reads as certainty
  where each difference still carries its evaluation's noise.
- ``mde``: the smallest true effect a two-sided 5% t-test on n paired differences of SD ``sd``
  detects with 80% power (noncentral t).
- ``p_above_zero`` / ``holm``: the one-sided p-value of "the effect is > 0" and Holm's step-down
  adjustment across a family of such tests (the table's primary rows).
- ``mcnemar_sd``: the SD of one paired accuracy difference from evaluation noise alone: two
  checkpoints scored on the same N problems differ on b + c problems (b solved only by the first,
  c only by the second); the difference (b - c) / N has variance (b + c - (b - c)^2 / N) / N^2.
- ``block_bootstrap_sd``: a within-run noise estimate for a statistic of a per-step series
  (moving-block bootstrap; consecutive training steps are correlated, so blocks of steps are
  resampled, never single steps). Its random stream is fixed, so tables rebuild byte for byte.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

LEVEL = 0.95
POWER = 0.80
BLOCK = 5
"""Steps per bootstrap block (the collapse detector's window: steps closer than this move together)."""
REPS = 400
"""Bootstrap resamples per estimate."""


@dataclass(frozen=True)
class Estimate:
    """A mean over n paired differences and its interval."""

    mean: float
    low: float
    high: float
    n: int
    sd: float
    """The SD the interval used: the sample SD of the differences, or the floor where that is larger."""
    sample_sd: float
    floor: float

    @property
    def floored(self) -> bool:
        return self.n >= 2 and self.floor > self.sample_sd


def interval(diffs: Sequence[float], floor: float = 0.0, level: float = LEVEL) -> Estimate:
    """Student's t interval of the mean of ``diffs`` with the SD floored at ``floor`` (nan bounds when
    n < 2 or when the SD is 0 with no floor: a degenerate interval is no interval)."""
    n = len(diffs)
    if n == 0:
        return Estimate(math.nan, math.nan, math.nan, 0, math.nan, math.nan, floor)
    mean = statistics.fmean(diffs)
    sample = statistics.stdev(diffs) if n > 1 else math.nan
    sd = max(sample, floor) if n > 1 else math.nan
    if n < 2 or not sd > 0:
        return Estimate(mean, math.nan, math.nan, n, sd, sample, floor)
    from scipy import stats

    half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n)
    return Estimate(mean, mean - half, mean + half, n, sd, sample, floor)


def mde(sd: float, n: int, level: float = LEVEL, power: float = POWER) -> float:
    """Smallest true mean difference a two-sided t-test (1 - ``level``) on ``n`` paired differences of
    SD ``sd`` detects with probability ``power`` (noncentral t; nan when n < 2 or sd is not > 0)."""
    if n < 2 or not sd > 0 or math.isnan(sd):
        return math.nan
    from scipy import stats

    df, se = n - 1, sd / math.sqrt(n)
    crit = float(stats.t.ppf(0.5 + level / 2, df))

    def achieved(effect: float) -> float:
        nc = effect / se
        return float(1 - stats.nct.cdf(crit, df, nc) + stats.nct.cdf(-crit, df, nc))

    lo, hi = 0.0, se
    while achieved(hi) < power:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if achieved(mid) < power else (lo, mid)
    return hi


def p_above_zero(est: Estimate) -> float:
    """One-sided p-value of H0 "effect <= 0" from the same t statistic as the interval (nan without one)."""
    if math.isnan(est.low):
        return math.nan
    from scipy import stats

    return float(stats.t.sf(est.mean / (est.sd / math.sqrt(est.n)), est.n - 1))


def holm(pvalues: dict[str, float]) -> dict[str, float]:
    """Holm's step-down adjusted p-values (nan stays nan and is not counted in the family)."""
    ranked = sorted((p, k) for k, p in pvalues.items() if not math.isnan(p))
    m, out, running = len(ranked), {k: math.nan for k in pvalues}, 0.0
    for i, (p, k) in enumerate(ranked):
        running = max(running, min(1.0, (m - i) * p))
        out[k] = running
    return out


def mcnemar_sd(a: Sequence[float], b: Sequence[float]) -> float:
    """SD (points) of the paired accuracy difference of two checkpoints scored 0/1 on the same problems."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired scores need the same problems: {len(a)} vs {len(b)}")
    n = len(a)
    only_a = sum(1 for x, y in zip(a, b) if x > y)
    only_b = sum(1 for x, y in zip(a, b) if y > x)
    var = (only_a + only_b - (only_a - only_b) ** 2 / n) / n**2
    return 100.0 * math.sqrt(max(var, 0.0))


def block_bootstrap_sd(
    n_steps: int, stat: Callable[[list[int]], float], block: int = BLOCK, reps: int = REPS, seed: int = 0
) -> float:
    """SD over moving-block bootstrap resamples of ``stat(indices)``: ``indices`` are step positions
    0..n_steps-1 drawn in blocks of ``block`` consecutive positions (sorted, so order-sensitive
    statistics keep time order); resamples where ``stat`` is not finite are skipped."""
    import numpy as np

    if n_steps < 2 * block:
        return math.nan
    rng = np.random.default_rng(seed)
    starts = n_steps - block + 1
    k = math.ceil(n_steps / block)
    values = []
    for _ in range(reps):
        idx = (rng.integers(0, starts, size=k)[:, None] + np.arange(block)[None, :]).ravel()[:n_steps]
        v = stat(sorted(int(i) for i in idx))
        if math.isfinite(v):
            values.append(v)
    return statistics.stdev(values) if len(values) > 1 else math.nan
