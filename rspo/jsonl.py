"""The one JSONL reader: ``(line number, object)`` pairs with errors that name ``file:line``."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any, Iterator


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
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{p}:{lineno}: malformed JSON line (invalid JSON: {e.msg})") from None
            if not isinstance(obj, dict):
                raise ValueError(f"{p}:{lineno}: not a JSON object (got {type(obj).__name__})")
            yield lineno, obj
