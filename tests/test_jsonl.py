"""rspo.jsonl: the one JSONL reader (plain and gzipped), errors naming file:line; the one atomic writer."""

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


@pytest.mark.parametrize(
    "text,message",
    [
        ('{"a": 1}\n{broken\n', r"x\.jsonl:2: malformed JSON line"),
        ("[1, 2]\n", r"x\.jsonl:1: not a JSON object \(got list\)"),
    ],
)
def test_bad_lines_name_file_and_line(tmp_path, text, message):
    p = tmp_path / "x.jsonl"
    p.write_text(text)
    with pytest.raises(ValueError, match=message):
        list(iter_jsonl(p))


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        list(iter_jsonl(tmp_path / "nope.jsonl"))


def test_write_atomic_text_bytes_and_streams(tmp_path):
    import os

    from rspo.jsonl import write_atomic, write_json_atomic, write_jsonl_atomic

    assert write_atomic(tmp_path / "a" / "t.txt", "héllo\n").read_text(encoding="utf-8") == "héllo\n"
    assert write_atomic(tmp_path / "b.bin", b"\x00\x01").read_bytes() == b"\x00\x01"
    assert write_atomic(tmp_path / "c.txt", (f"{i}\n" for i in range(3))).read_text() == "0\n1\n2\n"
    assert write_jsonl_atomic(tmp_path / "d.jsonl", [{"x": "é"}, {"y": 2}]) == 2
    assert (tmp_path / "d.jsonl").read_text(encoding="utf-8") == '{"x": "é"}\n{"y": 2}\n'
    write_json_atomic({"a": [1, 2]}, tmp_path / "e.json")
    assert (tmp_path / "e.json").read_text() == '{\n  "a": [\n    1,\n    2\n  ]\n}\n'
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "e.json").stat().st_mode & 0o777 == 0o666 & ~umask


def test_write_atomic_failure_keeps_the_old_file_and_no_temporary(tmp_path):
    from rspo.jsonl import write_atomic, write_json_atomic

    path = tmp_path / "f.jsonl"
    path.write_text("old\n")

    def lines():
        yield "new 1\n"
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_atomic(path, lines())
    with pytest.raises(ValueError):
        write_json_atomic({"x": float("nan")}, path)
    assert path.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.jsonl"]
