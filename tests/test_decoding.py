"""rspo.evaluate.decoding: every decoding setting reaches the generator or is refused; avg@k keeps
each run's score, its spread and the seed; greedy decoding draws one sample whatever is asked."""

import statistics

import pytest

from rspo.evaluate import benchmarks as B
from rspo.evaluate import suites as S
from rspo.evaluate.decoding import Decoding, generate, run_scores


def test_settings_reach_the_generator_that_takes_them():
    seen = {}

    def gen(prompts, n, temperature, *, max_new_tokens=None, top_p=None, top_k=None, seed=None):
        seen.update(n=n, temperature=temperature, max_new_tokens=max_new_tokens, top_p=top_p, top_k=top_k, seed=seed)
        return [["x"] * n for _ in prompts]

    d = Decoding(temperature=0.6, top_p=0.95, top_k=20, max_new_tokens=99, seed=7)
    assert generate(gen, ["a", "b"], 3, d) == [["x"] * 3] * 2
    assert seen == {"n": 3, "temperature": 0.6, "max_new_tokens": 99, "top_p": 0.95, "top_k": 20, "seed": 7}

    def kwargs_gen(prompts, n, temperature, **kw):
        seen.clear()
        seen.update(kw)
        return [["x"] * n for _ in prompts]

    generate(kwargs_gen, ["a"], 1, d)
    assert seen == {"max_new_tokens": 99, "top_p": 0.95, "top_k": 20, "seed": 7}


def test_the_generators_sampling_is_the_decodings():
    from rspo.rollout import Sampling

    d = Decoding(temperature=0.6, top_p=0.95, top_k=20, max_new_tokens=99, samples={"aime24": 4}, seed=7)
    assert d.sampling() == Sampling(temperature=0.6, top_p=0.95, top_k=20, max_new_tokens=99, seed=7)
    with pytest.raises(ValueError, match="decoding.max_new_tokens: unset"):
        Decoding().sampling()
    with pytest.raises(ValueError, match="top_p"):
        Decoding(top_p=0.0, max_new_tokens=8).sampling()  # checked once, where a Sampling is built


def test_a_generator_that_cannot_apply_a_sampling_setting_is_refused():
    def plain(prompts, n, temperature):
        return [["x"] * n for _ in prompts]

    with pytest.raises(ValueError, match="takes no top_k: it cannot sample with top_k=20"):
        generate(plain, ["a"], 1, Decoding(temperature=0.6, top_k=20))
    with pytest.raises(ValueError, match="takes no top_p: it cannot sample with top_p=0.9"):
        generate(plain, ["a"], 1, Decoding(temperature=1.0, top_p=0.9))
    # settings that leave the distribution alone, greedy decoding, a budget or a seed: its own
    assert generate(plain, ["a"], 1, Decoding(temperature=0.0, top_k=20, top_p=0.5, max_new_tokens=5, seed=3))
    assert generate(plain, ["a"], 2, Decoding(temperature=1.0))


@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"temperature": -1.0}, "eval.math.temperature: must be >= 0"),
        ({"top_p": 0.0}, "eval.math.top_p: must be in \\(0, 1\\]"),
        ({"top_p": 1.5}, "eval.math.top_p"),
        ({"top_k": -1}, "eval.math.top_k: must be an integer >= 0"),
        ({"top_k": 2.5}, "eval.math.top_k"),
        ({"max_new_tokens": 0}, "eval.math.max_new_tokens: must be >= 1"),
        ({"samples": {"aime24": 0}}, "eval.math.samples.aime24: must be an integer >= 1"),
        ({"n": 0}, "eval.math.n: must be >= 1"),
    ],
)
def test_bad_settings_name_their_key(kw, msg):
    with pytest.raises(ValueError, match=msg):
        Decoding(**kw).check("eval.math")


def test_run_scores_are_the_columns_of_the_score_table():
    scores = [[1, 0, 1, 1], [0, 0, 1, 0], [1, 1, 1, 0]]  # 3 problems x 4 samples
    out = run_scores(scores, 4)
    runs = [2 / 3, 1 / 3, 1.0, 1 / 3]
    assert out["runs"] == [round(r, 6) for r in runs]
    assert out["std_over_runs"] == round(statistics.stdev(runs), 6)
    assert statistics.fmean(runs) == pytest.approx(statistics.fmean(statistics.fmean(r) for r in scores))
    assert run_scores(scores, 1) == {} and run_scores([], 4) == {}


def test_avg_at_k_keeps_every_run_its_spread_and_the_seed():
    items = B.load_math_benchmark("aime24", limit=3)
    gold = {it["prompt"]: it["answer"] for it in items}
    pattern = {0: [1, 0, 1, 1], 1: [0, 0, 1, 0], 2: [1, 1, 1, 0]}  # which samples are right, per problem
    seen = []

    def gen(prompts, n, temperature, *, top_p, top_k, seed, max_new_tokens):
        seen.append((n, temperature, top_p, top_k, seed, max_new_tokens))
        out = []
        for p in prompts:
            i = next(k for k, it in enumerate(items) if it["prompt"] in p)
            ans = gold[items[i]["prompt"]]
            out.append([f"\\boxed{{{ans}}}" if ok else "\\boxed{-1}" for ok in pattern[i]])
        return out

    res = S.evaluate_math(
        gen,
        benchmarks=["aime24"],
        limit=3,
        decoding=Decoding(temperature=0.6, top_p=0.95, top_k=20, max_new_tokens=64, samples={"aime24": 4}, seed=11),
        workers=1,
    )
    r = res["benchmarks"]["aime24"]
    runs = [2 / 3, 1 / 3, 1.0, 1 / 3]
    assert seen == [(4, 0.6, 0.95, 20, 11, 64)]
    assert r["n_samples"] == r["samples_requested"] == 4 and r["seed"] == 11
    assert r["runs"] == [round(x, 6) for x in runs] and r["std_over_runs"] == round(statistics.stdev(runs), 6)
    assert r["pass@1"] == pytest.approx(statistics.fmean(runs))
    cfg = res["config"]
    assert (cfg["temperature"], cfg["top_p"], cfg["top_k"], cfg["max_new_tokens"], cfg["seed"]) == (
        0.6,
        0.95,
        20,
        64,
        11,
    )
    assert cfg["decoding"] == "sampled" and cfg["samples"] == {"aime24": 4}


def test_greedy_draws_one_sample_and_records_what_was_asked():
    items = B.load_math_benchmark("aime24", limit=2)
    calls = []

    def gen(prompts, n, temperature):
        calls.append(n)
        return [["\\boxed{0}"] * n for _ in prompts]

    res = S.evaluate_math(gen, benchmarks=["aime24"], limit=2, decoding=Decoding(samples={"aime24": 32}), workers=1)
    r = res["benchmarks"]["aime24"]
    assert calls == [1] and r["n_samples"] == 1 and r["samples_requested"] == 32 and "runs" not in r
    assert res["config"]["decoding"] == "greedy" and len(items) == r["n_problems"]


def test_limit_zero_means_every_problem():
    assert len(B.load_math_benchmark("amc23", limit=0)) == 40
    assert len(B.load_math_benchmark("amc23", limit=None)) == 40
    assert len(B.load_humaneval(limit=0)) == 164
    with pytest.raises(ValueError, match="limit must be >= 0 \\(0 = all\\)"):
        B.load_math_benchmark("amc23", limit=-1)
    res = S.evaluate_math(lambda p, n, t: [["x"]] * len(p), benchmarks=["amc23"], limit=0, workers=1)
    assert res["benchmarks"]["amc23"]["n_problems"] == 40
