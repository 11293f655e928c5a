"""The verdict rule of the claims table (rspo.report.claims; docs/verdicts.md).

Written on 2026-11-27 and revised on 2026-11-28 (issue 57), after the shipped 3-seed runs were
packed (2026-11-24 and -26): for those runs the table is a re-analysis under a rule written after
them; for any run made since, the rule was fixed before it. In this order:

1. **not testable** (with the reason) when the comparison cannot speak: the claim's precondition
   fails (a Sec. 3.3 claim where GRPO's smallest per-step mean γ stays above 0.95 and under 2% of
   tokens ever fall below γmin, so there is no drift to observe; a "stabilises" claim whose
   control neither collapses nor learns, so there is nothing to stabilise; a claim that RS changes
   an outcome where RS does not act: over the RS arm's runs the mean router-shift ratio γ stays
   above ``RS_ACTIVE_GAMMA`` and under ``RS_ACTIVE_UNDER`` of the tokens sit at γmin, so RS multiplies
   the ratio by about 1 and can change nothing), both arms are saturated (their mean level within 1
   point of 0% or 100%), or a run's measure is undefined (a flat series has no volatility; a run
   that collapsed within 10 steps has no trend before it). Where RS is inactive, what can be tested
   is that it is harmless: an **equivalence** row beside it (two one-sided tests, the 90% interval
   inside ±margin), exploratory.
2. The interval: Student's t over seeds with the SD floored at the noise of one paired
   difference (accuracy: the McNemar SD of the two checkpoints' per-problem scores; training
   reward and trends: a within-run block jackknife, no random numbers), so equal differences never
   give a zero-width interval (rspo.report.inference).
3. **supported** when the interval excludes zero AND the effect reaches the claim's margin (the
   smallest effect that would matter); **positive but immaterial** when it excludes zero and the
   effect is below the margin; **contradicted** when the interval lies wholly below zero (the
   opposite of the claim); **not supported** when it lies wholly below the margin (a material
   effect in the claimed direction is excluded); **inconclusive** otherwise (also n < 2).
4. A row with fewer than ``MIN_SEEDS`` seeds is **provisional** (docs/small_study.md's power
   analysis); a table built from fewer runs than its preset names is **interim**: every row says
   so and none carries a verdict.
5. One **primary** row per claim, named in its ``rspo.report.claim_registry`` entry: its measure and regime.
   The primary rows are one pre-registered family (all of them, built or not: a primary row that is
   missing or not testable counts with p = 1), Holm-corrected: a primary verdict stands only if the
   p-value of its own test stays below 2.5% after the correction, the test being superiority
   (effect > 0) for supported / positive but immaterial, non-superiority (effect < margin) for not
   supported and inferiority (effect < 0) for contradicted. Every other row is **exploratory**.
6. Implementation checks (true by construction, such as R3 replaying the engine's routing) are
   **checks**, outside the family, with no verdict on a claim.
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass, replace

from rspo.report import measures as m
from rspo.report.inference import LEVEL, Estimate, equivalent, holm, interval, p_above_zero, p_below, rule_mde
from rspo.run_record import RS_ACTIVE_GAMMA, RS_ACTIVE_UNDER, learn_bar, rs_acts

SUPPORTED, IMMATERIAL, CONTRADICTED = "supported", "positive but immaterial", "contradicted"
NOT_SUPPORTED, INCONCLUSIVE, NOT_TESTABLE = "not supported", "inconclusive", "not testable"
PROVISIONAL, INTERIM = "provisional", "interim"
NOT_REPRODUCED = "not reproduced"
"""The regime search measured the claim's effect and it appeared on none of the searched axes
(rspo.report.regime_search): stronger than not testable, about those axes only."""
MIN_SEEDS = 5
DRIFT_GAMMA, DRIFT_CLIP = 0.95, 0.02
"""Sec. 3.3's precondition: GRPO's smallest per-step mean γ at most this, or this share of tokens under γmin."""
RULE = (
    "Verdict rule (docs/verdicts.md; written after the shipped 3-seed runs, so for them a re-analysis): "
    "not testable when the claim's precondition fails (RS claims: RS must act, mean γ <= "
    f"{RS_ACTIVE_GAMMA} or >= {RS_ACTIVE_UNDER:.0%} of tokens at γmin), both arms are saturated, a measure "
    "is undefined, or the preset's regime search found no regime on its searched axes in which the claim "
    "can be tested (rspo/report/regime_search.py; 'not reproduced' where the search measured the claim's "
    "effect and it appeared on none of them); otherwise a 95% t interval over seeds of the paired "
    "differences (treatment - control, same seed), its SD floored at the noise of one difference "
    "(accuracy: McNemar; reward and trends: within-run block jackknife, no random numbers). Supported: "
    "the interval excludes 0 and the effect reaches the margin; positive but immaterial: excludes 0, "
    "effect below the margin; contradicted: wholly below 0; not supported: wholly below the margin; "
    f"inconclusive otherwise. Provisional: fewer than {MIN_SEEDS} seeds; interim: fewer runs than the "
    "preset names. MDE: the smallest true effect this rule calls supported with 80% probability at the "
    "printed n (its mean reaches the margin and its one-sided test passes, at the strictest Holm step of "
    "the primary family for a primary row), from the SD pooled over the rows of the same measure and "
    "regime; none for equivalence rows and checks. Primary rows are one pre-registered family, "
    "Holm-corrected whatever their verdict's direction (p: sup = effect > 0, non-sup = effect < margin, "
    "inf = effect < 0); equivalence rows (RS harmless where it does not act: 90% interval inside ±margin)"
    " and the rest are exploratory; checks hold by construction."
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
    rs: bool = False
    """The claim is that RS changes the outcome: testable only where RS acts (in the runs of its RS arm:
    the treatment, or the control where only it has RS)."""
    check: bool = False
    """An implementation check (true by construction), not a claim: no verdict, outside the family."""


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
    test: str = ""
    """The primary row's test: "sup" (effect > 0), "non-sup" (effect < margin), "inf" (effect < 0)."""
    seeds: bool = True
    """n counts seeds (the benchmark row's n counts steps of one process)."""
    kind: str = "verdict"
    """"verdict", "equivalence" (RS harmless where it does not act) or "check" (true by construction)."""
    mde_sd: float = math.nan
    """The SD the MDE assumes: pooled over the rows of this measure and regime (the row's own SD when unset)."""
    family: int = 1
    """The primary family's size for a primary row (the MDE takes Holm's strictest step), 1 otherwise."""
    interim: bool = False

    @property
    def mean(self) -> float:
        return self.est.mean

    @property
    def n(self) -> int:
        return self.est.n

    @property
    def mde(self) -> float:
        """The smallest true effect the rule calls supported with 80% probability (``rule_mde``; nan for
        equivalence rows and checks, which the rule does not call supported, and without an SD)."""
        sd = self.mde_sd if math.isfinite(self.mde_sd) else self.est.sd
        if self.kind != "verdict" or self.est.n < 2 or not sd > 0:
            return math.nan
        return _rule_mde(round(sd, 12), self.est.n, self.claim.margin, self.family)

    @property
    def provisional(self) -> bool:
        return self.seeds and self.verdict not in (NOT_TESTABLE, NOT_REPRODUCED) and self.n < MIN_SEEDS

    @property
    def verdict_text(self) -> str:
        if self.interim and self.verdict != NOT_TESTABLE:
            return INTERIM
        if self.kind == "check":
            return "check holds" if self.verdict == SUPPORTED else f"check: {self.verdict}"
        text = self.verdict + (f": {self.why}" if self.why else "")
        return text + (f" ({PROVISIONAL}: n < {MIN_SEEDS})" if self.provisional else "")


