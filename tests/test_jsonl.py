"""rspo.jsonl: the one JSONL reader (plain and gzipped), errors naming file:line."""

import gzip

import pytest

from rspo.jsonl import iter_jsonl


def test_reads_objects_with_line_numbers_skipping_blank_lines(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_text('{"a": 1}\n\n  \n{"b": 2}\n')
    assert list(iter_jsonl(p)) == [(1, {"a": 1}), (4, {"b": 2})]
    gz = tmp_path / "a.jsonl.gz"
    with gzip.open(gz, "wt", encoding="utf-8") as f:
        f.write('{"a": 1}\n{"c": [1, 2]}\n')
    assert [obj for _, obj in iter_jsonl(gz)] == [{"a": 1}, {"c": [1, 2]}]


@pytest.mark.parametrize("text,message", [('{"a": 1}\n{broken\n', r"x\.jsonl:2: malformed JSON line"),
                                          ('[1, 2]\n', r"x\.jsonl:1: not a JSON object \(got list\)")])
def test_bad_lines_name_file_and_line(tmp_path, text, message):
    p = tmp_path / "x.jsonl"
    p.write_text(text)
    with pytest.raises(ValueError, match=message):
        list(iter_jsonl(p))


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        list(iter_jsonl(tmp_path / "nope.jsonl"))
