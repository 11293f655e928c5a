"""Code training data: DeepCoder (TACO / PrimeIntellect / LCB encodings), LeetCodeDataset,
LiveCodeBench release rows, the pre-v5 leakage cut, the offline fallback and the prepare CLI."""

import base64
import json
import pickle
import zlib
from collections import Counter

import pytest

from rspo.commands.data import prepare_main
from rspo.data import code as c

FX = "tests/fixtures/code"


def _load(name, **kw):
    stats = Counter()
    return c.load_code_file(f"{FX}/{name}.jsonl", stats=stats, **kw), stats


def _raw(name):
    return [json.loads(x) for x in open(f"{FX}/{name}.jsonl")]


def _score(program, tests):
    from rspo.rewards.code import score

    return score(program, tests)


# ---------------------------------------------------------------------------------- DeepCoder
def test_taco_encoding():
    recs, stats = _load("deepcoder_taco")
    assert stats["deepcoder/taco:kept"] == 3 and len(recs) == 3
    raw = _raw("deepcoder_taco")
    assert [r["prompt"] for r in recs] == [r["problem"] for r in raw]
    assert all(r["source"] == "deepcoder/taco" for r in recs)
    assert [r["solution"] for r in recs] == [r["solutions"][0] for r in raw]
    stdin, call, lines = (r["tests"] for r in recs)
    assert stdin == {
        "kind": "stdin",
        "cases": [
            {"input": "3\n", "output": "9\n"},
            {"input": "0\n", "output": "0\n"},
            {"input": "-4\n", "output": "16\n"},
        ],
    }
    # call-based: argument lists kept, APPS-wrapped outputs [v] unwrapped
    assert call == {
        "kind": "functional",
        "fn_name": "digit_sum",
        "cases": [{"input": [0], "output": 0}, {"input": [123], "output": 6}, {"input": [9999], "output": 36}],
    }
    assert recs[1]["starter_code"] == "def digit_sum(n):\n\t"
    # stdin given as lists of lines
    assert lines["cases"][1] == {"input": "hello\nworld", "output": "world\nhello"}


def test_primeintellect_encoding():
    recs, _ = _load("deepcoder_primeintellect")
    stdin, fn = (r["tests"] for r in recs)
    assert stdin["kind"] == "stdin" and stdin["cases"][0] == {"input": "2\n1 2\n5 3\n", "output": "2\n5\n"}
    assert fn == {
        "kind": "functional",
        "fn_name": "count_words",
        "cases": [
            {"input": ["a b c"], "output": 3},
            {"input": [""], "output": 0},
            {"input": ["  two  words "], "output": 2},
        ],
    }
    assert all(r["source"] == "deepcoder/primeintellect" for r in recs)


def test_lcbv5_encoding_and_undated_rows():
    recs, stats = _load("deepcoder_lcbv5")
    assert stats["deepcoder/lcbv5:undated_kept"] == 2  # upstream lcbv5 rows carry no date
    stdin, fn = (r["tests"] for r in recs)
    assert stdin["cases"] == [{"input": "3\n", "output": "AAA\n"}, {"input": "1\n", "output": "A\n"}]
    # functional: each input line json.loads-ed into one positional argument, output json.loads-ed
    assert fn == {
        "kind": "functional",
        "fn_name": "evenIndexSum",
        "cases": [{"input": [[1, 2, 3]], "output": 4}, {"input": [[5]], "output": 5}],
    }


def test_lcb_multi_argument_functional_and_metadata_forms():
    tests = [{"input": '[1, 2]\n"ab"\n{"k": null}', "output": "[true, 2.5]", "testtype": "functional"}]
    for md in ({"func_name": "f"}, json.dumps({"func_name": "f"})):
        row = {"problem": "p", "starter_code": "", "tests": json.dumps(tests), "metadata": md}
        (r,) = c.normalise_deepcoder([row], "lcbv5")
        assert r["tests"]["cases"] == [{"input": [[1, 2], "ab", {"k": None}], "output": [True, 2.5]}]


def test_deepcoder_date_cut_when_a_date_is_present():
    row = _raw("deepcoder_lcbv5")[0]
    stats = Counter()
    early = {**row, "metadata": json.dumps({"contest_date": "2024-07-31T00:00:00"})}
    late = {**row, "contest_date": "2024-08-01T00:00:00"}
    out = c.normalise_deepcoder([early, late], "lcbv5", stats=stats)
    assert len(out) == 1 and stats["deepcoder/lcbv5:after_cutoff"] == 1
    assert len(c.normalise_deepcoder([early, late], "lcbv5", cutoff="2024-07-01")) == 0
    assert len(c.normalise_deepcoder([early, late], "lcbv5", cutoff=None)) == 2


