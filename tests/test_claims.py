"""rspo.report.claims: the t interval, the verdict rule on synthetic effects (every verdict), paired
effects over seeds, and the per-run measures read from run files."""

import json
import math

import pytest

from rspo.report import claims
from rspo.report.claims import INCONCLUSIVE, NOT_SUPPORTED, SUPPORTED, Claim, effect_row, t_interval, verdict


def test_t_interval_matches_the_textbook_value():
    mean, low, high, n = t_interval([1.0, 2.0, 3.0])
    # mean 2, s = 1, t(0.975, 2) = 4.302653
    assert (mean, n) == (2.0, 3)
    assert low == pytest.approx(2 - 4.302653 / math.sqrt(3), rel=1e-6)
    assert high == pytest.approx(2 + 4.302653 / math.sqrt(3), rel=1e-6)
    assert all(math.isnan(x) for x in t_interval([5.0])[1:3])


@pytest.mark.parametrize(
    "low, high, margin, expected",
    [
        (0.5, 4.0, 2.0, SUPPORTED),  # excludes 0 on the claimed side
        (0.1, 0.3, 2.0, SUPPORTED),  # small but on the claimed side
        (-3.0, -1.0, 2.0, NOT_SUPPORTED),  # the opposite direction
        (-1.0, 1.5, 2.0, NOT_SUPPORTED),  # a material effect (>= 2) is excluded
        (-1.0, 3.0, 2.0, INCONCLUSIVE),  # includes 0 and a material effect
        (-1.0, 0.5, 0.0, INCONCLUSIVE),  # margin 0: only the opposite direction can refute
        (-1.0, -0.1, 0.0, NOT_SUPPORTED),
        (float("nan"), float("nan"), 2.0, INCONCLUSIVE),
    ],
)
def test_verdict_rule(low, high, margin, expected):
    assert verdict(low, high, margin) == expected


def test_verdict_rejects_a_negative_margin():
    with pytest.raises(ValueError, match="margin"):
        verdict(0.0, 1.0, -1.0)


def test_effects_are_paired_by_seed_on_synthetic_measures():
    c = Claim("rs-grpo", "RS stabilises GRPO", "Fig. 4", "acc", "grpo-rs0.8", "grpo", margin=2.0)
    # seed 3 of the treatment has no control: it is left out; differences 5, 6, 7
    values = {"grpo-rs0.8": {0: 50.0, 1: 56.0, 2: 57.0, 3: 99.0}, "grpo": {0: 45.0, 1: 50.0, 2: 50.0}}
    row = effect_row(c, "stress", values)
    assert row.n == 3 and row.mean == pytest.approx(6.0) and row.verdict == SUPPORTED
    flat = {"grpo-rs0.8": {0: 50.0, 1: 49.5, 2: 50.5}, "grpo": {0: 50.0, 1: 50.0, 2: 50.0}}
    assert effect_row(c, "natural", flat).verdict == NOT_SUPPORTED
    noisy = {"grpo-rs0.8": {0: 60.0, 1: 40.0, 2: 55.0}, "grpo": {0: 50.0, 1: 50.0, 2: 50.0}}
    assert effect_row(c, "natural", noisy).verdict == INCONCLUSIVE
    one = {"grpo-rs0.8": {0: 60.0}, "grpo": {0: 50.0}}
    assert effect_row(c, "natural", one).verdict == INCONCLUSIVE
    drop = Claim("grpo-collapses", "GRPO collapses", "Fig. 1", "drop", "grpo", "gmpo", margin=2.0)
    drops = {"grpo": {0: 20.0, 1: 25.0, 2: 24.0}, "gmpo": {0: 1.0, 1: 2.0, 2: 3.0}}
    assert effect_row(drop, "stress", drops).verdict == SUPPORTED
    # two seeds: t(0.975, 1) = 12.7 makes the same effect inconclusive
    assert effect_row(drop, "stress", {"grpo": {0: 20.0, 1: 25.0}, "gmpo": {0: 1.0, 1: 2.0}}).verdict == INCONCLUSIVE
    tp = Claim("cost", "RS costs little throughput", "Sec. 5.5", "throughput", "", "", margin=0.0, threshold=0.75)
    assert effect_row(tp, "bench", {"throughput": {0: 0.95, 1: 0.97, 2: 0.96}}).verdict == SUPPORTED
    assert effect_row(tp, "bench", {"throughput": {0: 0.60, 1: 0.62, 2: 0.61}}).verdict == NOT_SUPPORTED


def test_run_measures_read_the_run_files(tmp_path):
    (tmp_path / "countdown.json").write_text(
        json.dumps({"splits": {"val": {"accuracy": 0.5, "n": 400}, "val_target": {"accuracy": 0.25, "n": 200}}})
    )
    assert claims.pooled_accuracy(tmp_path / "countdown.json", ["val", "val_target"]) == pytest.approx(100 * 250 / 600)
    (tmp_path / "metrics.jsonl").write_text(
        "".join(
            json.dumps(r) + "\n"
            for r in [
                {"step": 0, "val/val/score": 0.5},
                {"step": 1, "critic/score/mean": 0.3},
                {"step": 10, "val/val/score": 0.7},
                {"step": 20, "val/val/score": 0.4},
            ]
        )
    )
    assert claims.val_drop(tmp_path / "metrics.jsonl") == pytest.approx(30.0)
    (tmp_path / "final.json").write_text(json.dumps({"collapsed": True, "collapse_step": 41, "steps": 100}))
    assert claims.steps_to_collapse(tmp_path / "final.json") == 41
    (tmp_path / "final.json").write_text(json.dumps({"collapsed": False, "collapse_step": None, "steps": 100}))
    assert claims.steps_to_collapse(tmp_path / "final.json") == 100


