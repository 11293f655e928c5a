"""rspo.regime_gates: the plug-in gate P(X) and the Sec. 3 gate on synthetic runs, and a search's
outcome over a trials record (which trials judged each gate, which met it), with the record's errors."""

import json

import pytest

from rspo.regime_gates import TrialsError, gate_measures, plugin_gate, read_trials, search_outcome, sec3_gate
from rspo.run_record import Steps


def _run(rewards, collapse=None, gamma=0.995, under=0.0, algo="grpo", seed=0):
    """A run's gate measures from per-step rewards (gate_measures, as `rspo sweep` records them)."""
    train = [
        {"step": i + 1, "critic/score/mean": r, "router/shift_ratio_mean": gamma, "router/shift_clipfrac": under}
        for i, r in enumerate(rewards)
    ]
    if collapse is not None:  # the steps from the collapse on carry another gamma: they must not count
        for row in train[collapse - 1 :]:
            row["router/shift_ratio_mean"], row["router/shift_clipfrac"] = 0.5, 0.5
    measures = gate_measures(Steps.from_lines(enumerate(train, 1), "test"), collapse)
    return {"algo": algo, "seed": seed, "collapsed": collapse is not None, "collapse_step": collapse, **measures}


RISE = [0.5] * 10 + [0.55] * 40 + [0.1] * 50  # learns 5 points, then falls


def test_the_plugin_gate_reads_learning_late_collapse_drift_and_the_frozen_control():
    learned = _run(RISE, collapse=60, gamma=0.985)
    assert learned["learn_gain"] == pytest.approx(0.05) and learned["pre_gamma"] == pytest.approx(0.985)
    flat = _run([0.5] * 100, collapse=30, gamma=0.985)
    assert flat["learn_gain"] == pytest.approx(0.0)
    g = plugin_gate([learned, learned, _run(RISE, gamma=0.985)], None)
    assert (g["p1"], g["p2"], g["p4"], g["p3"]) == (True, True, True, None) and g["outcome"] == "pending p3"
    assert g["collapse_steps"] == [60, 60, None]
    frozen_ok = [_run([0.5] * 100)] * 3
    assert plugin_gate([learned] * 3, frozen_ok)["outcome"] == "meets"
    assert plugin_gate([learned] * 3, [_run([0.5] * 100, collapse=20)] * 3)["outcome"] == "fails: p3"
    # an early collapse (step 30, not after 40) and a seed that never learned
    g = plugin_gate([flat, learned, _run(RISE, collapse=30, gamma=0.985)], None)
    assert g["outcome"] == "fails: p1, p2"
    # drift too small for RS to act: mean ratio above 0.99 and under 1% of tokens below gamma_min
    assert plugin_gate([_run(RISE, collapse=60, gamma=0.995, under=0.005)] * 3, None)["outcome"] == "fails: p4"
    assert plugin_gate([_run(RISE, collapse=60, gamma=0.995, under=0.02)] * 3, None)["p4"] is True


def test_the_sec3_gate_needs_a_late_grpo_collapse_and_a_surviving_gmpo():
    late, early, never = _run(RISE, collapse=60), _run(RISE, collapse=20), _run(RISE)
    assert sec3_gate([late, late, never], [never] * 3, [never] * 3) == "meets"
    assert sec3_gate([late, late, never], [never] * 3, None) == "pending g3"
    assert sec3_gate([late, early, never], [never] * 3, None) == "fails: g1"  # one late collapse of 3
    assert sec3_gate([late] * 3, [never, late, never], [late] * 3) == "fails: g2, g3"


def _trial(name, runs, setting=("optim.router_lr_mult=110",), spec=None):
    spec = spec or {a: [0, 1, 2] for a in dict.fromkeys(r["algo"] for r in runs)}
    return {"name": name, "base": "b", "steps": 100, "set": list(setting), "runs": runs, "runs_spec": spec}


def _seeds(algo, **kw):
    return [_run(RISE, algo=algo, seed=s, **kw) for s in range(3)]


