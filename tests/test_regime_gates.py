"""rspo.regime_gates: the plug-in gate P(X) and the Sec. 3 gate on synthetic runs, and a search's
outcome over a trials record (which trials judged each gate, which met it), with the record's errors."""

import json

import pytest

from rspo.regime_gates import TrialsError, gate_measures, plugin_gate, read_trials, search_outcome, sec3_gate


def _run(rewards, collapse=None, gamma=0.995, under=0.0, algo="grpo", seed=0):
    """A run's gate measures from per-step rewards (gate_measures, as `rspo sweep` records them)."""
    train = [
        {"step": i + 1, "critic/score/mean": r, "router/shift_ratio_mean": gamma, "router/shift_clipfrac": under}
        for i, r in enumerate(rewards)
    ]
    if collapse is not None:  # the steps from the collapse on carry another gamma: they must not count
        for row in train[collapse - 1 :]:
            row["router/shift_ratio_mean"], row["router/shift_clipfrac"] = 0.5, 0.5
    measures = gate_measures(train, collapse)
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
    with pytest.raises(TrialsError, match="line 2: not JSON"):
        read_trials(path)
    path.write_text('{"name": "x"}\n')
    with pytest.raises(TrialsError, match="line 1: not a trial row"):
        read_trials(path)
    path.write_text("\n")
    with pytest.raises(TrialsError, match="no trials"):
        read_trials(path)
