"""The claims table: one row per small-scale claim of the paper, the effect this study measured,
its 95% confidence interval over seeds, and a verdict.

Each claim compares a treatment method with a control method of the same regime (the natural
regime or a regime of rspo.grid.REGIMES the preset has: stress, mismatch) through one measure per
run. Beyond the paper, ``mismatch_claims`` asks what R3 and TIS are for (docs/mismatch.md) wherever
a routing family has those rows. Measures:

- ``acc``: held-out greedy accuracy (%) of the final checkpoint, the preset's evaluation splits
  pooled (problems weighted equally; eval/<run>/countdown.json);
- ``drop``: best-to-final fall of the periodic validation score (points): how far a run fell
  from its own peak (metrics.jsonl);
- ``steps``: steps to collapse, the collapse detector's step (run.json / final.json), or the
  run's length when it never fired (a censored value: the effect is then a lower bound);
- ``throughput``: RSPO / GMPO update throughput of the benchmark, one ratio per measured step
  pair (bench.json).

The diagnosis of Sec. 3.3 (Fig. 6) is about how signals evolve during a run, so its measures come
from the per-step metrics of metrics.jsonl (``TREND_MEASURES``):

- ``gamma_fall``: how fast the per-step mean router-shift ratio falls: minus the least-squares
  slope of ``router/shift_ratio_mean`` against the step, per 100 steps (> 0: γ falls);
- ``gclip_rise``: how fast the router-shift clip fraction rises: the slope of
  ``router/shift_clipfrac`` (share of tokens with γ < γmin), in points per 100 steps;
- ``kl_vol_growth`` / ``clip_vol_growth``: whether ``actor/ppo_kl`` / ``actor/pg_clipfrac`` grow
  more volatile: log2 of the standard deviation of the per-step values over the last fifth of the
  run over that of the first fifth (at least 5 steps each; > 0: more volatile late);
- ``kl_vol``: log2 of the standard deviation of per-step ``actor/ppo_kl`` over the whole run (its
  paired difference is log2 of the ratio of two runs' volatilities);
- ``agreement``: the mean over steps of ``rollout_corr/routing_agreement`` (%): the share of
  (token, MoE layer) whose top-k experts agree between engine and trainer;
- ``mismatch_kl``: log2 of the mean over steps of ``rollout_corr/k3_kl`` (engine vs trainer; the
  paired difference is log2 of the ratio of two runs' mismatch).

A claim about one method's trend (``control`` empty) takes the measure of each seed's run as the
effect; the others are paired as above.

The effect is the mean over seeds of the paired difference treatment - control (same seed), or
for throughput the mean ratio minus the claim's threshold. The interval is Student's t
(mean +- t(0.975, n-1) s / sqrt(n)); with n < 2 there is no interval.

Verdict rule (``verdict``), fixed before any result was seen:
- supported: the whole interval lies on the claimed side of zero (it excludes no effect);
- not supported: the whole interval lies below the claim's margin, the smallest effect that
  would matter (2 accuracy points; 5 % of the run for steps; 0 for throughput; a γ fall of 0.01
  per 100 steps; a clip-fraction rise of 0.5 points per 100 steps; a 25 % change of volatility,
  log2 1.25 = 0.32), so the data exclude a material effect in the claimed direction;
- inconclusive: anything else, including n < 2.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rspo.grid import REGIMES

SUPPORTED, NOT_SUPPORTED, INCONCLUSIVE = "supported", "not supported", "inconclusive"
VOL_MARGIN = round(math.log2(1.25), 2)  # a 25 % change of a signal's volatility
RULE = (
    "Verdict rule: supported when the whole 95% CI of the effect lies on the claimed side of zero; "
    "not supported when the whole CI lies below the claim's margin (the smallest effect that would matter), "
    "i.e. a material effect in the claimed direction is excluded; inconclusive otherwise (also with fewer "
    "than 2 seeds). Effects are paired over seeds (treatment - control, same seed); CI: Student's t."
)


def t_interval(values: list[float], level: float = 0.95) -> tuple[float, float, float, int]:
    """(mean, low, high, n) of a t confidence interval; low = high = nan when n < 2."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan, math.nan, 0
    mean = statistics.fmean(values)
    if n < 2:
        return mean, math.nan, math.nan, n
    from scipy import stats

    half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * statistics.stdev(values) / math.sqrt(n)
    return mean, mean - half, mean + half, n


