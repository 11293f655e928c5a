"""Collapse detector: fires on a reward drop WITH a KL/grad spike, not on either alone; with
``sustain`` also on a drop held that many steps without a spike (the runs it once missed)."""

import json
from pathlib import Path

import pytest

from rspo.config import TrackingConfig
from rspo.train.collapse import CollapseDetector

SERIES = json.loads((Path(__file__).parent / "fixtures" / "collapse_series.json").read_text())["runs"]


def feed(det, rewards, kls):
    fired = []
    for step, (r, k) in enumerate(zip(rewards, kls), start=1):
        if det.update(step, {"critic/score/mean": r, "actor/ppo_kl": k, "actor/grad_norm": 1.0}):
            fired.append(step)
    return fired


def test_fires_on_drop_with_kl_spike():
    det = CollapseDetector(window=3, drop=0.5, spike=5.0)
    rewards = [0.6] * 10 + [0.05] * 4
    kls = [0.01] * 10 + [0.2] * 4
    assert feed(det, rewards, kls) == [12]
    assert det.fired and det.step == 12


def test_no_fire_on_drop_without_spike_or_spike_without_drop():
    assert feed(CollapseDetector(3, 0.5, 5.0), [0.6] * 10 + [0.05] * 4, [0.01] * 14) == []
    assert feed(CollapseDetector(3, 0.5, 5.0), [0.6] * 14, [0.01] * 10 + [0.5] * 4) == []


def test_state_round_trip():
    a = CollapseDetector(3, 0.5, 5.0)
    feed(a, [0.6] * 10, [0.01] * 10)
    b = CollapseDetector(3, 0.5, 5.0)
    b.load_state_dict(a.state_dict())
    assert feed(a, [0.05] * 4, [0.2] * 4) == feed(b, [0.05] * 4, [0.2] * 4)


def test_a_drop_held_for_sustain_steps_fires_at_its_onset_without_a_spike():
    rewards, kls = [0.6] * 10 + [0.05] * 12, [0.01] * 22
    det = CollapseDetector(window=3, drop=0.5, spike=5.0, sustain=5)
    # windowed means: step 11 is 0.42 (not down), step 12 is 0.23 (down): down from step 12 on,
    # the fifth down step in a row is 16, and the collapse is dated at its onset
    assert feed(det, rewards, kls) == [16]
    assert (det.step, det.kind) == (12, "sustained")
    assert feed(CollapseDetector(3, 0.5, 5.0, sustain=0), rewards, kls) == []  # off: the spike rule alone
    # a dip shorter than sustain steps is not a collapse
    assert feed(CollapseDetector(3, 0.5, 5.0, sustain=5), [0.6] * 10 + [0.05] * 4 + [0.6] * 10, [0.01] * 24) == []


def test_a_spike_fires_at_its_step_and_says_so():
    det = CollapseDetector(window=3, drop=0.5, spike=5.0, sustain=5)
    feed(det, [0.6] * 10 + [0.05] * 4, [0.01] * 10 + [0.2] * 4)
    assert (det.step, det.kind) == (12, "spike")


def _detect(name: str) -> CollapseDetector:
    t = TrackingConfig()
    det = CollapseDetector(t.collapse_window, t.collapse_drop, t.collapse_kl_spike, t.collapse_sustain)
    for step, reward, kl, grad in SERIES[name]:
        det.update(step, {"critic/score/mean": reward, "actor/ppo_kl": kl, "actor/grad_norm": grad})
    return det


@pytest.mark.parametrize("name", ["stress-grpo-s2", "stress-grpo-rs0.8-s2", "stress-gspo-s2"])
def test_the_runs_the_spike_rule_missed_are_caught_by_the_defaults(name):
    """Three stress runs of the earlier small study fell to 0-1% validation accuracy with no KL or
    grad-norm spike; the spike rule alone never fired on them. The preset defaults catch them."""
    assert not _detect_spike_only(name).fired
    det = _detect(name)
    assert det.fired and det.kind == "sustained" and det.step <= 20, (det.step, det.kind)


def _detect_spike_only(name: str) -> CollapseDetector:
    t = TrackingConfig()
    det = CollapseDetector(t.collapse_window, t.collapse_drop, t.collapse_kl_spike, sustain=0)
    for step, reward, kl, grad in SERIES[name]:
        det.update(step, {"critic/score/mean": reward, "actor/ppo_kl": kl, "actor/grad_norm": grad})
    return det


def test_a_natural_run_that_learned_never_fires():
    assert not _detect("gmpo-s0").fired
