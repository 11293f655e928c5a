"""The verdict rule of the claims table (rspo.report.claims; docs/verdicts.md).

Fixed before the runs it judges, in this order:

1. **not testable** (with the reason) when the comparison cannot speak: the claim's precondition
   fails (a Sec. 3.3 claim where GRPO's smallest per-step mean γ stays above 0.95 and under 2% of
   tokens ever fall below γmin, so there is no drift to observe; a "stabilises" claim whose
   control neither collapses nor learns, so there is nothing to stabilise), both arms are
   saturated (their mean level within 1 point of 0% or 100%), or a run's measure is undefined (a
   flat series has no volatility; a run that collapsed within 10 steps has no trend before it).
2. The interval: Student's t over seeds with the SD floored at the noise of one paired
   difference (accuracy: the McNemar SD of the two checkpoints' per-problem scores; training
   reward and trends: a within-run block bootstrap), so equal differences never give a zero-width
   interval (rspo.report.inference).
3. **supported** when the interval excludes zero AND the effect reaches the claim's margin (the
   smallest effect that would matter); **positive but immaterial** when it excludes zero and the
   effect is below the margin; **contradicted** when the interval lies wholly below zero (the
   opposite of the claim); **not supported** when it lies wholly below the margin (a material
   effect in the claimed direction is excluded); **inconclusive** otherwise (also n < 2).
4. A row with fewer than ``MIN_SEEDS`` seeds is **provisional**: the power analysis of the earlier
   3-seed study put the primary outcome's smallest detectable effect below its margin only from 5
   seeds (docs/small_study.md), so fewer seeds cannot support anything on their own.
5. One **primary** row per claim, named here before any run (``PRIMARY``): its measure and regime.
   The primary rows are one family: a primary row is supported or positive only if its one-sided
   p-value (effect > 0) stays below 2.5% after Holm's correction across the family. Every other
   row is **exploratory**.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace

from rspo.report import measures as m
from rspo.report.inference import LEVEL, Estimate, holm, interval, mde, p_above_zero

SUPPORTED, IMMATERIAL, CONTRADICTED = "supported", "positive but immaterial", "contradicted"
NOT_SUPPORTED, INCONCLUSIVE, NOT_TESTABLE = "not supported", "inconclusive", "not testable"
PROVISIONAL = "provisional"
MIN_SEEDS = 5
LEARNS = 1.0
"""A control "learns" when its training reward over the last third of its steps exceeds that of its
first 10 steps by at least this many points (the training reward's margin), mean over seeds."""
DRIFT_GAMMA, DRIFT_CLIP = 0.95, 0.02
"""Sec. 3.3's precondition: GRPO's smallest per-step mean γ at most this, or this share of tokens under γmin."""
RULE = (
    "Verdict rule (docs/verdicts.md): not testable when the claim's precondition fails, both arms are "
    "saturated or a measure is undefined; otherwise a 95% t interval over seeds of the paired differences "
    "(treatment - control, same seed), its SD floored at the noise of one difference (accuracy: McNemar; "
    "reward and trends: within-run block bootstrap). Supported: the interval excludes 0 and the effect "
    "reaches the margin; positive but immaterial: excludes 0, effect below the margin; contradicted: wholly "
    "below 0; not supported: wholly below the margin; inconclusive otherwise. Provisional: fewer than "
    f"{MIN_SEEDS} seeds. MDE: the smallest true effect the row's n and SD detect with 80% power. Primary rows "
    "(one per claim, fixed before the runs) are Holm-corrected as one family; the rest are exploratory."
)


@dataclass(frozen=True)
class Claim:
    key: str
    text: str
    """The paper's claim, in one line."""
    paper: str
    """Where the paper makes it."""
    measure: str
    treatment: str
    """Method (run name without its seed) expected to have the higher measure (``sign`` -1: lower)."""
    control: str
    margin: float
    sign: int = 1
    threshold: float = 0.0
    """throughput only: effect = ratio - threshold."""
    precondition: str = ""
    """"stabilises": the control must collapse or learn; "drift": GRPO's γ must depart from 1."""


# ---------------------------------------------------------------------------- the rule


def verdict(est: Estimate, margin: float) -> str:
    """Steps 3 of the module docstring's rule: the claimed effect is > 0; ``margin`` >= 0."""
    if margin < 0:
        raise ValueError(f"margin must be >= 0, got {margin}")
    if math.isnan(est.low) or math.isnan(est.high):
        return INCONCLUSIVE
    if est.low > 0:
        return SUPPORTED if est.mean >= margin else IMMATERIAL
    if est.high < 0:
        return CONTRADICTED
    if est.high < margin:
        return NOT_SUPPORTED
    return INCONCLUSIVE


@dataclass(frozen=True)
class Row:
    claim: Claim
    regime: str
    est: Estimate
    verdict: str
    why: str = ""
    """Why the verdict is what it is where the word alone would mislead (not testable; a primary row
    that Holm's correction left inconclusive)."""
    primary: bool = False
    p_holm: float = math.nan
    seeds: bool = True
    """n counts seeds (the benchmark row's n counts steps)."""

    @property
    def mean(self) -> float:
        return self.est.mean

    @property
    def n(self) -> int:
        return self.est.n

    @property
    def mde(self) -> float:
        return mde(self.est.sd, self.est.n)

    @property
    def provisional(self) -> bool:
        return self.seeds and self.verdict != NOT_TESTABLE and self.n < MIN_SEEDS

    @property
    def verdict_text(self) -> str:
        text = self.verdict + (f": {self.why}" if self.why else "")
        return text + (f" ({PROVISIONAL}: n < {MIN_SEEDS})" if self.provisional else "")


def not_testable(claim: Claim, regime: str, why: str, n: int = 0) -> Row:
    return Row(claim, regime, Estimate(math.nan, math.nan, math.nan, n, math.nan, math.nan, 0.0), NOT_TESTABLE, why)


def judge(claim: Claim, regime: str, diffs: list[float], floor: float, seeds: bool = True) -> Row:
    """The interval (SD floored at ``floor``) and the verdict of one row's paired differences."""
    est = interval(diffs, floor)
    if est.n >= 2 and math.isnan(est.low):  # no spread and no floor: a degenerate interval is no interval
        return not_testable(claim, regime, "equal differences with no noise estimate", est.n)
    return Row(claim, regime, est, verdict(est, claim.margin), seeds=seeds)


def precondition_fails(claim: Claim, facts: dict[str, dict[int, m.RunFacts]], grpo: dict[int, m.RunFacts]) -> str:
    """Why the claim cannot be tested in this regime ("" when it can)."""
    if claim.precondition == "drift":
        if not grpo:
            return "no GRPO runs to read the router drift from"
        low = min(f.min_gamma for f in grpo.values())
        clip = max(f.max_gamma_clip for f in grpo.values())
        if low > DRIFT_GAMMA and clip < DRIFT_CLIP:
            return (
                f"no router drift to observe (GRPO's smallest mean γ {low:.3f} > {DRIFT_GAMMA}, "
                f"at most {100 * clip:.2f}% of tokens under γmin)"
            )
    if claim.precondition == "stabilises":
        control = facts.get(claim.control, {})
        if control and not any(f.collapsed for f in control.values()):
            gain = statistics.fmean(f.reward_late - f.reward_first for f in control.values())
            if gain < LEARNS:
                return f"the control neither collapses nor learns (training reward {gain:+.1f} pts)"
    return ""


def saturated(values: dict[str, dict[int, m.Measured]]) -> str:
    """Why the arms cannot separate ("" when they can): both mean levels at the floor or the ceiling."""
    levels = []
    for runs in values.values():
        lv = [x.level for x in runs.values() if x.level is not None]
        if not lv:
            return ""
        levels.append(statistics.fmean(lv))
    if all(v <= m.SATURATED for v in levels):
        return "both arms at the floor (" + " and ".join(f"{v:.1f}%" for v in levels) + ")"
    if all(v >= 100 - m.SATURATED for v in levels):
        return "both arms at the ceiling (" + " and ".join(f"{v:.1f}%" for v in levels) + ")"
    return ""


def paired_row(
    claim: Claim,
    regime: str,
    values: dict[str, dict[int, m.Measured]],
    facts: dict[str, dict[int, m.RunFacts]] | None = None,
    grpo: dict[int, m.RunFacts] | None = None,
) -> Row:
    """One row from method -> {seed: Measured} (and the runs' facts for the preconditions)."""
    why = precondition_fails(claim, facts or {}, grpo or {})
    if why:
        return not_testable(claim, regime, why)
    seeds = sorted(set.intersection(*(set(v) for v in values.values()))) if values else []
    undefined = [
        f"{method} s{s}: {values[method][s].why}" for method in values for s in seeds if not values[method][s].defined
    ]
    if undefined:
        return not_testable(claim, regime, "undefined measure (" + "; ".join(undefined[:2]) + ")", len(seeds))
    why = saturated({k: {s: v[s] for s in seeds} for k, v in values.items()})
    if why:
        return not_testable(claim, regime, why, len(seeds))
    if not claim.control:
        runs = values[claim.treatment]
        diffs = [claim.sign * runs[s].value for s in seeds]
        noise = [runs[s].noise for s in seeds]
    else:
        t, c = values[claim.treatment], values[claim.control]
        diffs = [claim.sign * (t[s].value - c[s].value) for s in seeds]
        noise = [m.pair_noise(claim.measure, t[s], c[s]) for s in seeds]
    finite = [x for x in noise if math.isfinite(x)]
    floor = math.sqrt(statistics.fmean(x * x for x in finite)) if finite else 0.0
    return judge(claim, regime, diffs, floor)


def apply_holm(rows: list[Row], primary: set[int]) -> list[Row]:
    """Mark the primary rows (indices into ``rows``) and correct them as one family (Holm, one-sided):
    a primary row stays supported or positive only below 2.5% after the correction."""
    adjusted = holm({str(i): p_above_zero(rows[i].est) for i in primary if rows[i].verdict != NOT_TESTABLE})
    out = []
    for i, r in enumerate(rows):
        if i not in primary:
            out.append(r)
            continue
        p = adjusted.get(str(i), math.nan)
        if r.verdict in (SUPPORTED, IMMATERIAL) and not p < (1 - LEVEL) / 2:
            why = f"its interval excludes 0, but not after Holm's correction across the primary rows (p {p:.3f})"
            r = replace(r, verdict=INCONCLUSIVE, why=why)
        out.append(replace(r, primary=True, p_holm=p))
    return out
