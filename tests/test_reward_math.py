"""Math reward (rspo.rewards.math) and its worker pool (rspo.rewards.pool)."""

from __future__ import annotations

import signal
import textwrap
import threading

import pytest

from rspo.evaluate.benchmarks import DEFAULT_MATH_SUITE as DATA  # the vendored suite
from rspo.rewards import math as mreward
from rspo.rewards.math import extract_boxed, score, score_batch
from rspo.rewards.pool import TimeoutPool


def boxed(x: str) -> str:
    return "Let me think.\nSo the final answer is $\\boxed{" + x + "}$."


# (gold, prediction inside \boxed{}) pairs that math-verify 0.9.0 must accept.
EQUIVALENT = [
    ("\\frac{1}{2}", "0.5"),
    ("\\frac{1}{2}", "1/2"),
    ("0.5", "\\frac12"),
    ("\\dfrac{1}{2}", "\\frac{1}{2}"),
    ("1/2", "\\tfrac{1}{2}"),
    ("[1,2)", "[1, 2)"),
    ("(0,\\infty)", "(0, \\infty)"),
    ("(1,2)", "(1, 2)"),  # tuple / open interval, same parse on both sides
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\pi/2)"),
    ("5", "5 cm"),  # units are dropped by math-verify's normalisation
    ("5", "5\\text{ cm}"),
    ("5 \\text{ cm}", "5"),
    ("025", "25"),  # AIME zero padding
    ("25", "025"),
    ("142", "142.0"),
    ("\\sqrt{2}/2", "\\frac{\\sqrt2}{2}"),
    ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}"),
    ("50\\%", "50"),  # percent: both 50 and 0.5 accepted
    ("50\\%", "0.5"),
    ("-3", "-3"),
    ("-\\frac{1}{3}", "-1/3"),
    ("\\{1,2\\}", "\\{2,1\\}"),
    ("\\{1,2\\}", "1,2"),
    ("90^\\circ", "90"),
    ("x=5", "5"),
    ("3\\sqrt{3}", "\\sqrt{27}"),
    ("p - q", "-q+p"),
    ("10^{6}", "1000000"),
    ("1,000", "1000"),
    ("\\text{(C)}", "C"),
    ("0.5", "0.5000001"),  # float_rounding=6
    ("$\\frac{1}{2 n+2}$", "\\frac{1}{2(n+1)}"),  # OlympiadBench golds carry $...$
]

# Near misses that must score 0.
DIFFERENT = [
    ("\\frac{1}{2}", "0.51"),
    ("0.5", "0.500001"),
    ("[1,2)", "[1,2]"),
    ("(0,\\infty)", "[0,\\infty)"),
    ("(1,2)", "(2,1)"),
    ("025", "26"),
    ("-3", "3"),
    ("\\sqrt{2}/2", "\\sqrt{2}"),
    ("\\{1,2\\}", "\\{1,3\\}"),
    ("142", "1420"),
    ("5", "5.1"),
    ("p-q", "q-p"),
    ("\\text{(C)}", "\\text{(D)}"),
    ("\\text{east}", "\\text{seat}"),
]


@pytest.mark.parametrize("gold,pred", EQUIVALENT)
def test_equivalent_answers_score_one(gold, pred):
    assert score(boxed(pred), gold) == (1.0, "ok")


@pytest.mark.parametrize("gold,pred", DIFFERENT)
def test_near_misses_score_zero(gold, pred):
    reward, reason = score(boxed(pred), gold)
    assert reward == 0.0
    assert reason.startswith("wrong answer: got ")


def test_numeric_golds():
    assert score(boxed("142"), 142.0) == (1.0, "ok")  # AMC floats
    assert score(boxed("7"), 7) == (1.0, "ok")
    assert score(boxed("0.25"), 0.25) == (1.0, "ok")
    assert score(boxed("143"), 142.0)[0] == 0.0


def test_list_gold_any_match_counts():
    golds = ["$2n-2$", "$2(n-1)$"]
    assert score(boxed("2(n-1)"), golds) == (1.0, "ok")
    assert score(boxed("2n-2"), golds) == (1.0, "ok")
    reward, reason = score(boxed("2n"), golds)
    assert reward == 0.0 and "expected $2n-2$ | $2(n-1)$" in reason