@functools.cache
def _rule_mde(sd: float, n: int, margin: float, family: int) -> float:
    """``rule_mde``, once per (SD, n, margin, family): the rows of one measure and regime share them."""
    return rule_mde(sd, n, margin, family)


def not_testable(claim: Claim, regime: str, why: str, n: int = 0) -> Row:
    return Row(claim, regime, Estimate(math.nan, math.nan, math.nan, n, math.nan, math.nan, 0.0), NOT_TESTABLE, why)


def judge(claim: Claim, regime: str, diffs: list[float], floor: float, seeds: bool = True) -> Row:
    """The interval (SD floored at ``floor``) and the verdict of one row's paired differences."""
    est = interval(diffs, floor)
    if est.n >= 2 and math.isnan(est.low):  # no spread and no floor: a degenerate interval is no interval
        return not_testable(claim, regime, "equal differences with no noise estimate", est.n)
    return Row(claim, regime, est, verdict(est, claim.margin), seeds=seeds)


def rs_activity(facts: dict[int, m.RunFacts]) -> tuple[float, float]:
    """(mean γ, share of tokens at γmin) over a method's runs: each run's mean over its steps, the mean
    over seeds (nan where the runs log no γ)."""
    gam = [f.mean_gamma for f in facts.values() if math.isfinite(f.mean_gamma)]
    clip = [f.mean_gamma_clip for f in facts.values() if math.isfinite(f.mean_gamma_clip)]
    return (statistics.fmean(gam) if gam else math.nan, statistics.fmean(clip) if clip else math.nan)