def verdict(low: float, high: float, margin: float) -> str:
    """The rule in the module docstring: the claimed effect is > 0; ``margin`` >= 0."""
    if margin < 0:
        raise ValueError(f"margin must be >= 0, got {margin}")
    if math.isnan(low) or math.isnan(high):
        return INCONCLUSIVE
    if low > 0:
        return SUPPORTED
    if high < margin:
        return NOT_SUPPORTED
    return INCONCLUSIVE


@dataclass(frozen=True)
class Claim:
    key: str
    text: str
    """The paper's claim, in one line."""
    paper: str
    """Where the paper makes it."""
    measure: str
    """acc | drop | steps | throughput (module docstring)."""
    treatment: str
    """Method (run name without its seed) expected to be better (higher measure; for drop: the
    method expected to fall MORE, see ``sign``)."""
    control: str
    margin: float
    sign: int = 1
    """+1: effect = treatment - control; -1: control - treatment."""
    threshold: float = 0.0
    """throughput only: effect = ratio - threshold."""

    @property
    def effect_text(self) -> str:
        if self.measure == "throughput":
            return f"RSPO/GMPO throughput - {self.threshold:g}"
        unit = UNITS[self.measure]
        if not self.control:
            return f"{unit}: {self.treatment}"
        a, b = (self.treatment, self.control) if self.sign > 0 else (self.control, self.treatment)
        return f"{unit}: {a} - {b}"


UNITS = {
    "acc": "acc. (pts)",
    "drop": "drop (pts)",
    "steps": "steps to collapse",
    "gamma_fall": "γ fall per 100 steps",
    "gclip_rise": "γ-clip rise (pts / 100 steps)",
    "kl_vol_growth": "log2 sd(ppo_kl) late / early",
    "clip_vol_growth": "log2 sd(pg_clipfrac) late / early",
    "kl_vol": "log2 sd(ppo_kl)",
    "agreement": "routing agreement (pts)",
    "mismatch_kl": "log2 engine-trainer k3 KL",
}


@dataclass
class Row:
    claim: Claim
    regime: str
    mean: float
    low: float
    high: float
    n: int
    verdict: str


def effect_row(claim: Claim, regime: str, values: dict[str, dict[int, float]]) -> Row:
    """values: method -> {seed: measure}; paired over the seeds both methods have."""
    if claim.measure == "throughput":
        diffs = [v - claim.threshold for v in values.get("throughput", {}).values()]
    elif not claim.control:  # one method's trend: each seed's measure is the effect
        diffs = [claim.sign * v for _, v in sorted(values.get(claim.treatment, {}).items())]
    else:
        t, c = values.get(claim.treatment, {}), values.get(claim.control, {})
        diffs = [claim.sign * (t[s] - c[s]) for s in sorted(set(t) & set(c))]
    mean, low, high, n = t_interval(diffs)
    return Row(claim, regime, mean, low, high, n, verdict(low, high, claim.margin))


# ---------------------------------------------------------------------------- per-run measures


def pooled_accuracy(path: Path, splits: list[str]) -> float:
    """Accuracy (%) over the given splits of an eval countdown.json, problems weighted equally."""
    data = json.loads(Path(path).read_text())
    ok = n = 0.0
    for s in splits:
        entry = (data.get("splits") or {}).get(s)
        if not entry:
            raise ValueError(f"{path}: no splits.{s}")
        ok += float(entry["accuracy"]) * int(entry["n"])
        n += int(entry["n"])
    return 100.0 * ok / n


def val_drop(metrics_path: Path) -> float:
    """Best-to-final fall (points) of the logged validation score (val/val/score)."""
    scores = []
    for line in Path(metrics_path).read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            if "val/val/score" in rec:
                scores.append((rec["step"], float(rec["val/val/score"])))
    if not scores:
        raise ValueError(f"{metrics_path}: no val/val/score logged")
    scores.sort()
    return 100.0 * (max(v for _, v in scores) - scores[-1][1])


def steps_to_collapse(final_path: Path) -> float:
    """The collapse detector's step, or the run's length when it never fired (censored)."""
    data = json.loads(Path(final_path).read_text())
    step = data.get("collapse_step")
    return float(step if data.get("collapsed") and step is not None else data["steps"])


TREND_MEASURES = ("gamma_fall", "gclip_rise", "kl_vol_growth", "clip_vol_growth", "kl_vol", "agreement", "mismatch_kl")
MIN_TREND_STEPS = 10


class TooShortError(ValueError):
    """A run too short for a trend (the smoke preset's 2-step runs): its claim gets no row."""