def test_reasons():
    assert score("The answer is 5.", "5") == (0.0, "no boxed answer")
    assert score("cut off: \\boxed{\\frac{1}{2", "0.5") == (0.0, "no boxed answer")
    assert score(boxed("7"), "5") == (0.0, "wrong answer: got 7, expected 5")
    assert score("\\boxed{}", "5")[1].startswith("wrong answer: got empty")


def test_last_boxed_wins_and_fbox():
    assert score("\\boxed{5} no wait \\boxed{6}", "6") == (1.0, "ok")
    assert score("\\boxed{6} no wait \\boxed{5}", "6")[0] == 0.0
    assert score("\\boxed{5} then \\fbox{6}", "6") == (1.0, "ok")
    assert score("\\boxed 6$.", "6") == (1.0, "ok")


def test_extract_boxed_nested_and_escaped_braces():
    assert extract_boxed("x \\boxed{\\frac{a}{b}} y") == "\\frac{a}{b}"
    assert extract_boxed("\\boxed{\\frac{\\sqrt{2}}{2}}") == "\\frac{\\sqrt{2}}{2}"
    assert extract_boxed("\\boxed{\\{1,2\\}}") == "\\{1,2\\}"
    assert extract_boxed("\\boxed{\\left\\{ 1 \\right.}") == "\\left\\{ 1 \\right."
    assert extract_boxed("\\boxed { 3 }") == " 3 "
    assert extract_boxed("\\boxed{3") is None
    assert extract_boxed("no box") is None
    assert score("\\boxed{\\frac{a}{b}}", "a/b") == (1.0, "ok")


def test_bad_gold_is_a_clear_error():
    for bad in (None, [], "", True, {"a": 1}, float("nan")):
        with pytest.raises(ValueError, match="gold"):
            score(boxed("1"), bad)
    with pytest.raises(TypeError):
        score(None, "1")
    with pytest.raises(ValueError, match="differ in length"):
        score_batch(["a"], ["1", "2"])


def test_score_batch_matches_score_and_keeps_order():
    pairs = [("1/2", "0.5"), ("7", "5"), ("025", "25"), ("x", "1"), ("[1,2)", "[1,2)")]
    comps = [boxed(p) if p != "x" else "no answer" for p, _ in pairs]
    golds = [g for _, g in pairs]
    expected = [score(c, g) for c, g in zip(comps, golds)]
    assert score_batch(comps, golds, workers=2) == expected
    assert score_batch([], [], workers=2) == []


def test_pathological_input_is_contained_by_the_batch_timeout():
    # 10^(10^(10^10)): sympy tries to evaluate the power and never returns on its own.
    comps = [boxed("10^{10^{10^{10}}}"), boxed("5"), boxed("6")]
    out = score_batch(comps, ["5", "5", "5"], workers=2, timeout=1.0)
    assert out[0] == (0.0, "timeout")
    assert out[1] == (1.0, "ok")
    assert out[2][0] == 0.0 and out[2][1].startswith("wrong answer")
    # In the main thread math-verify's own alarm also catches it.
    assert score(comps[0], "5", timeout=1) == (0.0, "timeout")