def test_a_search_says_which_trials_judged_each_gate_and_which_met_it(tmp_path):
    # t1: every X learns then collapses late with drift, GMPO too (the Sec. 3 gate fails on g2);
    # GRPO's frozen-router runs come as a trial of their own with the same setting and never collapse
    t1 = _trial("t1", _seeds("grpo", collapse=60, gamma=0.98) + _seeds("gmpo", collapse=60, gamma=0.98))
    t1f = _trial("t1-freeze", _seeds("grpo+freeze"))
    # t2: GRPO collapses late, GMPO never: Sec. 3's g1 and g2 hold, g3 is not run
    t2 = _trial("t2", _seeds("grpo", collapse=70, gamma=0.98) + _seeds("gmpo"), setting=("x=2",))
    out = search_outcome([t1, t1f, t2])
    assert out["grpo"].judged == ("t1", "t2") and out["grpo"].met == ("t1",) and out["grpo"].found
    assert out["gmpo"].judged == ("t1", "t2") and out["gmpo"].met == ()  # t1 pending p3, t2 no collapse
    assert out["gspo"].judged == () and not out["gspo"].found
    assert out["sec3"].judged == ("t1", "t2") and out["sec3"].met == ()  # t2 still pending g3

    path = tmp_path / "trials.jsonl"
    path.write_text("\n".join(json.dumps(t) for t in (t1, t1f, t2)) + "\n")
    assert [t["name"] for t in read_trials(path)] == ["t1", "t1-freeze", "t2"]
    with pytest.raises(TrialsError, match="no such file"):
        read_trials(tmp_path / "absent.jsonl")
    path.write_text(json.dumps(t1) + "\n{not json\n")
    with pytest.raises(TrialsError, match=r"trials.jsonl:2: malformed JSON line"):
        read_trials(path)
    path.write_text('{"name": "x"}\n')
    with pytest.raises(TrialsError, match="line 1: not a trial row"):
        read_trials(path)
    path.write_text("\n")
    with pytest.raises(TrialsError, match="no trials"):
        read_trials(path)


# ----------------------------------------------------------------------------- round 5


def _steps(rewards, *, val0=0.6, val_s=0.6, start=100, gamma=0.999, gamma_after=0.985, under_after=0.0):
    """A run's metrics.jsonl rows: step 0's validation, then one row per step (validation at ``start``);
    the router-shift ratio ``gamma`` up to ``start``, ``gamma_after`` from then on."""
    rows = [{"step": 0, "val/val/score": val0}]
    for i, r in enumerate(rewards, 1):
        after = i > start
        row = {
            "step": i,
            "critic/score/mean": r,
            "router/shift_ratio_mean": gamma_after if after else gamma,
            "router/shift_clipfrac": under_after if after else 0.0,
        }
        if i == start:
            row["val/val/score"] = val_s
        rows.append(row)
    return Steps.from_lines(enumerate(rows, 1), "test")


def test_the_learn_test_is_calibrated_to_the_measured_noise():
    """L1's bar passes a flat series of the measured per-step SD with probability <= 5% (one-sided
    normal point over the 20-step and 10-step means), and round 4's p1 (best window + 2 points) with
    far more: the reason round 5 replaced it."""
    import random

    from rspo.regime_gates import LEARN_BEFORE, LEARN_MIN, drift_measures
    from rspo.run_record import FIRST_STEPS, NOISE_SD

    assert LEARN_MIN == 0.048 >= 1.6449 * NOISE_SD * (1 / LEARN_BEFORE + 1 / FIRST_STEPS) ** 0.5
    rng = random.Random(0)
    flats = [[0.6 + rng.gauss(0, NOISE_SD) for _ in range(230)] for _ in range(2000)]
    passed = sum(drift_measures(_steps(f), 100, None)["learn"] >= LEARN_MIN for f in flats) / len(flats)
    assert passed <= 0.06
    p1 = (
        sum(gate_measures(_steps(f[:150], gamma=1.0, gamma_after=1.0), None)["learn_gain"] >= 0.02 for f in flats[:300])
        / 300
    )
    assert p1 > 0.5
    noise = drift_measures(_steps(flats[0]), 100, None)["noise"]
    assert noise == pytest.approx(NOISE_SD, rel=0.25)


def _drift_run(rewards, collapse=None, algo="grpo", seed=0, **kw):
    from rspo.regime_gates import drift_measures

    return {
        "algo": algo,
        "seed": seed,
        "collapsed": collapse is not None,
        "collapse_step": collapse,
        **drift_measures(_steps(rewards, **kw), 100, collapse),
    }


LEARNS_THEN_FALLS = [0.5] * 10 + [0.6] * 100 + [0.1] * 120  # +10 points by step 100, falls after


