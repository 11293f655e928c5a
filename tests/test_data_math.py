"""Math training data: DeepScaleR-schema loading, validation, offline fallback, prepare CLI."""

import json
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rspo.commands.data import prepare_main
from rspo.data import math as m

FIXTURE = "tests/fixtures/math/deepscaler_sample.json"


def test_fixture_loads_with_field_mapping():
    recs = m.load_math_train(FIXTURE)
    raw = json.load(open(FIXTURE))
    assert len(recs) == len(raw) == 4
    for r, row in zip(recs, raw):
        assert set(r) == {"prompt", "answer", "source"}
        assert r["prompt"] == row["problem"]
        assert r["answer"] == row["answer"]
        assert r["source"] == "deepscaler_sample.json"


@pytest.mark.parametrize("fmt", ["jsonl", "jsonl.gz", "parquet"])
def test_same_schema_in_other_file_formats(tmp_path, fmt):
    import gzip

    raw = json.load(open(FIXTURE))
    p = tmp_path / f"d.{fmt}"
    if fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(raw), p)
    else:
        text = "".join(json.dumps(r) + "\n" for r in raw)
        p.write_bytes(gzip.compress(text.encode()) if fmt.endswith(".gz") else text.encode())
    recs = m.load_math_file(p, limit=3)
    assert [r["prompt"] for r in recs] == [r["problem"] for r in raw[:3]]


def test_answers_are_normalised():
    assert m.normalise_answer(142.0, "x") == "142"
    assert m.normalise_answer(0.5, "x") == "0.5"
    assert m.normalise_answer(7, "x") == "7"
    assert m.normalise_answer(" 025 ", "x") == "025"
    assert m.normalise_answer(["$2n-2$\n", 3], "x") == ["$2n-2$", "3"]
    for bad in ["", "  ", [], True, None, float("nan")]:
        with pytest.raises(ValueError):
            m.normalise_answer(bad, "row 3")


def test_wrong_schema_and_missing_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        m.load_math_file(tmp_path / "nope.json")
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps({"question": "1+1?", "answer": "2"}) + "\n")
    with pytest.raises(ValueError, match=r"missing field\(s\) \['problem'\]"):
        m.load_math_file(p)
    p.write_text(json.dumps({"problem": "1+1?", "answer": ""}) + "\n")
    with pytest.raises(ValueError, match="row 0: answer is empty"):
        m.load_math_file(p)
    p.write_text("{not json\n")
    with pytest.raises(ValueError, match="invalid JSON"):
        m.load_math_file(p)
    q = tmp_path / "x.csv"
    q.write_text("a,b\n")
    with pytest.raises(ValueError, match="unsupported file type"):
        m.load_math_file(q)
    with pytest.raises(ValueError, match="source"):
        m.load_math_train("")


def test_normalised_records_reload_and_validate(tmp_path):
    recs = m.load_math_train("fallback", limit=5)
    p = tmp_path / "n.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert m.load_math_file(p) == recs
    p.write_text(json.dumps({"prompt": "x", "answer": [], "source": "s"}) + "\n")
    with pytest.raises(ValueError, match="'answer' must be"):
        m.load_math_file(p)


def test_fallback_is_seeded_integer_and_correct():
    a = m.generate_arithmetic_problems(300, seed=3)
    assert a == m.generate_arithmetic_problems(300, seed=3)
    assert a != m.generate_arithmetic_problems(300, seed=4)
    assert set(a[0]) == {"problem", "solution", "answer"}
    for row in a:
        assert row["answer"].isdigit()  # non-negative integers
        # the worked solution ends with the boxed answer, and its last equation is right
        assert row["solution"].endswith(f"\\boxed{{{row['answer']}}}.")
    # every template occurs; arithmetic in the text reproduces the answer for the a+b template
    kinds = Counter(r["problem"].split(" ")[1] for r in a)
    assert len(kinds) > 3
    for row in a:
        if " and gets " in row["problem"]:
            nums = [int(t) for t in row["problem"].replace("?", "").split() if t.isdigit()]
            assert nums[0] + nums[1] == int(row["answer"])
    recs = m.load_math_train("fallback", limit=10, seed=1)
    assert len(recs) == 10 and all(r["source"] == m.FALLBACK_SOURCE for r in recs)
    with pytest.raises(ValueError):
        m.generate_arithmetic_problems(0)


def test_fallback_answers_match_their_own_solution_with_the_reward():
    reward = pytest.importorskip("rspo.rewards.math")
    rows = m.generate_arithmetic_problems(6, seed=0)
    out = [reward.score(r["solution"], r["answer"]) for r in rows]
    assert all(s == 1.0 for s, _ in out), out
    assert reward.score("The answer is \\boxed{-1}.", rows[0]["answer"])[0] == 0.0


