"""Countdown split loading: every record is validated (fields, types, and its solution through
the verifier, rspo.rewards.countdown) before training or evaluation sees it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rspo.data.countdown.traces import HEURISTICS
from rspo.jsonl import iter_jsonl
from rspo.rewards.countdown import score

REQUIRED_FIELDS = ("nums", "target", "solution")
TRACE_FIELDS = ("search_path", "optimal_path")


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def validate_record(rec: Any) -> str | None:
    """None if `rec` is a well-formed, solved Countdown record, else what is wrong.

    Required: nums (>= 2 non-negative ints), target (int), solution (list of step strings)
    that the verifier accepts. Optional (written unless --no-traces): optimal_path, which
    must be a valid path too, and search_path, which must be valid if it claims the goal
    (a heuristic DFS that missed the solution legitimately has no "Goal Reached").
    """
    if not isinstance(rec, dict):
        return f"record is not a JSON object ({type(rec).__name__})"
    missing = [k for k in REQUIRED_FIELDS if k not in rec]
    if missing:
        return f"missing field(s) {missing}"
    nums, target, solution = rec["nums"], rec["target"], rec["solution"]
    if not isinstance(nums, list) or len(nums) < 2 or not all(_is_int(x) and x >= 0 for x in nums):
        return f"'nums' must be a list of >= 2 non-negative ints, got {nums!r}"
    if not _is_int(target):
        return f"'target' must be an int, got {target!r}"
    if not isinstance(solution, list) or not all(isinstance(s, str) for s in solution):
        return f"'solution' must be a list of strings, got {solution!r}"
    for key in TRACE_FIELDS:
        if key in rec and not isinstance(rec[key], str):
            return f"{key!r} must be a string, got {type(rec[key]).__name__}"
    if "heuristic" in rec and rec["heuristic"] not in HEURISTICS:
        return f"'heuristic' must be one of {HEURISTICS}, got {rec['heuristic']!r}"
    reward, reason = score(",".join(solution), nums, target)
    if reward != 1.0:
        return f"unsolvable record: solution {solution} does not reach {target} from {nums} ({reason})"
    if "optimal_path" in rec:
        reward, reason = score(rec["optimal_path"], nums, target)
        if reward != 1.0:
            return f"'optimal_path' is not a valid path ({reason})"
    if "search_path" in rec and "Goal Reached" in rec["search_path"]:
        reward, reason = score(rec["search_path"], nums, target)
        if reward != 1.0:
            return f"'search_path' claims the goal but is not a valid path ({reason})"
    return None


def load_split(path: str | os.PathLike) -> list[dict]:
    """Read a split JSONL file, validating every record (fields, types, solution via the verifier).

    Raises FileNotFoundError if missing and ValueError naming the file and line otherwise.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"Countdown split not found: {p} (run `python -m rspo generate`)")
    records = []
    for lineno, rec in iter_jsonl(p):
        problem = validate_record(rec)
        if problem is not None:
            raise ValueError(f"{p}:{lineno}: {problem}")
        records.append(rec)
    return records