def test_bad_deepcoder_rows_are_dropped_and_counted():
    good = _raw("deepcoder_taco")[0]
    mixed = {
        **good,
        "tests": json.dumps(
            [
                {"type": "stdin_stdout", "input": "1", "output": "1"},
                {"type": "function_call", "fn_name": "f", "input": [1], "output": [1]},
            ]
        ),
    }
    unequal = {**good, "tests": json.dumps({"inputs": ["1"], "outputs": []})}
    notjson = {**good, "tests": "{oops"}
    nofn = {**good, "tests": json.dumps([{"input": "1", "output": "1", "testtype": "functional"}])}
    stats = Counter()
    out = c.normalise_deepcoder([good, mixed, unequal, notjson, nofn], "taco", stats=stats)
    assert len(out) == 1 and stats["deepcoder/taco:bad_tests"] == 4
    with pytest.raises(ValueError, match="missing field"):
        c.normalise_deepcoder([{"question": "q"}], "taco")


def test_max_cases_keeps_the_longest_inputs_in_order():
    tests = {"inputs": ["1\n", "333\n", "22\n", "4444\n"], "outputs": ["a", "b", "c", "d"]}
    t = c.parse_taco_tests(tests)
    assert [x["output"] for x in c._cap_cases(t["cases"], 2)] == ["b", "d"]


def test_deepcoder_gold_solutions_pass_their_decoded_tests():
    for name in ("deepcoder_taco", "deepcoder_primeintellect", "deepcoder_lcbv5"):
        recs, _ = _load(name)
        for r in recs:
            s, why = _score(r["solution"], r["tests"])
            assert s == 1.0, (name, r["prompt"], why)
            s, _ = _score("print('nope')\n", r["tests"])
            assert s < 1.0


# ---------------------------------------------------------------------------------- LeetCode
def test_leetcode_cases_cut_and_listnode_drop():
    recs, stats = _load("leetcode_sample")
    assert stats == Counter({"leetcode:kept": 1, "leetcode:no_literal_cases": 1, "leetcode:after_cutoff": 1})
    (r,) = recs
    assert r["source"] == "leetcode" and r["prompt"].startswith("Given an integer array nums and an integer k")
    # keyword args put in signature order (nums, k); positional call kept; `-inf` assert skipped
    assert r["tests"] == {
        "kind": "functional",
        "fn_name": "countEven",
        "cases": [
            {"input": [[1, 2, 4], 3], "output": 1},
            {"input": [[2, 2], 0], "output": 2},
            {"input": [[], 5], "output": 0},
        ],
    }
    assert "class Solution" in r["solution"]


def test_leetcode_real_row_decodes_all_asserts_and_canonical_passes():
    real = _raw("leetcode_sample")[2]
    assert real["task_id"] == "stone-removal-game" and real["estimated_date"] >= c.LCB_TRAIN_CUTOFF
    (r,) = c.normalise_leetcode([real], cutoff=None)
    assert len(r["tests"]["cases"]) == real["test"].count("assert candidate(") == 29
    assert r["tests"]["cases"][0] == {"input": [8], "output": False}
    s, why = _score(r["solution"], r["tests"])
    assert s == 1.0, why


def test_leetcode_input_output_fallback_when_test_is_absent():
    row = dict(_raw("leetcode_sample")[0])
    row.pop("test")
    row["input_output"] = row["input_output"] + [
        {"input": "nums = [1], k = 1", "output": "Error: boom"},
        {"input": "nums = [true], k = null", "output": "0"},
    ]
    (r,) = c.normalise_leetcode([row])
    assert r["tests"]["cases"] == [
        {"input": [[1, 2, 4], 3], "output": 1},
        {"input": [[2, 2], 0], "output": 2},
        {"input": [[], 5], "output": 0},
        {"input": [[True], None], "output": 0},
    ]


# ---------------------------------------------------------------------------------- LCB release rows
def test_lcb_private_tests_both_encodings():
    raw = _raw("lcb_release_sample")
    enc = raw[0]["private_test_cases"]
    with pytest.raises(json.JSONDecodeError):
        json.loads(enc)
    decoded = c.decode_lcb_private(enc)
    assert decoded == json.loads(pickle.loads(zlib.decompress(base64.b64decode(enc))))
    assert decoded[0] == {"input": "10 -4\n", "output": "6\n", "testtype": "stdin"}
    assert c.decode_lcb_private(raw[1]["private_test_cases"]) == json.loads(raw[1]["private_test_cases"])
    with pytest.raises(ValueError, match="neither JSON nor"):
        c.decode_lcb_private("definitely not base64 !!")
    t = c.lcb_row_tests(raw[0])
    assert t["kind"] == "stdin" and len(t["cases"]) == 4 and t["cases"][0] == {"input": "1 2\n", "output": "3\n"}
    t = c.lcb_row_tests(raw[1])
    assert t["fn_name"] == "countGreater" and t["cases"][0] == {"input": [[1, 5, 3], 2], "output": 2}