def test_hub_loader_uses_the_pinned_revision(monkeypatch):
    import datasets

    seen = {}

    class FakeDS(list):
        def select(self, idx):
            return FakeDS(self[i] for i in idx)

    def fake_load(repo, split=None, revision=None, **kw):
        seen.update(repo=repo, split=split, revision=revision)
        return FakeDS(
            [{"problem": "p1", "solution": "", "answer": "1"}, {"problem": "p2", "solution": "s", "answer": "2"}]
        )

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    recs = m.load_math_train("hub", limit=1)
    assert seen == {"repo": m.DEEPSCALER_REPO, "split": "train", "revision": m.DEEPSCALER_REVISION}
    assert len(m.DEEPSCALER_REVISION) == 40
    assert recs == [{"prompt": "p1", "answer": "1", "source": "deepscaler"}]


def test_prepare_cli_writes_valid_jsonl(tmp_path, capsys):
    out = tmp_path / "sub" / "math.jsonl"
    assert prepare_main(["math", "--out", str(out), "--source", "fallback", "--limit", "7", "--seed", "2"]) == 0
    lines = out.read_text().splitlines()
    assert len(lines) == 7
    recs = [json.loads(x) for x in lines]
    for i, r in enumerate(recs):
        m.validate_math_record(r, f"line {i}")
    assert recs == m.load_math_train("fallback", limit=7, seed=2)
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["records"] == 7 and summary["by_source"] == {m.FALLBACK_SOURCE: 7}
    assert [p.name for p in out.parent.iterdir()] == ["math.jsonl"]  # no temporary file left
    # from a file in the DeepScaleR schema
    out2 = tmp_path / "m2.jsonl"
    assert prepare_main(["math", "--out", str(out2), "--source", FIXTURE]) == 0
    assert len(out2.read_text().splitlines()) == 4


def test_prepare_cli_errors(tmp_path, capsys):
    out = tmp_path / "m.jsonl"
    assert prepare_main(["math", "--out", str(out), "--source", str(tmp_path / "missing.json")]) == 2
    assert "not found" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"question": "q", "answer": "1"}]))
    assert prepare_main(["math", "--out", str(out), "--source", str(bad)]) == 2
    assert "missing field" in capsys.readouterr().err
    assert prepare_main(["math", "--out", str(out), "--source", "fallback", "--limit", "0"]) == 2
    assert not out.exists()
    with pytest.raises(SystemExit):
        prepare_main(["physics", "--out", str(out)])


# ---------------------------------------------------------------------------------- text tokenizer
def test_text_tokenizer_round_trip_and_offline_reload(tmp_path):
    from transformers import AutoTokenizer

    from rspo.data.text_tokenizer import train_text_tokenizer
    from rspo.prompts import math_prompt

    texts = [
        math_prompt(r["prompt"], "plain") + " The answer is \\boxed{" + r["answer"] + "}."
        for r in m.load_math_train("fallback", limit=300)
    ]
    hf = train_text_tokenizer(texts, 320, tmp_path / "tok")
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    assert len(tok) == len(hf) == 322  # 320 + <think>, </think>
    assert (tok.pad_token, tok.bos_token, tok.eos_token) == ("<pad>", "<bos>", "<eos>")
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    assert tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]) == [3, 4]
    assert set(tok.all_special_ids) == {0, 1, 2, 3, 4}  # the chat markers end a response
    from rspo.chat import vendored_template

    assert tok.chat_template == vendored_template("qwen3")
    for s in [texts[0], "  leading spaces\tand tabs\n\nünïcödé 😀 x²", "", "<think>\nhm\n</think>\n\nok"]:
        ids = tok(s)["input_ids"]
        assert ids[:1] == [tok.bos_token_id]  # <bos> prepended, no <eos>
        assert tok.decode(ids, skip_special_tokens=True) == s
        assert tok.decode(tok(s, add_special_tokens=False)["input_ids"]) == s
    # the chat markers are one token each and vanish from decoded text; the thinking tags stay
    ids = tok("<|im_start|>user\n<think></think>", add_special_tokens=False)["input_ids"]
    assert ids[0] == 3 and tok.convert_ids_to_tokens(ids[-2:]) == ["<think>", "</think>"]
    assert tok.decode(ids, skip_special_tokens=True) == "user\n<think></think>"
    train_text_tokenizer(texts, 320, tmp_path / "plain", chat_template=None)
    assert not AutoTokenizer.from_pretrained(str(tmp_path / "plain")).chat_template
    # merges were learned: frequent text is compressed well below one token per byte
    assert len(tok(texts[1], add_special_tokens=False)["input_ids"]) < 0.6 * len(texts[1].encode())
    batch = tok(["a", "ccc ddd"], padding=True)
    assert batch["input_ids"][0][0] == tok.pad_token_id  # left padding for generation
    with pytest.raises(ValueError, match="vocab_size"):
        train_text_tokenizer(texts, 100, tmp_path / "t2")
    with pytest.raises(ValueError, match="no training text"):
        train_text_tokenizer([], 300, tmp_path / "t3")