# ---------------------------------------------------------------------------- the diagnosis of Sec. 3.3


def _metrics_file(path, rows):
    path.write_text("".join(json.dumps({"step": i + 1, **r}) + "\n" for i, r in enumerate(rows)))
    return path


def test_trend_measures_on_hand_made_series(tmp_path):
    """γ falling by 0.0002 per step = 0.02 per 100 steps; the clip fraction rising by 0.0001 per
    step = 1 point per 100 steps; ppo_kl whose last fifth swings twice as wide as its first fifth."""
    n = 50
    rows = []
    for i in range(n):
        wiggle = (1 if i % 2 else -1) * (2e-3 if i >= n - 10 else 1e-3)
        rows.append(
            {
                "router/shift_ratio_mean": 1.0 - 2e-4 * i,
                "router/shift_clipfrac": 1e-4 * i,
                "actor/ppo_kl": 0.01 + wiggle,
                "actor/pg_clipfrac": 0.02,
            }
        )
    rows.insert(0, {"val/val/score": 0.5})  # a step-0 validation line is not a training step
    f = tmp_path / "metrics.jsonl"
    f.write_text(
        json.dumps({"step": 0, "val/val/score": 0.5})
        + "\n"
        + "".join(json.dumps({"step": i + 1, **r}) + "\n" for i, r in enumerate(rows[1:]))
    )
    assert claims.trend_measure("gamma_fall", f) == pytest.approx(0.02)
    assert claims.trend_measure("gclip_rise", f) == pytest.approx(1.0)
    assert claims.trend_measure("kl_vol_growth", f) == pytest.approx(1.0)  # sd doubles: log2 2
    assert claims.trend_measure("clip_vol_growth", f) == 0.0  # constant early and late: no growth
    assert claims.volatility_growth([1.0, 2.0] * 10) == pytest.approx(0.0)
    with pytest.raises(ValueError, match="at least 10"):
        claims.trend_measure("gamma_fall", _metrics_file(tmp_path / "short.jsonl", rows[1:6]))


def test_a_one_method_trend_takes_each_seed_as_the_effect():
    c = Claim("gamma-falls", "γ falls", "Fig. 6", "gamma_fall", "grpo", "", margin=0.01)
    assert c.effect_text == "γ fall per 100 steps: grpo"
    row = effect_row(c, "stress", {"grpo": {0: 0.05, 1: 0.06, 2: 0.055}})
    assert row.n == 3 and row.mean == pytest.approx(0.055) and row.verdict == SUPPORTED
    flat = effect_row(c, "natural", {"grpo": {0: 0.001, 1: -0.001, 2: 0.0}})
    assert flat.verdict == NOT_SUPPORTED  # the interval excludes a fall of 0.01 per 100 steps


def test_the_diagnosis_claims_come_from_the_runs_metrics(tmp_path):
    """Three GRPO seeds whose γ falls and ppo_kl swings wider late; the +RS runs (GRPO+RS, and
    RSPO, which the plugin family brings as Fig. 6's pair) are calm: every diagnosis row says
    supported."""
    from rspo.plan import Plan

    preset = {
        "preset": "t",
        "seeds": [0, 1, 2],
        "rl": {"algorithm": {"gamma_min": 0.8}, "schedule": {"total_steps": 40}},
        "grid": {"plugin": {"algos": ["grpo"], "router_shift": [False, True]}},
    }
    plan = Plan(preset)
    runs = tmp_path / "runs"
    for name, r in plan.runs.items():
        (runs / name).mkdir(parents=True)
        rows = []
        for i in range(40):
            swing = (1 if i % 2 else -1) * (1e-3 if r.router_shift else (4e-3 if i >= 32 else 1e-3))
            rows.append(
                {
                    "router/shift_ratio_mean": 1.0 - (0.0 if r.router_shift else 1e-3) * i * (1 + 0.1 * r.seed),
                    "router/shift_clipfrac": (0.0 if r.router_shift else 5e-4) * i,
                    "actor/ppo_kl": 0.01 + swing,
                    "actor/pg_clipfrac": 0.02 + swing,
                }
            )
        _metrics_file(runs / name / "metrics.jsonl", rows)
    got = {}
    for claim in claims.paper_claims(0.8, 40):
        if claim.measure not in claims.TREND_MEASURES:
            continue
        values = {
            m: {
                plan.runs[n].seed: claims.run_measure(claim.measure, n, eval_dir=tmp_path, runs_dir=runs, splits=[])
                for n in plan.runs
                if plan.runs[n].method == m
            }
            for m in (claim.treatment, claim.control)
            if m
        }
        if all(values.values()):
            got[claim.key] = effect_row(claim, "natural", values)
    keys = {"gamma-falls", "gclip-rises", "kl-volatile", "clip-volatile", "rs-kl-vol", "rspo-kl-vol"}
    assert set(got) == keys
    for key in keys:
        assert got[key].verdict == SUPPORTED, (key, got[key])
    assert got["gamma-falls"].mean == pytest.approx(100 * 1e-3 * 1.1)
