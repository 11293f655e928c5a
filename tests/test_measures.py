"""rspo.report.measures: each per-run measure on hand-made run files, undefined values with their
reason (never a sentinel), trends cut at a run's collapse, and the noise of a same-seed pair."""

import json
import math

import pytest

from rspo.report import measures as m


def _run(path, rows, final=None):
    path.mkdir(parents=True, exist_ok=True)
    (path / "metrics.jsonl").write_text(
        json.dumps({"step": 0, "val/val/score": 0.5})
        + "\n"
        + "".join(json.dumps({"step": i + 1, **r}) + "\n" for i, r in enumerate(rows))
    )
    (path / "final.json").write_text(
        json.dumps(final or {"collapsed": False, "collapse_step": None, "steps": len(rows)})
    )
    return path


def test_pooled_accuracy_weights_problems_and_keeps_the_scores(tmp_path):
    scores = {"val": [1.0, 0.0, 1.0, 1.0], "val_target": [0.0, 0.0]}
    (tmp_path / "countdown.json").write_text(
        json.dumps({"splits": {s: {"accuracy": sum(v) / len(v), "n": len(v), "scores": v} for s, v in scores.items()}})
    )
    acc = m.pooled_accuracy(tmp_path / "countdown.json", ["val", "val_target"])
    assert acc.value == pytest.approx(50.0) and acc.level == acc.value
    assert acc.noise == pytest.approx(100 * math.sqrt(0.25 / 6)) and acc.samples == (1.0, 0.0, 1.0, 1.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="no splits.test"):
        m.pooled_accuracy(tmp_path / "countdown.json", ["test"])


def test_late_reward_and_its_drop(tmp_path):
    # 30 steps: reward 0.5 for 20 steps, then 0.2 for the last 10
    rewards = [0.5] * 20 + [0.2] * 10
    run = _run(tmp_path / "r", [{"critic/score/mean": r} for r in rewards])
    late = m.late_reward(run / "metrics.jsonl")
    assert late.value == pytest.approx(20.0) and late.samples == tuple([20.0] * 10)
    drop = m.reward_drop(run / "metrics.jsonl")
    assert drop.value == pytest.approx(30.0) and drop.level == pytest.approx(20.0)
    short = _run(tmp_path / "short", [{"critic/score/mean": 0.5}] * 5)
    with pytest.raises(m.TooShortError):
        m.late_reward(short / "metrics.jsonl")


def test_steps_to_collapse_is_the_onset_or_the_runs_length(tmp_path):
    (tmp_path / "final.json").write_text(json.dumps({"collapsed": True, "collapse_step": 41, "steps": 100}))
    assert m.steps_to_collapse(tmp_path).value == 41
    (tmp_path / "final.json").write_text(json.dumps({"collapsed": False, "collapse_step": None, "steps": 100}))
    assert m.steps_to_collapse(tmp_path).value == 100


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
    run = _run(tmp_path / "r", rows)
    assert m.trend_measure("gamma_fall", run).value == pytest.approx(0.02)
    assert m.trend_measure("gclip_rise", run).value == pytest.approx(1.0)
    kl = m.trend_measure("kl_vol_growth", run)
    assert kl.value == pytest.approx(1.0) and kl.noise >= 0  # sd doubles: log2 2
    # a flat series has no volatility: undefined, with the reason (was a -60 sentinel)
    flat = m.trend_measure("clip_vol_growth", run)
    assert math.isnan(flat.value) and "flat" in flat.why and not flat.defined
    assert math.isnan(m.log2_sd([0.02] * 10))
    with pytest.raises(m.TooShortError, match="a trend needs 10"):
        m.trend_measure("gamma_fall", _run(tmp_path / "short", rows[:6]))


def test_a_trend_reads_the_steps_before_the_collapse(tmp_path):
    """γ falls for 30 steps, the run collapses at 31 and γ climbs back to 1: the slope of the whole
    run would reverse the sign; the measure reads steps 1-30 only."""
    gamma = [1.0 - 0.002 * i for i in range(30)] + [0.94 + 0.003 * i for i in range(20)]
    final = {"collapsed": True, "collapse_step": 31, "steps": 50}
    run = _run(tmp_path / "r", [{"router/shift_ratio_mean": g} for g in gamma], final)
    assert m.trend_measure("gamma_fall", run).value == pytest.approx(0.2)
    early = _run(tmp_path / "e", [{"router/shift_ratio_mean": g} for g in gamma], {**final, "collapse_step": 8})
    short = m.trend_measure("gamma_fall", early)
    assert not short.defined and "collapsed at step 8" in short.why


def test_the_noise_of_a_same_seed_pair_reads_the_shared_problems_or_steps():
    # acc: McNemar on the shared problems, far below the two binomial noises combined
    a = m.Measured(50.0, 5.0, 50.0, samples=(1.0, 0.0) * 50)
    b = m.Measured(51.0, 5.0, 51.0, samples=(1.0, 0.0) * 49 + (1.0, 1.0))
    assert m.pair_noise("acc", a, b) == pytest.approx(1.0 * math.sqrt(1 - 1 / 100))
    # reward: two runs whose steps move together (shared prompts) differ by a constant: no noise
    steps = tuple(float(x % 7) for x in range(30))
    ra, rb = m.Measured(3.0, 1.0, samples=steps), m.Measured(2.0, 1.0, samples=tuple(x - 1 for x in steps))
    assert m.pair_noise("reward", ra, rb) == pytest.approx(0.0, abs=1e-12)
    # no aligned samples: the two noises combined
    assert m.pair_noise("gamma_fall", m.Measured(0.1, 0.03), m.Measured(0.2, 0.04)) == pytest.approx(0.05)