def test_hung_and_crashed_workers_score_zero_and_are_replaced(tmp_path, monkeypatch):
    # A scorer that ignores SIGALRM and spins (only the hard kill stops it) or kills its
    # own process; score_batch must still answer every item and keep working.
    (tmp_path / "fake_scorer_rspo.py").write_text(
        textwrap.dedent(
            """
            import os, signal

            def score(completion, answer):
                if completion == "hang":
                    signal.signal(signal.SIGALRM, signal.SIG_IGN)
                    while True:
                        pass
                if completion == "crash":
                    os._exit(3)
                return (1.0, "ok")
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    pool = TimeoutPool("fake_scorer_rspo:score", workers=2, grace=0.5)
    monkeypatch.setattr(mreward, "_pool", lambda workers: pool)
    try:
        out = score_batch(["hang", "crash", "a", "b", "hang", "c"], ["1"] * 6, timeout=0.5)
        assert out[0] == (0.0, "timeout")
        assert out[1] == (0.0, "verifier crashed: worker exited with code 3")
        assert out[2:4] == [(1.0, "ok"), (1.0, "ok")]
        assert out[4] == (0.0, "timeout")
        assert out[5] == (1.0, "ok")
        assert score_batch(["d"], ["1"], timeout=0.5) == [(1.0, "ok")]
    finally:
        pool.close()


def test_score_and_score_batch_from_a_thread():
    results = {}

    def run():
        results["batch"] = score_batch([boxed("1/2"), boxed("3")], ["0.5", "4"], workers=2)
        results["single"] = score(boxed("\\dfrac{1}{2}"), "0.5")  # routed to the pool

    th = threading.Thread(target=run)
    th.start()
    th.join(120)
    assert results["batch"][0] == (1.0, "ok") and results["batch"][1][0] == 0.0
    assert results["single"] == (1.0, "ok")


def test_pool_soft_hard_timeouts_and_crashes():
    pool = TimeoutPool("time:sleep", workers=2, grace=0.5)
    try:
        out = pool.map([(0.01,), (30,), (0.01,)], timeout=0.5)
        assert [o.status for o in out] == ["ok", "timeout", "ok"]
        assert out[1].detail == "soft deadline"
    finally:
        pool.close()
    pool = TimeoutPool("signal:raise_signal", workers=1, grace=0.5)
    try:
        # SIGSTOP: the worker no longer runs, so only the hard deadline can end the item.
        stop, kill = pool.map([(signal.SIGSTOP,), (signal.SIGKILL,)], timeout=0.5)
        assert stop.status == "timeout" and "killed" in stop.detail
        assert kill.status == "crash" and "SIGKILL" in kill.detail
    finally:
        pool.close()
    pool = TimeoutPool("math:sqrt", workers=1)
    try:
        ok, err = pool.map([(4.0,), (-1.0,)], timeout=5)
        assert ok.value == 2.0 and err.status == "error" and "ValueError" in err.detail
    finally:
        pool.close()
    with pytest.raises(RuntimeError, match="closed"):
        pool.submit((1.0,), timeout=1)


def test_pool_with_unimportable_target_breaks_instead_of_looping():
    pool = TimeoutPool("rspo_no_such_module_xyz:f", workers=1)
    try:
        with pytest.raises(RuntimeError, match="broken"):
            pool.map([(1,)], timeout=5)
    finally:
        pool.close()


def _read_split(split: str):
    pa = pytest.importorskip("pyarrow")
    path = DATA / split / "data-00000-of-00001.arrow"  # vendored: a missing file is a broken checkout
    return pa.ipc.open_stream(pa.memory_map(str(path))).read_all().column("answer").to_pylist()


@pytest.mark.parametrize("split", ["aime", "amc", "math", "minerva", "olympiad_bench"])
def test_every_gold_of_the_eval_suite_matches_itself(split):
    answers = _read_split(split)
    comps = ["\\boxed{" + mreward._gold_strings(a[0] if isinstance(a, list) else a)[0] + "}" for a in answers]
    out = score_batch(comps, answers, workers=2, timeout=10)
    failures = [(i, a, r) for i, (a, r) in enumerate(zip(answers, out)) if r != (1.0, "ok")]
    assert failures == []
    assert len(answers) == {"aime": 30, "amc": 83, "math": 500, "minerva": 272, "olympiad_bench": 675}[split]


def test_no_stray_signal_handler_left_in_main_thread():
    before = signal.getsignal(signal.SIGALRM)
    score(boxed("1/2"), "0.5")
    assert signal.getsignal(signal.SIGALRM) == before
    assert signal.alarm(0) == 0  # no pending alarm


def test_a_parse_that_fails_is_a_reason_not_an_exception():
    from math_verify.errors import TimeoutException

    from rspo.rewards.math import _parse_or_why

    def slow(text, timeout):
        raise TimeoutException()

    def broken(text, timeout):
        raise ValueError("bad latex")

    assert _parse_or_why(lambda text, timeout: (text,), "x", 5, "") == ("x",)
    assert _parse_or_why(slow, "x", 5, "") == "timeout"
    assert _parse_or_why(broken, "x", 5, "cannot parse gold 'x': ") == (
        "verifier error: cannot parse gold 'x': ValueError: bad latex"
    )
