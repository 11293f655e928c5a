"""rspo.report.rule: every outcome of the claims' verdict rule on synthetic runs: not testable
(saturation at 0%, a flat series, a failed precondition), supported, positive but immaterial,
contradicted, not supported, inconclusive; equal paired differences; provisional rows; Holm."""

import math
from dataclasses import replace

import pytest

from rspo.report import measures as m
from rspo.report import rule
from rspo.report.inference import Estimate, interval

RS = rule.Claim("rs-grpo", "RS stabilises GRPO", "Fig. 4", "acc", "grpo-rs0.8", "grpo", 2.0, precondition="stabilises")


def acc(values: dict[int, float], noise: float = 0.5) -> dict[int, m.Measured]:
    return {s: m.Measured(v, noise, level=v) for s, v in values.items()}


def facts(collapsed=False, first=40.0, late=50.0, min_gamma=0.99, clip=0.001):
    return m.RunFacts(collapsed, 10 if collapsed else None, 100, first, late, min_gamma, clip)


@pytest.mark.parametrize(
    "low, high, margin, expected",
    [
        (2.5, 4.0, 2.0, rule.SUPPORTED),  # excludes 0 and the effect (3.25) reaches the margin
        (0.1, 0.3, 2.0, rule.IMMATERIAL),  # excludes 0, effect 0.2 below the margin
        (-3.0, -1.0, 2.0, rule.CONTRADICTED),  # wholly on the wrong side of zero
        (-1.0, 1.5, 2.0, rule.NOT_SUPPORTED),  # a material effect (>= 2) is excluded
        (-1.0, 3.0, 2.0, rule.INCONCLUSIVE),  # includes 0 and a material effect
        (-1.0, 0.5, 0.0, rule.INCONCLUSIVE),  # margin 0: only the opposite direction can refute
        (-1.0, -0.1, 0.0, rule.CONTRADICTED),
        (math.nan, math.nan, 2.0, rule.INCONCLUSIVE),
    ],
)
def test_the_verdict_of_an_interval(low, high, margin, expected):
    est = Estimate((low + high) / 2, low, high, 2, 1.0, 1.0, 0.0)
    assert rule.verdict(est, margin) == expected


def test_a_negative_margin_is_refused():
    with pytest.raises(ValueError, match="margin"):
        rule.verdict(interval([1.0, 2.0]), -1.0)


def test_equal_paired_differences_far_below_the_margin_are_never_supported():
    """The earlier table's one accuracy 'supported': +2 problems of 800 in each of three seeds. With
    the McNemar floor the interval holds 0: inconclusive, and provisional at 3 seeds."""
    t = acc({0: 59.125, 1: 58.625, 2: 57.0}, noise=1.7)
    c = acc({0: 58.875, 1: 58.375, 2: 56.75}, noise=1.7)
    row = rule.paired_row(RS, "mismatch", {"grpo-rs0.8": t, "grpo": c}, {"grpo": {s: facts() for s in t}})
    assert row.mean == pytest.approx(0.25) and row.est.sample_sd == pytest.approx(0.0, abs=1e-9)
    assert row.est.floored and row.est.low < 0 < row.est.high
    assert row.verdict == rule.INCONCLUSIVE and row.provisional
    assert row.verdict_text == "inconclusive (provisional: n < 5)"


def test_an_effect_below_its_margin_is_positive_but_immaterial_never_supported():
    t = acc({s: 50.5 + 0.01 * s for s in range(5)}, noise=0.05)
    c = acc({s: 50.0 for s in range(5)}, noise=0.05)
    row = rule.paired_row(RS, "natural", {"grpo-rs0.8": t, "grpo": c}, {"grpo": {s: facts() for s in t}})
    assert row.est.low > 0 and row.mean < RS.margin and row.verdict == rule.IMMATERIAL
    assert not row.provisional


