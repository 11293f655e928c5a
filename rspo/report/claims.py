"""The claims table: the paper's small-scale claims, each compared in every regime the preset has,
with the effect this study measured, its 95% interval over seeds, the smallest effect the design
can detect, and a verdict.

A row compares a treatment method with a control method of one regime (natural; stress or mismatch
where the preset has them, rspo.study_config.REGIMES) through one measure per run
(rspo.report.measures: training reward of the last third, its best-to-final drop, held-out
accuracy, steps to collapse, the trends of Sec. 3.3). The effect is the mean over seeds of the
paired difference treatment - control (same seed: same-seed runs share the prompt order), or for a
one-method trend each seed's value; throughput is RSPO/GMPO per benchmark step minus 0.75.

The claims, their arms, measures and margins are registered entries (rspo.report.claim_registry:
``CLAIMS``, each measure's margin in ``MARGINS``).
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

from rspo.grid import REGIMES
from rspo.report import measures as m
from rspo.report.claim_registry import CLAIMS, claim_rows, primary_family
from rspo.report.inference import Estimate, interval, pooled_sd
from rspo.report.regime_search import guard
from rspo.report.rule import NOT_TESTABLE, RULE, Claim, Row, apply_holm, judge, paired_rows
from rspo.run_record import late_window

UNITS = {
    "reward": "train reward, last third (pts)",
    "reward_drop": "train reward best-to-final drop (pts)",
    "acc": "held-out acc. (pts)",
    "steps": "steps to collapse",
    "gamma_fall": "γ fall per 100 steps",
    "gclip_rise": "γ-clip rise (pts / 100 steps)",
    "kl_vol_growth": "log2 sd(ppo_kl) late / early",
    "clip_vol_growth": "log2 sd(pg_clipfrac) late / early",
    "kl_vol": "log2 sd(ppo_kl)",
    "agreement": "routing agreement (pts)",
    "mismatch_kl": "log2 engine-trainer k3 KL",
}


def effect_text(claim: Claim) -> str:
    if claim.measure == "throughput":
        return f"RSPO/GMPO throughput - {claim.threshold:g}"
    unit = UNITS[claim.measure]
    if not claim.control:
        return f"{unit}: {claim.treatment}"
    a, b = (claim.treatment, claim.control) if claim.sign > 0 else (claim.control, claim.treatment)
    return f"{unit}: {a} - {b}"


REPAIRS = ("r3-acc", "tis-acc")
"""Claims that a mismatch tool improves the control: testable only where the mismatch harms it."""


def mismatch_cost(plan, runs_dir: Path) -> tuple[Estimate, int, int] | None:
    """What the mismatch regime costs GMPO: its training reward over the mismatch runs' late window
    (the last third of their steps), natural-regime run minus mismatch-regime run of the same seed
    (same prompts at each step), as an interval over seeds with the paired noise floor; -> (interval,
    first step, last step), or None without both regimes' GMPO runs."""
    if not plan.spec.has("mismatch"):
        return None
    total = plan.spec.rl(regime="mismatch").schedule.total_steps
    first = total - len(late_window(range(total))) + 1
    runs: dict[str, dict[int, Path]] = {"gmpo": {}, "mismatch-gmpo": {}}
    for name, r in plan.runs.items():
        if r.task == "countdown" and r.method in runs:
            runs[r.method][r.seed] = Path(runs_dir) / name / "metrics.jsonl"
    seeds = sorted(set(runs["gmpo"]) & set(runs["mismatch-gmpo"]))
    seeds = [s for s in seeds if runs["gmpo"][s].is_file() and runs["mismatch-gmpo"][s].is_file()]
    if len(seeds) < 2:
        return None
    diffs, noise = [], []
    for s in seeds:
        natural = m.reward_over(runs["gmpo"][s], first, total)
        mismatch = m.reward_over(runs["mismatch-gmpo"][s], first, total)
        diffs.append(natural.value - mismatch.value)
        noise.append(m.pair_noise("reward", natural, mismatch))
    return interval(diffs, math.sqrt(sum(x * x for x in noise) / len(noise))), first, total