def rs_arm(claim: Claim) -> str:
    """The claim's RS arm: the treatment, or the control where only it has RS."""
    return next((x for x in (claim.treatment, claim.control) if "-rs" in f"-{x}"), claim.treatment)


def rs_inactive(claim: Claim, facts: dict[str, dict[int, m.RunFacts]]) -> str:
    """Why RS cannot change this claim's outcome in this regime ("" when it acts or the claim is not RS's)."""
    if not claim.rs:
        return ""
    gamma, clip = rs_activity(facts.get(rs_arm(claim), {}))
    if not (math.isfinite(gamma) and math.isfinite(clip)):
        return ""
    if not rs_acts(gamma, clip):
        return f"RS inactive (mean γ {gamma:.4f}, {100 * clip:.2g}% of tokens at γmin)"
    return ""


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
    why = rs_inactive(claim, facts)
    if why:
        return why
    if claim.precondition == "stabilises":
        control = facts.get(claim.control, {})
        if control and not any(f.collapsed for f in control.values()):
            gain = statistics.fmean(f.reward_late - f.reward_first for f in control.values())
            window = min(f.late_steps for f in control.values())
            bar = 100 * learn_bar(window, seeds=len(control))
            if gain < bar:
                return f"the control neither collapses nor learns (training reward {gain:+.1f} pts, bar {bar:.1f})"
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


def paired_diffs(claim: Claim, values: dict[str, dict[int, m.Measured]], seeds: list[int]) -> tuple[list[float], float]:
    """The seeds' differences treatment - control (sign-adjusted) and the noise floor of one."""
    if not claim.control:
        runs = values[claim.treatment]
        diffs = [claim.sign * runs[s].value for s in seeds]
        noise = [runs[s].noise for s in seeds]
    else:
        t, c = values[claim.treatment], values[claim.control]
        diffs = [claim.sign * (t[s].value - c[s].value) for s in seeds]
        noise = [m.pair_noise(claim.measure, t[s], c[s]) for s in seeds]
    finite = [x for x in noise if math.isfinite(x)]
    return diffs, (math.sqrt(statistics.fmean(x * x for x in finite)) if finite else 0.0)


