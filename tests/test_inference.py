"""rspo.report.inference: the floored t interval, the MDE against a power table, Holm's adjustment,
the McNemar SD of a paired accuracy difference, the block jackknife, and the densities the power
integrals use."""

import math
import statistics

import pytest

from rspo.report.inference import (
    block_jackknife_sd,
    equivalent,
    holm,
    interval,
    mcnemar_sd,
    mde,
    p_above_zero,
    p_below,
    pooled_sd,
    power,
)


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


def test_the_block_jackknife_of_a_mean_is_the_batch_means_standard_error_and_uses_no_random_numbers(monkeypatch):
    import random

    import numpy as np

    rng = random.Random(0)
    xs = [rng.gauss(0, 1) for _ in range(200)]
    monkeypatch.setattr(np.random, "default_rng", lambda *a, **k: (_ for _ in ()).throw(AssertionError("an RNG")))
    sd = block_jackknife_sd(len(xs), lambda idx: statistics.fmean(xs[i] for i in idx))
    batches = [statistics.fmean(xs[i : i + 5]) for i in range(0, 200, 5)]
    assert sd == pytest.approx(statistics.stdev(batches) / math.sqrt(len(batches)), rel=1e-9)
    assert sd == pytest.approx(1 / math.sqrt(200), rel=0.3)  # independent steps: near the textbook SE
    assert math.isnan(block_jackknife_sd(9, lambda idx: 0.0))  # fewer than two blocks


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_the_mde_has_80_percent_power_by_an_independent_simulation_also_at_n_2(n):
    """At n = 2 scipy's noncentral t gives no number for large effects; the bisection once read that
    as power reached (5.44 SD instead of 11.55). A simulation of the t-test (fixed seed, 400k
    experiments) at the MDE rejects 80% of the time."""
    import numpy as np
    from scipy import stats

    effect = mde(1.0, n)
    assert math.isfinite(effect) and power(effect, 1.0, n) == pytest.approx(0.8, abs=1e-6)
    if n == 2:
        assert effect == pytest.approx(11.55, abs=0.01)
    rng = np.random.default_rng(12345)
    d = rng.normal(effect, 1.0, size=(400_000, n))
    t = d.mean(1) / (d.std(1, ddof=1) / math.sqrt(n))
    rejected = np.mean(np.abs(t) > stats.t.ppf(0.975, n - 1))
    assert rejected == pytest.approx(0.80, abs=0.004)
    assert not math.isnan(power(50.0, 1.0, 2)) and power(50.0, 1.0, 2) > 0.95  # never a NaN read as power


def test_pooled_sd_weights_each_row_by_its_degrees_of_freedom():
    assert pooled_sd([(1.0, 3), (2.0, 5)]) == pytest.approx(math.sqrt((2 * 1 + 4 * 4) / 6))
    assert math.isnan(pooled_sd([(float("nan"), 3)])) and pooled_sd([(1.5, 4), (float("nan"), 3)]) == 1.5


def test_non_superiority_and_equivalence_are_the_one_sided_tests_of_the_interval():
    est = interval([0.2, -0.1, 0.3, 0.1, 0.0])
    assert p_below(est, 1.0) < 0.01 < p_above_zero(est)  # far below a margin of 1, not above 0
    assert p_below(est, 0.0) == pytest.approx(1 - p_above_zero(est))
    assert equivalent([0.2, -0.1, 0.3, 0.1, 0.0], 0.0, 1.0)[0] == "equivalent"
    assert equivalent([3.1, 2.9, 3.2, 3.0], 0.0, 1.0)[0] == "not equivalent"
    word, e90 = equivalent([1.0, -1.0, 0.5], 0.0, 1.0)
    assert (
        word == "inconclusive" and e90.high - e90.low < interval([1.0, -1.0, 0.5]).high - interval([1.0, -1.0, 0.5]).low
    )


def test_the_rules_mde_needs_the_mean_at_the_margin_and_the_family_corrected_test():
    """P(supported) at a true effect equal to the margin is at most 0.5 at any n (the mean must reach
    it), the power grows with the effect, and a larger Holm family needs a larger effect; the preset's
    power table is this function's (configs/small.yaml)."""
    from rspo.report.inference import rule_mde, rule_power, sd_upper

    for n in (3, 5, 8):
        assert rule_power(1.0, 0.5, n, 1.0) <= 0.5 + 1e-9
        assert rule_power(2.0, 0.5, n, 1.0) > rule_power(1.5, 0.5, n, 1.0)
    assert rule_mde(0.684, 5, 1.0, 21) > rule_mde(0.684, 5, 1.0, 6) > rule_mde(0.684, 5, 1.0, 1) > 1.0
    assert round(rule_mde(0.684, 5, 1.0, 1), 1) == 1.3 and round(rule_mde(0.809, 5, 1.0, 21), 1) == 3.1
    assert sd_upper(0.489, 6) == pytest.approx(0.684, abs=0.002) and sd_upper(0.613, 8) == pytest.approx(
        0.809, abs=0.002
    )


def test_the_integrals_densities_are_scipys_own_numbers_bit_for_bit():
    """The power integrals call scipy.special directly (rspo.report.inference._chi2_density, _norm_sf) for
    speed: the same floats as scipy.stats' chi2.pdf and norm.sf / norm.cdf, so no MDE moves."""
    import random

    from scipy import stats

    from rspo.report.inference import _chi2_density, _norm_sf

    rng = random.Random(0)
    for _ in range(2000):
        df = rng.choice([1, 2, 3, 4, 9])
        v = rng.choice([0.0, rng.random() * 1e-6, rng.random(), rng.random() * 60, rng.random() * 3000])
        assert _chi2_density(df)(v) == float(stats.chi2.pdf(v, df)), (v, df)
        x = rng.gauss(0, 5) * rng.choice([1, 10])
        assert _norm_sf(x) == float(stats.norm.sf(x)) == float(stats.norm.cdf(-x)), x