def test_supported_contradicted_and_not_supported_on_five_seeds():
    c = acc({s: 50.0 for s in range(5)})
    ctx = {"grpo": {s: facts() for s in range(5)}}
    up = rule.paired_row(RS, "natural", {"grpo-rs0.8": acc({s: 55.0 + 0.3 * s for s in range(5)}), "grpo": c}, ctx)
    assert up.verdict == rule.SUPPORTED
    down = rule.paired_row(RS, "natural", {"grpo-rs0.8": acc({s: 45.0 + 0.3 * s for s in range(5)}), "grpo": c}, ctx)
    assert down.verdict == rule.CONTRADICTED and down.est.high < 0
    none = rule.paired_row(
        RS, "natural", {"grpo-rs0.8": acc({s: 50.0 + 0.1 * (s - 2) for s in range(5)}), "grpo": c}, ctx
    )
    assert none.verdict == rule.NOT_SUPPORTED and none.est.low < 0 < none.est.high < RS.margin
    noisy = rule.paired_row(RS, "natural", {"grpo-rs0.8": acc({0: 60, 1: 40, 2: 55, 3: 45, 4: 52}), "grpo": c}, ctx)
    assert noisy.verdict == rule.INCONCLUSIVE


def test_both_arms_at_zero_are_not_testable():
    row = rule.paired_row(
        RS, "stress", {"grpo-rs0.8": acc({0: 0.1, 1: 0.0, 2: 0.2}), "grpo": acc({0: 0.0, 1: 0.0, 2: 0.1})}, {}
    )
    assert row.verdict == rule.NOT_TESTABLE and "both arms at the floor" in row.why and not row.provisional
    assert row.verdict_text.startswith("not testable: both arms at the floor (0.1% and 0.0%)")
    top = rule.paired_row(RS, "x", {"grpo-rs0.8": acc({0: 99.5, 1: 100.0}), "grpo": acc({0: 99.8, 1: 99.9})}, {})
    assert top.verdict == rule.NOT_TESTABLE and "ceiling" in top.why


def test_a_flat_series_makes_the_row_not_testable_with_its_reason():
    vol = rule.Claim("kl-volatile", "ppo_kl grows volatile", "Fig. 6", "kl_vol_growth", "grpo", "", 0.32)
    values = {"grpo": {0: m.Measured(0.5, 0.1), 1: m.undefined("a flat first or last fifth"), 2: m.Measured(0.7, 0.1)}}
    row = rule.paired_row(vol, "stress", values)
    assert row.verdict == rule.NOT_TESTABLE and "grpo s1: a flat first or last fifth" in row.why
    assert math.isnan(row.mean)  # no number is printed for an undefined measure


def test_preconditions_no_drift_and_nothing_to_stabilise():
    trend = rule.Claim("gamma-falls", "γ falls", "Fig. 6", "gamma_fall", "grpo", "", 0.01, precondition="drift")
    calm = {s: facts(min_gamma=0.998, clip=0.001) for s in range(5)}
    values = {"grpo": {s: m.Measured(0.001 * s, 0.001) for s in range(5)}}
    row = rule.paired_row(trend, "natural", values, {"grpo": calm}, calm)
    assert row.verdict == rule.NOT_TESTABLE and "no router drift to observe" in row.why
    drifting = {s: facts(min_gamma=0.93) for s in range(5)}
    assert rule.paired_row(trend, "drift", values, {"grpo": drifting}, drifting).verdict != rule.NOT_TESTABLE
    # the control neither collapses nor learns: nothing to stabilise
    flat = {s: facts(first=50.0, late=50.2) for s in range(5)}
    t, c = acc({s: 52.0 for s in range(5)}), acc({s: 50.0 for s in range(5)})
    row = rule.paired_row(RS, "natural", {"grpo-rs0.8": t, "grpo": c}, {"grpo": flat})
    assert row.verdict == rule.NOT_TESTABLE and "neither collapses nor learns" in row.why
    collapses = {**flat, 3: facts(collapsed=True)}
    assert rule.paired_row(RS, "x", {"grpo-rs0.8": t, "grpo": c}, {"grpo": collapses}).verdict != rule.NOT_TESTABLE