def test_lcb_release_rows_as_training_data_are_cut_pre_v5():
    recs, stats = _load("lcb_release_sample")
    # only the 2024-05-15 problem is before 2024-08-01; the v4/v5/v6 ones are excluded
    assert stats["lcb:after_cutoff"] == 3 and len(recs) == 1
    assert recs[0]["prompt"].startswith("Given a string s") and recs[0]["source"] == "livecodebench"


# ---------------------------------------------------------------------------------- files, hub, fallback
def test_normalised_file_roundtrip_and_schema_errors(tmp_path):
    recs, _ = _load("deepcoder_taco")
    p = tmp_path / "n.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert c.load_code_file(p) == recs
    record = {"prompt": "x", "starter_code": "", "source": "s", "tests": {"kind": "stdin", "cases": []}}
    p.write_text(json.dumps(record) + "\n")
    with pytest.raises(ValueError, match="non-empty list"):
        c.load_code_file(p)
    p.write_text(json.dumps({"title": "t", "body": "b"}) + "\n")
    with pytest.raises(ValueError, match="unrecognised code data schema"):
        c.load_code_file(p)
    with pytest.raises(FileNotFoundError):
        c.load_code_file(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="kind"):
        c.validate_tests({"kind": "sql", "cases": [{"input": "", "output": ""}]})
    with pytest.raises(ValueError, match="fn_name"):
        c.validate_tests({"kind": "functional", "cases": [{"input": [], "output": 1}]})


def test_hub_loaders_use_pinned_revisions(monkeypatch):
    import datasets

    calls = []

    class Stream:
        def __init__(self, rows):
            self.rows = rows

        def take(self, n):
            return self.rows[:n]

    def fake_load(repo, config=None, split=None, revision=None, streaming=False):
        calls.append((repo, config, split, revision, streaming))
        name = "leetcode_sample" if repo == c.LEETCODE_REPO else f"deepcoder_{config}"
        rows = _raw(name)
        return Stream(rows) if streaming else rows

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    stats = Counter()
    recs = c.load_code_train("hub", limit=2, seed=0, stats=stats)
    assert {x[0] for x in calls} == {c.DEEPCODER_REPO, c.LEETCODE_REPO}
    assert all(x[2] == "train" and x[4] for x in calls)
    assert {x[3] for x in calls if x[0] == c.DEEPCODER_REPO} == {c.DEEPCODER_REVISION}
    assert [x[1] for x in calls if x[0] == c.DEEPCODER_REPO] == ["primeintellect", "taco", "lcbv5"]
    assert len(recs) == 2
    with pytest.raises(ValueError, match="unknown code source"):
        c.load_code_hub(["codeforces"])


def test_fallback_problems_are_seeded_and_their_solutions_pass():
    a = c.load_code_train("fallback", limit=24, seed=5)
    assert a == c.load_code_train("fallback", limit=24, seed=5)
    assert {r["tests"]["kind"] for r in a} == {"stdin", "functional"}
    for r in a:
        c.validate_code_record(r)
        assert r["source"] == c.FALLBACK_SOURCE
    from rspo.rewards.code import score_batch

    out = score_batch([r["solution"] for r in a], [r["tests"] for r in a], workers=2)
    assert all(s == 1.0 for s, _ in out), out


def test_prepare_code_cli(tmp_path, capsys):
    out = tmp_path / "code.jsonl"
    assert prepare_main(["code", "--out", str(out), "--source", f"{FX}/leetcode_sample.jsonl"]) == 0
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(recs) == 1
    c.validate_code_record(recs[0])
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["stats"]["leetcode:after_cutoff"] == 1
    assert (
        prepare_main(["code", "--out", str(out), "--source", f"{FX}/leetcode_sample.jsonl", "--cutoff", "2030-01-01"])
        == 0
    )
    assert len(out.read_text().splitlines()) == 2
    assert prepare_main(["code", "--out", str(out), "--source", "fallback", "--limit", "5", "--seed", "1"]) == 0
    assert [json.loads(x) for x in out.read_text().splitlines()] == c.load_code_train("fallback", limit=5, seed=1)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"title": "t"}) + "\n")
    assert prepare_main(["code", "--out", str(tmp_path / "o.jsonl"), "--source", str(bad)]) == 2
    assert "unrecognised code data schema" in capsys.readouterr().err
    assert not (tmp_path / "o.jsonl").exists()