def test_the_learn_then_drift_gate_reads_learning_heldout_late_collapse_drift_and_control():
    from rspo.regime_gates import learn_then_drift_gate

    x = [_drift_run(LEARNS_THEN_FALLS, collapse=150, seed=s) for s in range(5)]
    assert x[0]["learn"] == pytest.approx(0.1) and x[0]["post_gamma"] == pytest.approx(0.985)
    never = [_drift_run([0.6] * 230, algo="grpo+freeze", seed=s) for s in range(3)]
    g = learn_then_drift_gate(x, never, 100)
    assert g["outcome"] == "meets" and g["collapse_steps"] == [150] * 5
    assert learn_then_drift_gate(x, None, 100)["outcome"] == "pending L4"
    # two collapses after S of five, one before S (not "after S"), a flat seed, held-out 3 points down at S
    mixed = x[:2] + [_drift_run(LEARNS_THEN_FALLS, collapse=90, seed=2)] + [_drift_run([0.5] * 230, seed=3)]
    mixed.append(_drift_run(LEARNS_THEN_FALLS, seed=4, val_s=0.57))
    assert learn_then_drift_gate(mixed, never, 100)["outcome"] == "fails: L1, L2, L3"
    # drift RS would not act on after S, and a frozen control that collapses
    quiet = [
        _drift_run(LEARNS_THEN_FALLS, collapse=150, seed=s, gamma_after=0.998, under_after=0.002) for s in range(5)
    ]
    assert learn_then_drift_gate(quiet, never[:2] + [_drift_run([0.6] * 230, collapse=200)], 100)["outcome"] == (
        "fails: L4, L5"
    )


def test_the_buildup_gate_needs_grpo_to_learn_first_then_collapse_and_gmpo_to_survive():
    from rspo.regime_gates import buildup_gate

    grpo = [_drift_run(LEARNS_THEN_FALLS, collapse=c, seed=s) for s, c in enumerate((150, 170, None))]
    gmpo = [_drift_run(LEARNS_THEN_FALLS, algo="gmpo", seed=s) for s in range(3)]
    assert buildup_gate(grpo, gmpo, gmpo)["outcome"] == "meets"
    assert buildup_gate(grpo, gmpo, None)["outcome"] == "pending D3"
    early = [_drift_run([0.5] * 230, collapse=60, seed=s) for s in range(3)]  # falls before it learns
    assert buildup_gate(early, gmpo[:2] + grpo[:1], None)["outcome"] == "fails: D0, D1, D2"


def test_drift_outcomes_judge_scheduled_trials_from_their_steps_and_leave_round_4_gates_alone():
    """A step schedule is judged by L(X) with X+freeze found in another trial of the same setting, a
    rise by D; neither is judged by round 4's P(X) (plugin_outcomes)."""
    from rspo.regime_gates import drift_outcomes, plugin_outcomes

    step = ["optim.router_lr_mult_final=150", "optim.router_lr_change=[100, 100]"]
    rise = ["optim.router_lr_mult_final=150", "optim.router_lr_change=[0, 200]"]
    steps = {}

    def run(trial, algo, seed, rewards, collapse=None):
        steps[(trial, algo, seed)] = _steps(rewards)
        return {
            "algo": algo,
            "seed": seed,
            "collapsed": collapse is not None,
            "collapse_step": collapse,
            **gate_measures(_steps(rewards), collapse),
        }

    a = _trial(
        "r5a", [run("r5a", "gmpo", s, LEARNS_THEN_FALLS, 140) for s in range(5)], step, {"gmpo": [0, 1, 2, 3, 4]}
    )
    f = _trial(
        "r5a-freeze",
        [run("r5a-freeze", "gmpo+freeze", s, [0.6] * 230) for s in range(3)],
        step,
        {"gmpo+freeze": [0, 1, 2]},
    )
    b = _trial(
        "r5b",
        [
            run("r5b", m, s, LEARNS_THEN_FALLS, 150 if m == "grpo" else None)
            for m in ("grpo", "gmpo", "gmpo+freeze")
            for s in range(3)
        ],
        rise,
        {"grpo": [0, 1, 2], "gmpo": [0, 1, 2], "gmpo+freeze": [0, 1, 2]},
    )
    for t in (a, f, b):
        t["steps"] = 230
    out = drift_outcomes([a, f, b], lambda name, m, s: steps[(name, m, s)])
    assert [(t["name"], gate, x, g["outcome"]) for t, gate, x, g in out] == [
        ("r5a", "L", "gmpo", "meets"),
        ("r5b", "D", "grpo", "meets"),
    ]
    assert plugin_outcomes([a, f, b]) == []
