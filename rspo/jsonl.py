"""The one JSONL reader (``(line number, object)`` pairs with errors that name ``file:line``) and
the one atomic writer (``write_atomic``, with its JSONL and JSON wrappers): a file is either
complete or absent, never half-written, whatever kills the process."""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any


def iter_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (line number, object) for every non-blank line of a ``.jsonl`` file (``.gz`` too).

    Raises FileNotFoundError for a missing file and ValueError naming ``file:line`` for a line
    that is not JSON ("malformed JSON line") or not a JSON object.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"file not found: {p}")
    opener = gzip.open if p.name.lower().endswith(".gz") else open
    with opener(p, "rt", encoding="utf-8") as f:
        yield from iter_jsonl_lines(f, str(p))


def iter_jsonl_lines(lines: Iterable[str], source: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """``iter_jsonl`` over lines already read (an archive member's text), errors naming ``source:line``."""
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{source}:{lineno}: malformed JSON line (invalid JSON: {e.msg})") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{source}:{lineno}: not a JSON object (got {type(obj).__name__})")
        yield lineno, obj


def read_json(path: str | os.PathLike) -> dict[str, Any]:
    """A JSON file holding one object (a run's final.json, an evaluation): FileNotFoundError "missing
    file: PATH", ValueError naming the file for invalid JSON or another top-level type."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"missing file: {p}")
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{p}: expected a JSON object")
    return data


def write_atomic(path: str | os.PathLike, content: str | bytes | Iterable[str]) -> Path:
    """Write ``content`` to ``path`` atomically: a temporary file in the same folder, fsync, rename.

    ``content`` is text, bytes, or an iterable of text chunks written as they come (a stream of
    lines is never held in memory). If anything fails, the temporary file is removed and an existing
    ``path`` is left untouched. The file gets the usual mode (0666 minus the umask), parent folders
    are created. Returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    try:
        if isinstance(content, bytes):
            with os.fdopen(fd, "wb") as fb:
                fb.write(content)
                fb.flush()
                os.fsync(fb.fileno())
        else:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                for chunk in [content] if isinstance(content, str) else content:
                    f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out


def write_jsonl_atomic(
    path: str | os.PathLike, records: Iterable[dict[str, Any]], default: Callable[[Any], Any] | None = None
) -> int:
    """Write records as JSON lines (UTF-8, not ASCII-escaped) atomically; return how many. ``default``:
    json's, for values it cannot write (a hub table's dates: ``str``)."""
    n = 0

    def lines() -> Iterator[str]:
        nonlocal n
        for r in records:
            yield json.dumps(r, ensure_ascii=False, default=default) + "\n"
            n += 1

    write_atomic(path, lines())
    return n


def write_json_atomic(obj: Any, path: str | os.PathLike) -> Path:
    """Write ``obj`` as indented JSON (no NaN/inf) plus a newline to ``path`` atomically."""
    return write_atomic(path, json.dumps(obj, indent=2, ensure_ascii=False, allow_nan=False) + "\n")
