"""rspo.report.inference: the floored t interval, the MDE against a power table, Holm's adjustment,
the McNemar SD of a paired accuracy difference and the block bootstrap."""

import math
import statistics

import pytest

from rspo.report.inference import block_bootstrap_sd, holm, interval, mcnemar_sd, mde, p_above_zero


def test_the_interval_matches_the_textbook_value_when_the_seeds_spread_more_than_the_floor():
    est = interval([1.0, 2.0, 3.0], floor=0.5)
    # mean 2, s = 1, t(0.975, 2) = 4.302653
    assert (est.mean, est.n, est.sd, est.floored) == (2.0, 3, 1.0, False)
    assert est.low == pytest.approx(2 - 4.302653 / math.sqrt(3), rel=1e-6)
    assert est.high == pytest.approx(2 + 4.302653 / math.sqrt(3), rel=1e-6)


def test_equal_differences_get_the_floor_not_a_zero_width_interval():
    """The shipped study's mismatch row: each seed's paired difference exactly +0.25 points (2 of 800
    problems), McNemar SD 0.78 per difference: the interval is [-1.68, +2.18], not [+0.25, +0.25]."""
    est = interval([0.25, 0.25, 0.25], floor=0.78)
    assert est.sample_sd == 0.0 and est.sd == 0.78 and est.floored
    assert (round(est.low, 2), round(est.high, 2)) == (-1.69, 2.19)
    assert est.high - est.low > 3
    # no floor and no spread: no interval at all (nan), never a zero-width one
    bare = interval([0.25, 0.25, 0.25])
    assert math.isnan(bare.low) and math.isnan(bare.high)
    one = interval([1.0], floor=1.0)
    assert one.n == 1 and math.isnan(one.low)


def test_mde_reproduces_the_power_table():
    """80% power, two-sided 5%, noncentral t: the evidence table's paired-reward row (SD 0.44) and
    final-accuracy row (SD 1.81)."""
    assert mde(0.44, 3) == pytest.approx(1.4, abs=0.06)
    assert mde(0.44, 5) == pytest.approx(0.7, abs=0.05)
    assert mde(1.81, 3) == pytest.approx(5.9, abs=0.1)
    assert mde(1.81, 10) == pytest.approx(1.8, abs=0.05)
    assert math.isnan(mde(1.0, 1)) and math.isnan(mde(0.0, 5))


def test_p_above_zero_is_one_sided_and_holm_steps_down():
    est = interval([1.0, 1.2, 0.8, 1.1, 0.9])
    p = p_above_zero(est)
    assert 0 < p < 1e-3
    assert p_above_zero(interval([-1.0, -1.2, -0.8])) > 0.5
    adj = holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": math.nan})
    # sorted 0.01, 0.03, 0.04 times 3, 2, 1, kept monotone
    assert adj["a"] == pytest.approx(0.03) and adj["c"] == pytest.approx(0.06) and adj["b"] == pytest.approx(0.06)
    assert math.isnan(adj["d"])


def test_mcnemar_sd_of_a_paired_accuracy_difference():
    # 18 problems only a solves, 16 only b, 800 problems: (34 - 4/800) / 800^2
    a = [1.0] * 18 + [0.0] * 16 + [1.0] * 300 + [0.0] * 466
    b = [0.0] * 18 + [1.0] * 16 + [1.0] * 300 + [0.0] * 466
    assert mcnemar_sd(a, b) == pytest.approx(100 * math.sqrt((34 - 4 / 800) / 800**2))
    assert mcnemar_sd(a, a) == 0.0
    with pytest.raises(ValueError, match="same problems"):
        mcnemar_sd(a, b[:-1])


def test_block_bootstrap_sd_is_deterministic_and_near_the_textbook_se_for_independent_steps():
    import random

    rng = random.Random(0)
    xs = [rng.gauss(0, 1) for _ in range(200)]
    sd = block_bootstrap_sd(len(xs), lambda idx: statistics.fmean(xs[i] for i in idx))
    assert sd == block_bootstrap_sd(len(xs), lambda idx: statistics.fmean(xs[i] for i in idx))
    assert sd == pytest.approx(1 / math.sqrt(200), rel=0.3)
    assert math.isnan(block_bootstrap_sd(6, lambda idx: 0.0))  # fewer than two blocks