def no_harm(rows: list[Row], cost: tuple[Estimate, int, int] | None) -> list[Row]:
    """The R3 and TIS "improves GMPO" rows made not testable where the mismatch costs GMPO nothing
    measurable (``mismatch_cost``'s interval not wholly above 0): there is no harm for them to repair.
    Such a row keeps the effect it measured, for the reader."""
    out = []
    for r in rows:
        if r.claim.key not in REPAIRS or r.regime != "mismatch" or r.kind != "verdict":
            out.append(r)
            continue
        if cost is None:
            why = "no natural-regime GMPO runs to measure what the mismatch costs GMPO"
        elif cost[0].low > 0:
            out.append(r)
            continue
        else:
            est, first, last = cost
            why = (
                f"the mismatch costs GMPO nothing measurable (its training reward over steps {first}-{last}, "
                f"natural minus mismatch regime: {est.mean:+.2f} [{est.low:+.2f}, {est.high:+.2f}] points, "
                f"n={est.n}): no harm to repair"
            )
        out.append(replace(r, verdict=NOT_TESTABLE, why=why))  # the measured effect stays on the row
    return out


class RegimeRuns:
    """One regime's Countdown runs of a plan: names, measures and facts by method (run name without
    its seed and regime prefix) and seed; each run's facts read once."""

    def __init__(
        self, plan, prefix: str, eval_dir: Path, runs_dir: Path, missing: frozenset[str] = frozenset()
    ) -> None:
        self.plan, self.prefix, self.eval_dir, self.runs_dir = plan, prefix, eval_dir, runs_dir
        self.missing = missing
        self._facts: dict[str, dict[int, m.RunFacts]] = {}

    def names(self, method: str) -> list[str]:
        return [
            n
            for n, r in self.plan.runs.items()
            if r.task == "countdown" and r.method == self.prefix + method and n not in self.missing
        ]

    def measure(self, measure: str, method: str) -> dict[int, m.Measured]:
        splits = self.plan.spec.countdown_splits
        return {
            self.plan.runs[n].seed: m.run_measure(
                measure, n, eval_dir=self.eval_dir, runs_dir=self.runs_dir, splits=splits
            )
            for n in self.names(method)
        }

    def facts(self, method: str) -> dict[int, m.RunFacts]:
        if method not in self._facts:
            self._facts[method] = {self.plan.runs[n].seed: m.run_facts(self.runs_dir / n) for n in self.names(method)}
        return self._facts[method]


def regime_rows(runs: RegimeRuns, regime: str, claims: list[Claim]) -> list[Row]:
    """The rows of ``claims`` whose methods all have runs in this regime."""
    rows = []
    for claim in claims:
        methods = [x for x in (claim.treatment, claim.control) if x]
        if claim.measure == "throughput" or not all(runs.names(x) for x in methods):
            continue
        try:
            values = {x: runs.measure(claim.measure, x) for x in methods}
        except m.TooShortError:
            continue
        grpo = runs.facts("grpo") if runs.names("grpo") else {}
        rows += paired_rows(claim, regime, values, {x: runs.facts(x) for x in methods}, grpo)
    return rows


def whole_plan(plan):
    """``plan`` with every seed the preset names (itself when it has them all): what a table of a piece
    of the study, a plan of fewer seeds, is a part of."""
    if set(plan.spec.seeds) <= set(plan.seeds):
        return plan
    from rspo.plan import Plan

    return Plan(plan.preset, None, plan.full, plan.selection, plan.spec.path)


def missing_runs(plan, eval_dir: Path, runs_dir: Path, whole=None) -> list[str]:
    """The preset's Countdown runs whose training (final.json) or evaluation (countdown.json) is absent,
    and, for a plan of fewer seeds than the preset names (a piece of the study), the other seeds' runs
    (``whole``: ``whole_plan(plan)``, when the caller has it)."""
    return [
        n
        for n, r in (whole or whole_plan(plan)).runs.items()
        if r.task == "countdown"
        and not (
            n in plan.runs
            and (Path(runs_dir) / n / "final.json").is_file()
            and (Path(eval_dir) / n / "countdown.json").is_file()
        )
    ]