def _series(metrics_path: Path, key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of a per-step training metric (the last line wins for a repeated step)."""
    by_step: dict[int, float] = {}
    for line in Path(metrics_path).read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            v = rec.get(key)
            if isinstance(v, (int, float)) and math.isfinite(v) and rec.get("step", 0) > 0:
                by_step[int(rec["step"])] = float(v)
    if len(by_step) < MIN_TREND_STEPS:
        raise TooShortError(
            f"{metrics_path}: {key} is logged on {len(by_step)} steps; a trend needs at least {MIN_TREND_STEPS}"
        )
    steps = sorted(by_step)
    return [float(x) for x in steps], [by_step[x] for x in steps]


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys against xs."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx


def _log2_sd(values: list[float]) -> float:
    sd = statistics.stdev(values)
    return math.log2(sd) if sd > 0 else -60.0  # a constant signal: far below any real volatility


def volatility_growth(values: list[float]) -> float:
    """log2 of sd(last fifth) / sd(first fifth) of a per-step series (each part >= 5 steps)."""
    k = max(5, len(values) // 5)
    return _log2_sd(values[-k:]) - _log2_sd(values[:k])


def trend_measure(measure: str, metrics_path: Path) -> float:
    if measure == "gamma_fall":
        return -100.0 * slope(*_series(metrics_path, "router/shift_ratio_mean"))
    if measure == "gclip_rise":
        return 100.0 * 100.0 * slope(*_series(metrics_path, "router/shift_clipfrac"))
    if measure == "kl_vol_growth":
        return volatility_growth(_series(metrics_path, "actor/ppo_kl")[1])
    if measure == "clip_vol_growth":
        return volatility_growth(_series(metrics_path, "actor/pg_clipfrac")[1])
    if measure == "kl_vol":
        return _log2_sd(_series(metrics_path, "actor/ppo_kl")[1])
    if measure == "agreement":
        return 100.0 * statistics.fmean(_series(metrics_path, "rollout_corr/routing_agreement")[1])
    if measure == "mismatch_kl":
        mean = statistics.fmean(_series(metrics_path, "rollout_corr/k3_kl")[1])
        return math.log2(mean) if mean > 0 else -60.0  # engine == trainer: far below any real mismatch
    raise ValueError(f"unknown measure {measure!r}")


def run_measure(measure: str, run: str, *, eval_dir: Path, runs_dir: Path, splits: list[str]) -> float:
    if measure in TREND_MEASURES:
        return trend_measure(measure, runs_dir / run / "metrics.jsonl")
    if measure == "acc":
        return pooled_accuracy(eval_dir / run / "countdown.json", splits)
    if measure == "drop":
        return val_drop(runs_dir / run / "metrics.jsonl")
    if measure == "steps":
        return steps_to_collapse(runs_dir / run / "final.json")
    raise ValueError(f"unknown measure {measure!r}")


def format_rows(rows: list[Row]) -> list[tuple[str, list[str]]]:
    out = []
    for r in rows:
        ci = "–" if r.n < 2 else f"[{r.low:+.2f}, {r.high:+.2f}]"
        out.append(
            (
                r.claim.text,
                [
                    r.claim.paper,
                    r.regime,
                    r.claim.effect_text,
                    str(r.n),
                    "–" if math.isnan(r.mean) else f"{r.mean:+.2f}",
                    ci,
                    f"{r.claim.margin:g}",
                    r.verdict,
                ],
            )
        )
    return out


def summary(rows: list[Row]) -> dict[str, Any]:
    return {
        "rows": [
            {
                "claim": r.claim.key,
                "regime": r.regime,
                "mean": r.mean,
                "low": r.low,
                "high": r.high,
                "n": r.n,
                "verdict": r.verdict,
            }
            for r in rows
        ]
    }


# ---------------------------------------------------------------------------- the claims


def paper_claims(gamma_min: float, total_steps: int) -> list[Claim]:
    """The paper's small-scale claims, as comparisons of this grid's methods."""
    rs = f"rs{gamma_min:g}"
    steps_margin = round(0.05 * total_steps, 1)
    return [
        Claim(
            "grpo-collapses",
            "GRPO collapses on MoE (falls further from its peak than GMPO)",
            "Sec. 3.1, Fig. 1",
            "drop",
            "grpo",
            "gmpo",
            margin=2.0,
        ),
        Claim(
            "gamma-falls",
            "Under GRPO the router-shift ratio γ falls over training",
            "Sec. 3.3, Fig. 6 (top)",
            "gamma_fall",
            "grpo",
            "",
            margin=0.01,
        ),
        Claim(
            "gclip-rises",
            "Under GRPO the router-shift clip fraction rises over training",
            "Sec. 3.3, Fig. 6 (top)",
            "gclip_rise",
            "grpo",
            "",
            margin=0.5,
        ),
        Claim(
            "kl-volatile",
            "Under GRPO ppo_kl grows more volatile as drift accumulates",
            "Sec. 3.3, Fig. 6 (bottom)",
            "kl_vol_growth",
            "grpo",
            "",
            margin=VOL_MARGIN,
        ),
        Claim(
            "clip-volatile",
            "Under GRPO pg_clipfrac grows more volatile (bursty clipping)",
            "Sec. 3.3, Fig. 6 (bottom)",
            "clip_vol_growth",
            "grpo",
            "",
            margin=VOL_MARGIN,
        ),
        Claim(
            "rs-kl-vol",
            "RS lowers the volatility of ppo_kl (GRPO+RS vs GRPO)",
            "Sec. 5, Mechanism diagnostics, Fig. 6",
            "kl_vol",
            "grpo",
            f"grpo-{rs}",
            margin=VOL_MARGIN,
        ),
        Claim(
            "rspo-kl-vol",
            "RSPO's ppo_kl is less volatile than GRPO's (Fig. 6's pair)",
            "Sec. 5, Mechanism diagnostics, Fig. 6",
            "kl_vol",
            "grpo",
            f"gmpo-{rs}",
            margin=VOL_MARGIN,
        ),
        Claim("rs-grpo", "RS stabilises GRPO as a plug-in", "Sec. 5.3, Fig. 4", "acc", f"grpo-{rs}", "grpo", 2.0),
        Claim("rs-gspo", "RS stabilises GSPO as a plug-in", "Sec. 5.3, Fig. 4", "acc", f"gspo-{rs}", "gspo", 2.0),
        Claim(
            "rs-gmpo",
            "RS stabilises GMPO as a plug-in (RSPO vs GMPO)",
            "Sec. 5.3, Fig. 4",
            "acc",
            f"gmpo-{rs}",
            "gmpo",
            2.0,
        ),
        Claim("gmin-0.5", "γmin = 0.2 is worse than 0.5", "Sec. 5.4, Fig. 3", "acc", "gmpo-rs0.5", "gmpo-rs0.2", 2.0),
        Claim("gmin-0.8", "γmin = 0.2 is worse than 0.8", "Sec. 5.4, Fig. 3", "acc", "gmpo-rs0.8", "gmpo-rs0.2", 2.0),
        Claim(
            "nosg",
            "Backpropagating through γ collapses early",
            "App. B, Fig. 5",
            "steps",
            f"gmpo-{rs}",
            f"gmpo-{rs}-nosg",
            steps_margin,
        ),
        Claim("freeze", "Router freeze is worse than RS", "App. D, Fig. 8", "acc", f"gmpo-{rs}", "gmpo-freeze", 2.0),
        Claim(
            "logit-replay",
            "Logit replay is worse than RS",
            "App. D, Fig. 8",
            "acc",
            f"gmpo-{rs}",
            "gmpo-logitreplay",
            2.0,
        ),
        Claim(
            "index-replay",
            "Index replay is worse than RS",
            "App. D, Fig. 8",
            "acc",
            f"gmpo-{rs}",
            "gmpo-indexreplay",
            2.0,
        ),
        Claim(
            "throughput",
            "RS costs little throughput (RSPO keeps >= 75% of GMPO's update throughput)",
            "Sec. 5.5",
            "throughput",
            "",
            "",
            margin=0.0,
            threshold=0.75,
        ),
    ]


def mismatch_claims(gamma_min: float) -> list[Claim]:
    """Beyond the paper: what the train-inference mismatch tools are for (docs/mismatch.md), as
    comparisons of a regime's routing family with rows ``none``, ``rollout_replay``, ``tis`` and
    ``rs+tis``. Margins as the paper's claims: 2 accuracy points, a 25 % change of the KL; 1 point of
    routing agreement."""
    rs = f"rs{gamma_min:g}"
    r3 = "beyond the paper: R3 (rollout routing replay; verl, slime)"
    tis = "beyond the paper: TIS (Yao et al. 2025; verl, TRL)"
    return [
        Claim(
            "r3-agreement",
            "R3 makes the trainer route as the engine did",
            r3,
            "agreement",
            "gmpo-rolloutreplay",
            "gmpo",
            margin=1.0,
        ),
        Claim(
            "r3-kl",
            "R3 lowers the engine-trainer KL",
            r3,
            "mismatch_kl",
            "gmpo-rolloutreplay",
            "gmpo",
            margin=VOL_MARGIN,
            sign=-1,
        ),
        Claim("r3-acc", "R3 improves GMPO's accuracy", r3, "acc", "gmpo-rolloutreplay", "gmpo", 2.0),
        Claim("tis-acc", "TIS improves GMPO's accuracy", tis, "acc", "gmpo-tis", "gmpo", 2.0),
        Claim(
            "rs-tis-acc",
            "RS adds to TIS (RSPO+TIS vs GMPO+TIS)",
            "beyond the paper: RS with TIS",
            "acc",
            f"gmpo-{rs}-tis",
            "gmpo-tis",
            2.0,
        ),
    ]


def collect(plan, eval_dir: Path, runs_dir: Path, bench_file: Path | None) -> list[Row]:
    """Every claim in every regime whose runs exist in the plan, from the run and eval files."""
    splits = plan.spec.countdown_splits
    total = plan.spec.rl().schedule.total_steps
    regimes = [("natural", "", total)] + [
        (r, f"{r}-", plan.spec.rl(regime=r).schedule.total_steps) for r in REGIMES if plan.spec.has(r)
    ]
    rows: list[Row] = []
    for regime, prefix, steps in regimes:
        for claim in paper_claims(plan.default_gamma, steps) + mismatch_claims(plan.default_gamma):
            if claim.measure == "throughput":
                continue
            values: dict[str, dict[int, float]] = {}
            try:
                for method in [m for m in (claim.treatment, claim.control) if m]:
                    names = [n for n, r in plan.runs.items() if r.task == "countdown" and r.method == prefix + method]
                    values[method] = {
                        plan.runs[n].seed: run_measure(
                            claim.measure, n, eval_dir=Path(eval_dir), runs_dir=Path(runs_dir), splits=splits
                        )
                        for n in names
                    }
            except TooShortError:
                continue
            if all(values.values()):
                rows.append(effect_row(claim, regime, values))
    if bench_file is not None:
        data = json.loads(Path(bench_file).read_text())
        ratios = data.get("rs_throughput_ratio_per_step")
        if not isinstance(ratios, list) or not ratios:
            raise ValueError(
                f"{bench_file}: rs_throughput_ratio_per_step must be a non-empty list (rerun `python -m rspo bench`)"
            )
        claim = paper_claims(plan.default_gamma, total)[-1]
        rows.append(effect_row(claim, "benchmark", {"throughput": dict(enumerate(map(float, ratios)))}))
    return rows


def table_claims(plan, eval_dir: str | Path, runs_dir: str | Path, bench_file: str | Path | None = None):
    from rspo.report.tables import Cell, Table

    rows = collect(plan, Path(eval_dir), Path(runs_dir), Path(bench_file) if bench_file else None)
    if not rows:
        raise ValueError(f"preset {plan.name!r}: no claim has runs of both its methods")
    columns = ["Paper", "Regime", "Effect", "n", "Mean", "95% CI", "Margin", "Verdict"]
    table_rows = [(label, [Cell(text=c) for c in cells]) for label, cells in format_rows(rows)]
    overlays = "".join(
        f"; {r} = the same with the overlay {json.dumps(plan.spec.section(r)['rl'])} ({why}; not in the paper)"
        for r, why in REGIMES.items()
        if plan.spec.has(r)
    )
    notes = [
        RULE,
        "Effects: acc = held-out greedy accuracy of the final checkpoint, "
        + " and ".join(plan.spec.countdown_splits)
        + " pooled (points); drop = best-to-final fall of the periodic validation score (points); steps = steps to "
        "collapse (collapse detector), runs that never collapse count with their full length; throughput = "
        "RSPO/GMPO update tokens/s per benchmark step; γ fall / γ-clip rise = least-squares slope of the per-step "
        "mean γ (sign flipped) / of the share of tokens under γmin, per 100 steps; volatility = standard deviation "
        "of the per-step values, late / early = last fifth of the run over the first fifth (rspo/report/claims.py). "
        "A one-method effect (no minus sign) is the measure of each seed's run. Beyond the paper: routing "
        "agreement = mean over steps of the share of (token, MoE layer) whose top-k experts agree between the "
        "rollout engine and the trainer (points); engine-trainer k3 KL = log2 of its mean over steps.",
        "n = seeds with both runs (benchmark: measured steps). Regimes: natural = the preset's rl section"
        + overlays
        + ".",
        f"Preset {plan.name}. The paper's claims are at 30B-parameter scale; a verdict here is about this scale only.",
    ]
    return Table(
        title=f"The paper's claims at small scale ({plan.name})",
        columns=columns,
        rows=table_rows,
        notes=notes,
        first_column="Claim",
    )
