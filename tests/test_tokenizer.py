"""Countdown tokenizer: exact round-trips on generated data of every style, whole-word and
per-digit tokens, <bos>/<eos> conventions, save + AutoTokenizer reload, fingerprints, CLI."""

import json
import string

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rspo.commands.tokenizer import main
from rspo.data.countdown import (
    STYLES,
    CountdownConfig,
    format_completion,
    format_prompt,
    generate_split,
    split_targets,
)
from rspo.tokenizer import (
    SPECIAL_TOKENS,
    WORDS,
    build_tokenizer,
    load_tokenizer,
    save_tokenizer,
    tokenizer_fingerprint,
)


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.fixture(scope="module")
def records():
    out = []
    for n in (3, 4):
        cfg = CountdownConfig(num_numbers=n, train_size=0, val_size=0, val_target_size=0, seed=11)
        targets, _ = split_targets(cfg)
        out += generate_split(cfg, "train", 40, targets)
    return out


def _ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def test_round_trip_generated_data(tok, records):
    for rec in records:
        for style in STYLES:
            for text in (
                format_prompt(rec, style),
                format_completion(rec, style),
                format_prompt(rec, style) + format_completion(rec, style),
            ):
                ids = _ids(tok, text)
                assert tok.unk_token_id not in ids
                assert tok.decode(ids, skip_special_tokens=True) == text


def test_special_tokens_and_bos_convention(tok):
    assert [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3]
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    ids = tok("nums 1 2 target 3:")["input_ids"]
    assert ids[0] == tok.bos_token_id and tok.eos_token_id not in ids
    assert tok.decode(ids, skip_special_tokens=True) == "nums 1 2 target 3:"
    # <eos> appended by the trainer is dropped on decode.
    assert tok.decode(_ids(tok, "1+2=3") + [tok.eos_token_id], skip_special_tokens=True) == "1+2=3"


def test_words_are_single_tokens_digits_are_single_characters(tok):
    for word in WORDS:
        ids = _ids(tok, word)
        assert len(ids) == 1 and ids[0] != tok.unk_token_id, word
    assert tok.convert_ids_to_tokens(_ids(tok, "1234567890")) == list("1234567890")
    assert tok.convert_ids_to_tokens(_ids(tok, "Operations: ['4-2=2']")) == [
        "Operations",
        ":",
        " ",
        "[",
        "'",
        "4",
        "-",
        "2",
        "=",
        "2",
        "'",
        "]",
    ]
    # Unknown words fall back to characters, so they still round-trip.
    assert tok.convert_ids_to_tokens(_ids(tok, "Nodes")) == ["Node", "s"]


def test_steps_token_count(tok, records):
    # Every character is a token except the words "nums" and "target" (one token each);
    # + <bos> before the prompt, + <eos> after the completion.
    for rec in records:
        prompt, completion = format_prompt(rec, "steps"), format_completion(rec, "steps")
        n_prompt = len(tok(prompt)["input_ids"])
        assert n_prompt == len(prompt) - len("nums") + 1 - len("target") + 1 + 1
        assert len(_ids(tok, completion)) == len(completion)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=[c for c in string.printable if c not in "\x0b\x0c\r"]))
def test_round_trip_any_printable_ascii(text):
    # Literal special-token strings ("<eos>") encode to the special token (by design).
    assume(not any(special in text for special in SPECIAL_TOKENS))
    tok = _TOK
    assert tok.decode(_ids(tok, text), skip_special_tokens=True) == text


_TOK = build_tokenizer()


def test_non_ascii_maps_to_unk_and_specials_are_matched(tok):
    assert _ids(tok, "é") == [tok.unk_token_id]
    assert _ids(tok, "1+2=3<eos>") == _ids(tok, "1+2=3") + [tok.eos_token_id]


def test_save_and_autotokenizer_reload(tmp_path, tok, records):
    from transformers import AutoTokenizer

    save_tokenizer(tmp_path / "tok")
    loaded = AutoTokenizer.from_pretrained(str(tmp_path / "tok"), local_files_only=True)
    again = load_tokenizer(tmp_path / "tok")
    assert tokenizer_fingerprint(loaded) == tokenizer_fingerprint(tok) == tokenizer_fingerprint(again)
    assert (loaded.pad_token_id, loaded.bos_token_id, loaded.eos_token_id) == (0, 1, 2)
    for rec in records[:20]:
        for style in STYLES:
            text = format_prompt(rec, style) + format_completion(rec, style)
            assert loaded(text)["input_ids"] == tok(text)["input_ids"]
            assert loaded.decode(loaded(text)["input_ids"], skip_special_tokens=True) == text


def test_load_missing_tokenizer(tmp_path):
    with pytest.raises(FileNotFoundError, match="python -m rspo tokenizer"):
        load_tokenizer(tmp_path / "nowhere")


def test_fingerprint_detects_other_vocab_and_ignores_padding():
    a = build_tokenizer()
    fp = tokenizer_fingerprint(a)
    a(["1+2=3", "1"], padding="max_length", max_length=8, truncation=True)  # run-time settings
    assert tokenizer_fingerprint(a) == fp
    b = build_tokenizer()
    b.add_tokens(["<extra>"])
    assert tokenizer_fingerprint(b) != fp
    assert len(fp) == 16 and int(fp, 16) >= 0


def test_cli(tmp_path, capsys):
    from rspo.commands.data import generate_main

    assert (
        generate_main(
            [
                "--out",
                str(tmp_path / "data"),
                "--num-numbers",
                "3",
                "--train-size",
                "30",
                "--val-size",
                "5",
                "--val-target-size",
                "5",
            ]
        )
        == 0
    )
    capsys.readouterr()
    for style in STYLES:
        assert (
            main(["--out", str(tmp_path / "tok"), "--data", str(tmp_path / "data" / "train.jsonl"), "--style", style])
            == 0
        )
        summary = json.loads(capsys.readouterr().out)
        assert summary["style"] == style and summary["examples"] == 30
        assert summary["tokens_max"] >= summary["tokens_mean"] > 0
    assert (tmp_path / "tok" / "tokenizer.json").is_file()
    assert main(["--out", str(tmp_path / "tok2"), "--data", str(tmp_path / "missing.jsonl")]) == 2