def collect(
    plan, eval_dir: Path, runs_dir: Path, bench_file: Path | None, missing: list[str] | None = None
) -> list[Row]:
    """Every claim in every regime whose runs exist in the plan, from the run and eval files; each
    claim's primary row marked and the pre-registered primary family Holm-corrected; every row's MDE
    from the SD pooled over its measure and regime; every row interim when ``missing`` names runs."""
    total = plan.spec.rl().schedule.total_steps
    regimes = [("natural", "", total)] + [
        (r, f"{r}-", plan.spec.rl(regime=r).schedule.total_steps) for r in REGIMES if plan.spec.has(r)
    ]
    absent = frozenset(missing or ())
    rows: list[Row] = []
    for regime, prefix, steps in regimes:
        claims = claim_rows(plan.default_gamma, steps)
        rows += regime_rows(RegimeRuns(plan, prefix, Path(eval_dir), Path(runs_dir), absent), regime, claims)
    if bench_file is not None:
        data = json.loads(Path(bench_file).read_text())
        ratios = data.get("rs_throughput_ratio_per_step")
        if not isinstance(ratios, list) or not ratios:
            raise ValueError(
                f"{bench_file}: rs_throughput_ratio_per_step must be a non-empty list (rerun `python -m rspo bench`)"
            )
        claim = next(c for c in claim_rows(plan.default_gamma, total) if c.measure == "throughput")
        rows.append(judge(claim, "benchmark", [float(x) - claim.threshold for x in ratios], 0.0, seeds=False))
    rows = no_harm(rows, mismatch_cost(plan, Path(runs_dir)))
    records = plan.spec.regime_records()
    if records:  # the regime search's gates (rspo.report.regime_search)
        rows = guard(rows, records)
    family = plan.spec.primary_claims or primary_family()
    unknown = [k for k in family if k not in CLAIMS or CLAIMS[k].check]
    if unknown:
        raise ValueError(f"primary_claims: unknown claim key(s) {unknown}; choose from {sorted(primary_family())}")
    primary: dict[str, int | None] = {key: None for key in family}
    for i, r in enumerate(rows):
        key = r.claim.key
        if key in primary and r.kind == "verdict" and r.claim.measure == CLAIMS[key].primary_measure:
            if r.regime == CLAIMS[key].regime:
                primary[key] = i
    rows = apply_holm(rows, primary)
    pooled: dict[tuple[str, str], float] = {}
    paired = [r for r in rows if r.seeds and r.kind in ("verdict", "equivalence")]  # the seeds' paired differences
    for key in {(r.claim.measure, r.regime) for r in paired}:
        pooled[key] = pooled_sd([(r.est.sd, r.n) for r in paired if (r.claim.measure, r.regime) == key])
    return [
        replace(
            r, mde_sd=pooled.get((r.claim.measure, r.regime), r.est.sd) if r.seeds else r.est.sd, interim=bool(absent)
        )
        for r in rows
    ]


# ---------------------------------------------------------------------------- the table


def _num(x: float, fmt: str = "+.2f") -> str:
    return "–" if not math.isfinite(x) else format(x, fmt)


def role(r: Row) -> str:
    if r.kind == "check":
        return "check"
    if r.kind == "equivalence":
        return "equivalence (exploratory)"
    return "primary" if r.primary else "exploratory"


def format_rows(rows: list[Row]) -> list[tuple[str, list[str]]]:
    out = []
    for r in rows:
        level = "90% CI " if r.kind == "equivalence" else ""
        ci = f"{level}[{r.est.low:+.2f}, {r.est.high:+.2f}]" if math.isfinite(r.est.low) else "–"
        if r.est.floored:
            ci += " *"
        n = str(r.n) if r.seeds else f"{r.n} steps of one process"
        mde_text = f"{r.mde:.2f} (n={r.n})" if math.isfinite(r.mde) else "–"
        p = f"{r.test} {r.p_holm:.3f}" if r.primary and r.test else ("1 (untested)" if r.primary else "–")
        out.append(
            (
                r.claim.text,
                [
                    r.claim.paper,
                    r.regime,
                    role(r),
                    effect_text(r.claim),
                    n,
                    _num(r.mean),
                    ci,
                    mde_text,
                    f"{r.claim.margin:g}",
                    p,
                    r.verdict_text,
                ],
            )
        )
    return out