def test_holm_keeps_a_primary_row_from_standing_on_a_family_of_chances():
    """Two primary rows that each exclude 0 on their own at one-sided p ~ 0.02, and a strong third:
    after Holm's correction (x3, x2, x1, kept monotone) the two weak ones are no longer supported;
    an exploratory row with the same numbers is not corrected."""
    c = rule.Claim("k", "k", "p", "acc", "a", "b", 0.1)
    weak = [0.3, 1.4, 0.2, 1.5, 0.6]
    rows = [
        rule.judge(c, "natural", weak, 0.0),
        rule.judge(c, "natural", [w + 0.01 for w in weak], 0.0),
        rule.judge(c, "natural", [3.0, 3.2, 2.9, 3.1, 3.0], 0.0),
        rule.judge(c, "stress", weak, 0.0),
    ]
    assert rows[0].verdict == rule.SUPPORTED and rows[0].est.low > 0
    out = rule.apply_holm(rows, {"a": 0, "b": 1, "c": 2})
    assert [r.primary for r in out] == [True, True, True, False]
    assert out[0].p_holm > 0.025 and out[0].verdict == out[1].verdict == rule.INCONCLUSIVE
    assert out[0].verdict_text.startswith("inconclusive: supported before Holm's correction across the 3")
    assert out[2].verdict == rule.SUPPORTED and out[3].verdict == rule.SUPPORTED and math.isnan(out[3].p_holm)
    assert [r.test for r in out[:3]] == ["sup", "sup", "sup"]
    # the family is the pre-registered list: a primary row that was not built counts with p = 1, so
    # the same rows get the same p whichever other rows a table builds
    more = rule.apply_holm(rows, {"a": 0, "b": 1, "c": 2, "d": None})
    assert more[2].p_holm == pytest.approx(4 / 3 * out[2].p_holm, rel=1e-9) or more[2].p_holm > out[2].p_holm


def test_a_not_supported_primary_row_is_corrected_too():
    """'not supported' is a test (H0: effect >= margin): its non-superiority p enters the family and a
    weak one reads inconclusive after the correction."""
    c = rule.Claim("k", "k", "p", "reward", "a", "b", 1.0)
    near = rule.judge(c, "natural", [0.3, 0.8, -0.2, 0.7, -0.1], 0.0)  # upper bound 0.86, below the margin
    assert near.verdict == rule.NOT_SUPPORTED
    alone = rule.apply_holm([near], {"k": 0})
    family = rule.apply_holm([near], {"k": 0, **{f"x{i}": None for i in range(9)}})
    assert alone[0].test == family[0].test == "non-sup"
    assert alone[0].verdict == rule.NOT_SUPPORTED and alone[0].p_holm < 0.025
    assert family[0].p_holm > alone[0].p_holm and family[0].verdict == rule.INCONCLUSIVE


def test_an_rs_claim_where_rs_does_not_act_is_not_testable_and_gets_an_equivalence_row():
    """RS multiplies the ratio by ~0.999 in the natural regime of the shipped runs: no outcome can move.
    The row says so with the weight's statistics, and an equivalence row (90% interval inside ±margin)
    tests what can be tested: that RS is harmless. Where RS acts (mean γ 0.98), the row is judged."""
    claim = rule.Claim("rs-grpo", "RS stabilises GRPO", "p", "acc", "grpo-rs0.8", "grpo", 2.0, rs=True)
    t = acc({s: 50.0 + 0.2 * s for s in range(5)}, noise=0.3)
    c = acc({s: 50.1 + 0.2 * s for s in range(5)}, noise=0.3)
    calm = {s: m.RunFacts(False, None, 100, 40.0, 50.0, 0.997, 0.003, 0.9986, 0.0018) for s in range(5)}
    rows = rule.paired_rows(claim, "natural", {"grpo-rs0.8": t, "grpo": c}, {"grpo-rs0.8": calm, "grpo": calm})
    assert [r.kind for r in rows] == ["verdict", "equivalence"]
    assert rows[0].verdict == rule.NOT_TESTABLE
    assert rows[0].why == "RS inactive (mean γ 0.9986, 0.18% of tokens at γmin)"
    assert rows[1].verdict == "equivalent" and rows[1].est.high < 2.0 and rows[1].est.low > -2.0
    assert rows[1].verdict_text == "equivalent: RS's mean weight γ 0.9986 here"  # what "equivalent" rests on
    acting = {s: m.RunFacts(False, None, 100, 40.0, 50.0, 0.95, 0.1, 0.98, 0.05) for s in range(5)}
    rows = rule.paired_rows(claim, "stress", {"grpo-rs0.8": t, "grpo": c}, {"grpo-rs0.8": acting, "grpo": calm})
    assert [r.kind for r in rows] == ["verdict"] and rows[0].verdict != rule.NOT_TESTABLE
    assert rule.rs_inactive(replace(claim, rs=False), {"grpo-rs0.8": calm}) == ""  # not RS's claim: no condition
