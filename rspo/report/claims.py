"""The claims table: one row per small-scale claim of the paper, the effect this study measured,
its 95% confidence interval over seeds, and a verdict.

Each claim compares a treatment method with a control method of the same regime (the natural
regime or the stress regime, see the preset) through one measure per run:

- ``acc``: held-out greedy accuracy (%) of the final checkpoint, the preset's evaluation splits
  pooled (problems weighted equally; eval/<run>/countdown.json);
- ``drop``: best-to-final fall of the periodic validation score (points): how far a run fell
  from its own peak (metrics.jsonl);
- ``steps``: steps to collapse, the collapse detector's step (run.json / final.json), or the
  run's length when it never fired (a censored value: the effect is then a lower bound);
- ``throughput``: RSPO / GMPO update throughput of the benchmark, one ratio per measured step
  pair (bench.json).

The effect is the mean over seeds of the paired difference treatment - control (same seed), or
for throughput the mean ratio minus the claim's threshold. The interval is Student's t
(mean +- t(0.975, n-1) s / sqrt(n)); with n < 2 there is no interval.

Verdict rule (``verdict``), fixed before any result was seen:
- supported: the whole interval lies on the claimed side of zero (it excludes no effect);
- not supported: the whole interval lies below the claim's margin, the smallest effect that
  would matter (2 accuracy points; 5 % of the run for steps; 0 for throughput), so the data
  exclude a material effect in the claimed direction;
- inconclusive: anything else, including n < 2.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUPPORTED, NOT_SUPPORTED, INCONCLUSIVE = "supported", "not supported", "inconclusive"
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
        a, b = (self.treatment, self.control) if self.sign > 0 else (self.control, self.treatment)
        unit = {"acc": "acc. (pts)", "drop": "drop (pts)", "steps": "steps to collapse"}[self.measure]
        return f"{unit}: {a} - {b}"


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


def run_measure(measure: str, run: str, *, eval_dir: Path, runs_dir: Path, splits: list[str]) -> float:
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


def collect(plan, eval_dir: Path, runs_dir: Path, bench_file: Path | None) -> list[Row]:
    """Every claim in every regime whose runs exist in the plan, from the run and eval files."""
    from rspo.plan import STRESS_PREFIX

    splits = list(((plan.preset.get("eval") or {}).get("countdown") or {}).get("splits", ["val", "val_target"]))
    total = int(((plan.preset.get("rl") or {}).get("schedule") or {}).get("total_steps", 100))
    stress_total = int(
        (((plan.preset.get("stress") or {}).get("rl") or {}).get("schedule") or {}).get("total_steps", total)
    )
    rows: list[Row] = []
    regimes = [("natural", "", total)] + ([("stress", STRESS_PREFIX, stress_total)] if "stress" in plan.preset else [])
    for regime, prefix, steps in regimes:
        for claim in paper_claims(plan.default_gamma, steps):
            if claim.measure == "throughput":
                continue
            values: dict[str, dict[int, float]] = {}
            for method in (claim.treatment, claim.control):
                names = [n for n, r in plan.runs.items() if r.task == "countdown" and r.method == prefix + method]
                values[method] = {
                    plan.runs[n].seed: run_measure(
                        claim.measure, n, eval_dir=Path(eval_dir), runs_dir=Path(runs_dir), splits=splits
                    )
                    for n in names
                }
            if values[claim.treatment] and values[claim.control]:
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
    stress = (plan.preset.get("stress") or {}).get("rl")
    notes = [
        RULE,
        "Effects: acc = held-out greedy accuracy of the final checkpoint, "
        + " and ".join(((plan.preset.get("eval") or {}).get("countdown") or {}).get("splits", ["val", "val_target"]))
        + " pooled (points); drop = best-to-final fall of the periodic validation score (points); steps = steps to "
        "collapse (collapse detector), runs that never collapse count with their full length; throughput = "
        "RSPO/GMPO update tokens/s per benchmark step.",
        "n = seeds with both runs (benchmark: measured steps). Regimes: natural = the preset's rl section"
        + (
            f"; stress = the same with the overlay {json.dumps(stress)} (drift as the controlled variable, "
            "not in the paper)"
            if stress
            else ""
        )
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