def summary(rows: list[Row]) -> dict:
    return {
        "rows": [
            {
                "claim": r.claim.key,
                "measure": r.claim.measure,
                "regime": r.regime,
                "kind": r.kind,
                "primary": r.primary,
                "mean": r.mean,
                "low": r.est.low,
                "high": r.est.high,
                "sd": r.est.sd,
                "floored": r.est.floored,
                "n": r.n,
                "mde": r.mde,
                "mde_sd": r.mde_sd,
                "p_holm": r.p_holm,
                "test": r.test,
                "verdict": r.verdict,
                "why": r.why,
                "provisional": r.provisional,
                "interim": r.interim,
            }
            for r in rows
        ]
    }


def table_claims(plan, eval_dir: str | Path, runs_dir: str | Path, bench_file: str | Path | None = None):
    from rspo.report.tables import Cell, Table

    whole = whole_plan(plan)
    missing = missing_runs(plan, Path(eval_dir), Path(runs_dir), whole)
    rows = collect(plan, Path(eval_dir), Path(runs_dir), Path(bench_file) if bench_file else None, missing)
    if not rows:
        raise ValueError(
            f"preset {plan.name!r}: no claim has runs of both its methods"
            + (f" ({len(missing)} of the preset's runs are missing: {', '.join(missing[:6])}...)" if missing else "")
        )
    columns = ["Paper", "Regime", "Role", "Effect", "n", "Mean", "95% CI", "MDE", "Margin", "p (Holm)", "Verdict"]
    table_rows = [(label, [Cell(text=c) for c in cells]) for label, cells in format_rows(rows)]
    overlays = "".join(
        f"; {r} = the same with the overlay {json.dumps(plan.spec.section(r)['rl'])} ({why}; not in the paper)"
        for r, why in REGIMES.items()
        if plan.spec.has(r)
    )
    interim = (
        [
            f"INTERIM: {len(missing)} of the preset's "
            f"{sum(1 for r in whole.runs.values() if r.task == 'countdown')} "
            f"Countdown runs are missing ({', '.join(missing)}); every row is computed from the runs present and "
            "carries no verdict."
        ]
        if missing
        else []
    )
    notes = [
        *interim,
        RULE,
        "* = the interval's SD is the noise floor (the seeds' differences spread less than one difference's "
        "own noise). Effects: train reward = mean training reward (sampled at the rollout temperature) of the "
        "last third of the steps; drop = best minus last of its consecutive 10-step means; held-out acc. = greedy "
        "accuracy of the final checkpoint, "
        + " and ".join(plan.spec.countdown_splits)
        + " pooled; steps = the collapse detector's onset step (runs that never collapse count with their full "
        "length); throughput = RSPO/GMPO update tokens/s per benchmark step; γ fall / γ-clip rise = least-squares "
        "slope of the per-step mean γ (sign flipped) / of the share of tokens under γmin, per 100 steps; "
        "volatility = standard deviation of the per-step values, late / early = last fifth over first fifth; "
        "trends use the steps before a run's collapse. Beyond the paper: routing agreement = mean over steps of "
        "the share of (token, MoE layer) whose top-k experts agree between engine and trainer; engine-trainer k3 "
        "KL = log2 of its mean over steps (rspo/report/measures.py).",
        "Equivalence rows stand where RS does not act: RS multiplies each token's ratio by its weight γ, and "
        "each such row prints the mean γ of its RS runs (a mean γ of 1 - x changes the ratio by about x), so "
        "where γ is within a fraction of a percent of 1 an 'equivalent' is close to true by construction: it "
        "says RS did no harm, not that it could help.",
        "n = seeds with both runs (benchmark: measured steps of one process, not seeds). Regimes: natural = the "
        "preset's rl section" + overlays + ".",
        f"Preset {plan.name}. The paper's claims are at 30B-parameter scale; a verdict here is about this scale, "
        "this base model and this evaluation set only.",
    ]
    return Table(
        title=f"The paper's claims at small scale ({plan.name})",
        columns=columns,
        rows=table_rows,
        notes=notes,
        first_column="Claim",
    )