def paired_rows(
    claim: Claim,
    regime: str,
    values: dict[str, dict[int, m.Measured]],
    facts: dict[str, dict[int, m.RunFacts]] | None = None,
    grpo: dict[int, m.RunFacts] | None = None,
) -> list[Row]:
    """The claim's row from method -> {seed: Measured} (and the runs' facts for the preconditions);
    where RS does not act, the not-testable row and, for a training-reward or accuracy measure, the
    equivalence row that tests RS's harmlessness instead."""
    facts = facts or {}
    why = precondition_fails(claim, facts, grpo or {})
    seeds = sorted(set.intersection(*(set(v) for v in values.values()))) if values else []
    kind = "check" if claim.check else "verdict"
    if why:
        rows = [replace(not_testable(claim, regime, why), kind=kind)]
        if why == rs_inactive(claim, facts) and claim.measure in ("reward", "acc") and len(seeds) >= 2:
            rows.append(equivalence_row(claim, regime, values, seeds, rs_activity(facts[rs_arm(claim)])[0]))
        return rows
    undefined = [
        f"{method} s{s}: {values[method][s].why}" for method in values for s in seeds if not values[method][s].defined
    ]
    if undefined:
        return [not_testable(claim, regime, "undefined measure (" + "; ".join(undefined[:2]) + ")", len(seeds))]
    why = saturated({k: {s: v[s] for s in seeds} for k, v in values.items()})
    if why:
        return [not_testable(claim, regime, why, len(seeds))]
    diffs, floor = paired_diffs(claim, values, seeds)
    return [replace(judge(claim, regime, diffs, floor), kind=kind)]


def paired_row(
    claim: Claim,
    regime: str,
    values: dict[str, dict[int, m.Measured]],
    facts: dict[str, dict[int, m.RunFacts]] | None = None,
    grpo: dict[int, m.RunFacts] | None = None,
) -> Row:
    """The claim's own row (``paired_rows``' first)."""
    return paired_rows(claim, regime, values, facts, grpo)[0]


def equivalence_row(
    claim: Claim, regime: str, values: dict[str, dict[int, m.Measured]], seeds: list[int], gamma: float
) -> Row:
    """RS is harmless where it does not act: |treatment - control| < margin by two one-sided tests. The
    row says RS's mean weight ``gamma`` there: near 1 the arms differ by almost nothing by construction,
    so "equivalent" is close to tautological (the table's footnote)."""
    diffs, floor = paired_diffs(claim, values, seeds)
    word, est = equivalent(diffs, floor, claim.margin)
    label = replace(claim, text=f"{claim.text}: RS harmless where it does not act (equivalence, ±{claim.margin:g})")
    return Row(label, regime, est, word, why=f"RS's mean weight γ {gamma:.4f} here", kind="equivalence")


def primary_test(r: Row) -> tuple[str, float]:
    """The test a primary row's verdict rests on, and its one-sided p (1 where there is none)."""
    if r.verdict in (NOT_TESTABLE, NOT_REPRODUCED) or math.isnan(r.est.low):
        return "", 1.0
    if r.verdict == NOT_SUPPORTED:
        return "non-sup", p_below(r.est, r.claim.margin)
    if r.verdict == CONTRADICTED:
        return "inf", p_below(r.est, 0.0)
    return "sup", p_above_zero(r.est)


def apply_holm(rows: list[Row], primary: dict[str, int | None]) -> list[Row]:
    """Mark the primary rows (``primary``: the pre-registered family, claim key -> its row's index,
    None where that row was not built) and correct them as one family (Holm, one-sided): a primary
    verdict stands only below 2.5% after the correction; the others read inconclusive."""
    tests = {key: primary_test(rows[i]) if i is not None else ("", 1.0) for key, i in primary.items()}
    adjusted = holm({key: p for key, (_, p) in tests.items()})
    index = {i: key for key, i in primary.items() if i is not None}
    out = []
    for i, r in enumerate(rows):
        if i not in index:
            out.append(r)
            continue
        test, p = tests[index[i]][0], adjusted[index[i]]
        decided = r.verdict in (SUPPORTED, IMMATERIAL, NOT_SUPPORTED, CONTRADICTED)
        if decided and not p < (1 - LEVEL) / 2:
            why = (
                f"{r.verdict} before Holm's correction across the {len(primary)} pre-registered primary rows, "
                f"not after it ({test} p {p:.3f})"
            )
            r = replace(r, verdict=INCONCLUSIVE, why=why)
        out.append(replace(r, primary=True, p_holm=p, test=test, family=len(primary)))
    return out
