"""Math reward: the last \\boxed{} answer of a completion checked against the gold with math-verify.

Used for both the RL reward and the math evaluation (AIME24, AMC, MATH500, Minerva,
OlympiadBench); `score(completion, answer) -> (reward, reason)` with reward 1.0 or 0.0.

Procedure
1. Extract the content of the LAST `\\boxed{...}` or `\\fbox{...}` of the completion, with
   balanced braces (escaped `\\{`/`\\}` are skipped when counting). The brace-less form
   `\\boxed 5` (used in the MATH dataset) is accepted too. If the last occurrence is not
   closed (a truncated generation) or there is none, the reward is 0 ("no boxed answer").
   The `</think>` or `<answer>` tags of the r1 templates are NOT required (no format term).
2. Gold: a string, a number (the AMC split stores floats: 142.0 -> "142"), or a list of
   acceptable strings (Minerva / OlympiadBench); a match with ANY element counts.
   One pair of math delimiters around a gold (`$...$`, `$$...$$`, `\\(...\\)`, `\\[...\\]`)
   is removed, and the same is done to the prediction.
3. Both sides are wrapped as `\\boxed{...}` and parsed with math-verify's `parse` using
   `[LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]` (boxed first,
   default `first_match` fallback: an unparsable answer is kept as its string). If the
   boxed gold does not parse, `$gold$` and then the raw gold are tried. `verify(gold, pred)`
   is called gold first (it is not symmetric) with math-verify's defaults
   (`float_rounding=6`, `strict=True`), one call per (gold, prediction) candidate pair,
   so that an error or timeout on one pair does not hide a match on another.

What math-verify 0.9.0 accepts (checked in tests/test_reward_math.py): fractions in any
form (`\\frac{1}{2}`, `\\dfrac`, `\\tfrac`, `1/2`, `0.5`); intervals `[1,2)`, `(0,\\infty)`;
tuples; sets in any order, also `1,2` for `\\{1,2\\}`; zero-padded integers (`025` = 25);
`142.0` = `142`; `\\sqrt{2}/2` = `\\frac{\\sqrt2}{2}` = `\\frac{1}{\\sqrt2}`; units are
dropped (`5 cm` = `5` = `5\\text{ cm}`); degrees (`90^\\circ` = 90); percent (`50\\%`
matches both 50 and 0.5); `x=5` matches `5` both ways; numbers equal after rounding to 6
decimals (0.5000001 = 0.5, but 0.500001 != 0.5).
Known leniencies/limits of math-verify (documented, not patched): `\\{1,2\\}` matches the
interval `(1,2)`; an inequality `x>0` does NOT match the interval `(0,\\infty)`; a bare word
such as `Evelyn` is parsed as a product of symbols (E*e*l*n*v*y), so it also matches a
permutation of its letters unless written as `\\text{...}`. The sanity check of every gold
of the Dr. GRPO suite against itself is in tests/test_reward_math.py.

Timeouts (math-verify uses `signal.alarm`, which only works in the main thread of a process)
- `score()` in the main thread: math-verify's own timeouts, `ceil(timeout)` seconds per
  parse and per verify call (so one item can take several times `timeout`); a timeout of
  the prediction's parse gives (0, "timeout"); a timed-out comparison counts as no match
  ("timeout" if no pair matched and one timed out).
- `score()` in any other thread: the item is sent to the shared worker-process pool
  (`score_batch` with one item), since a hang cannot be interrupted in a thread.
- `score_batch()`: items run in spawned worker processes (rspo.rewards.pool.TimeoutPool)
  with math-verify's timeouts disabled and one deadline per item: a SIGALRM exception at
  `timeout` seconds (worker survives), SIGKILL and a fresh worker at `timeout + 2` s.
  Such items score (0.0, "timeout"); a crashed worker gives (0.0, "verifier crashed: ...").
  Do not nest math-verify calls inside another SIGALRM timeout: it cancels outer alarms.

Deviations from the references
- Dr. GRPO grades with `grade_answer_mathd OR grade_answer_sympy` (and math-verify only with
  fast=False) under a 1 s timeout; DeepScaleR uses mathd OR sympy. Here math-verify alone
  decides, with a 5 s default timeout (math-verify's default).
- No format reward and no `</think>` requirement (DeepScaleR requires `</think>`).
"""

from __future__ import annotations

import functools
import logging
import math
import numbers
import os
import re
import threading
from collections.abc import Sequence
from typing import Any

__all__ = ["extract_boxed", "score", "score_batch", "DEFAULT_TIMEOUT"]

DEFAULT_TIMEOUT = 5.0
_TRUNC = 120

# math-verify logs a warning for every disabled timeout and every timeout it catches;
# the reward reports those through its reason string instead.
logging.getLogger("math_verify").setLevel(logging.ERROR)


# --------------------------------------------------------------------------- extraction
def extract_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} / \\fbox{...} of `text` (balanced braces), else None.

    >>> extract_boxed(r"so \\boxed{1} or rather \\boxed{\\frac{a}{b}}.")
    '\\\\frac{a}{b}'
    """
    if not isinstance(text, str):
        raise TypeError(f"completion must be a str, got {type(text).__name__}")
    start, cmd = -1, ""
    for name in ("\\boxed", "\\fbox"):
        i = text.rfind(name)
        if i > start:
            start, cmd = i, name
    if start < 0:
        return None
    i = start + len(cmd)
    if cmd == "\\boxed" and text[i : i + 1] == " ":
        # "\boxed 5": the MATH dataset's brace-less form, up to the next space or '$'.
        rest = text[i:].lstrip(" ")
        if not rest.startswith("{"):
            m = re.match(r"[^\s$]+", rest)
            return m.group(0) if m else None
    while i < len(text) and text[i] in " \t\n":
        i += 1
    if i >= len(text) or text[i] != "{":
        return None
    depth, j = 0, i
    while j < len(text):
        c = text[j]
        if c == "\\":
            j += 2  # skip the escaped character (\{ and \} do not count)
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
        j += 1
    return None  # not closed


def _strip_delimiters(s: str) -> str:
    s = s.strip()
    for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if s.startswith(left) and s.endswith(right) and len(s) >= len(left) + len(right):
            return s[len(left) : len(s) - len(right)].strip()
    return s


def _gold_strings(answer: Any) -> list[str]:
    """Normalise a gold (str / number / list of either) to a non-empty list of strings."""
    items = list(answer) if isinstance(answer, (list, tuple)) else [answer]
    if not items:
        raise ValueError("gold answer list is empty")
    out = []
    for a in items:
        if isinstance(a, bool) or a is None:
            raise ValueError(f"gold answer must be a str, a number or a list of them, got {a!r}")
        if isinstance(a, str):
            s = a.strip()
        elif isinstance(a, numbers.Integral):
            s = str(int(a))
        elif isinstance(a, numbers.Real):
            f = float(a)
            if not math.isfinite(f):
                raise ValueError(f"gold answer must be finite, got {a!r}")
            s = str(int(f)) if f.is_integer() else repr(f)
        else:
            raise ValueError(f"gold answer must be a str, a number or a list of them, got {type(a).__name__}")
        if not s:
            raise ValueError("gold answer is an empty string")
        out.append(s)
    return out


def _short(s: str) -> str:
    s = " ".join(s.split())
    return s if len(s) <= _TRUNC else s[: _TRUNC - 3] + "..."


# --------------------------------------------------------------------------- math-verify
@functools.lru_cache(maxsize=1)
def _mv():
    import math_verify  # deferred: sympy + antlr take ~1 s to import

    cfg = [
        math_verify.LatexExtractionConfig(boxed_match_priority=0),
        math_verify.ExprExtractionConfig(),
    ]
    return math_verify, cfg


def _parse(expr: str, mv_timeout: int | None) -> list:
    """math-verify parse of `expr` wrapped in \\boxed{}; raises on timeout or error."""
    mv, cfg = _mv()
    return mv.parse(
        "\\boxed{" + expr + "}",
        extraction_config=cfg,
        parsing_timeout=mv_timeout,
        raise_on_error=True,
    )


@functools.lru_cache(maxsize=8192)
def _parse_gold_cached(gold: str, mv_timeout: int | None) -> tuple:
    core = _strip_delimiters(gold)
    mv, cfg = _mv()
    parsed = _parse(core, mv_timeout)
    if not parsed:
        parsed = mv.parse("$" + core + "$", parsing_timeout=mv_timeout, raise_on_error=True)
    if not parsed:
        parsed = mv.parse(gold, parsing_timeout=mv_timeout, raise_on_error=True)
    return tuple(parsed)


@functools.lru_cache(maxsize=8192)
def _parse_pred_cached(pred: str, mv_timeout: int | None) -> tuple:
    return tuple(_parse(_strip_delimiters(pred), mv_timeout))


def _parse_or_why(parse, text: str, mv_timeout: int | None, what: str) -> tuple | str:
    """math-verify's parse of ``text`` (a gold or a prediction), or why not: "timeout", or "verifier
    error: <what><exception>" (a verifier failure is a reason, never an exception out of the reward)."""
    from math_verify.errors import TimeoutException

    try:
        return parse(text, mv_timeout)
    except TimeoutException:
        return "timeout"
    except Exception as exc:  # noqa: BLE001
        return f"verifier error: {what}{type(exc).__name__}: {exc}"


def _score_impl(completion: str, answer: Any, mv_timeout: int | None) -> tuple[float, str]:
    from math_verify.errors import TimeoutException

    golds = _gold_strings(answer)
    boxed = extract_boxed(completion)
    if boxed is None:
        return 0.0, "no boxed answer"
    expected = " | ".join(_short(g) for g in golds)
    if not boxed.strip():
        return 0.0, f"wrong answer: got empty \\boxed{{}}, expected {expected}"
    gold_parsed: list = []
    for g in golds:
        parsed = _parse_or_why(_parse_gold_cached, g, mv_timeout, f"cannot parse gold {_short(g)!r}: ")
        if isinstance(parsed, str):
            return 0.0, parsed
        gold_parsed.extend(parsed)
    if not gold_parsed:
        return 0.0, f"verifier error: math-verify cannot parse the gold {expected!r}"
    pred_parsed = _parse_or_why(_parse_pred_cached, boxed, mv_timeout, "")
    if isinstance(pred_parsed, str):
        return 0.0, pred_parsed
    if not pred_parsed:
        return 0.0, f"wrong answer: got {_short(boxed)} (unparsable), expected {expected}"
    mv, _ = _mv()
    timed_out = False
    errors = []
    for g in gold_parsed:
        for p in pred_parsed:
            try:
                if mv.verify(g, p, timeout_seconds=mv_timeout, raise_on_error=True):
                    return 1.0, "ok"
            except TimeoutException:
                timed_out = True
            except Exception as exc:  # noqa: BLE001 - a failed pair is a non-match
                errors.append(f"{type(exc).__name__}: {exc}")
    if timed_out:
        return 0.0, "timeout"
    if errors and len(errors) == len(gold_parsed) * len(pred_parsed):
        return 0.0, f"verifier error: {_short(errors[0])}"
    return 0.0, f"wrong answer: got {_short(boxed)}, expected {expected}"


def _score_in_worker(completion: str, answer: Any) -> tuple[float, str]:
    """Pool entry point: no math-verify alarms (the pool's deadline applies)."""
    return _score_impl(completion, answer, None)


# --------------------------------------------------------------------------- public API
def score(completion: str, answer: Any, timeout: float = DEFAULT_TIMEOUT) -> tuple[float, str]:
    """(1.0, "ok") if the last \\boxed{} of `completion` equals `answer` per math-verify, else 0.

    `answer`: str, number, or list of acceptable answers (any match counts).
    Reasons: "ok", "no boxed answer", "wrong answer: got X, expected Y", "timeout",
    "verifier error: ...", "verifier crashed: ..." (the last only from a worker process).
    """
    _gold_strings(answer)  # validate in the caller, not in a worker
    if not isinstance(completion, str):
        raise TypeError(f"completion must be a str, got {type(completion).__name__}")
    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if threading.current_thread() is threading.main_thread():
        return _score_impl(completion, answer, max(1, math.ceil(timeout)))
    return score_batch([completion], [answer], timeout=timeout)[0]


_POOLS: dict[int, Any] = {}
_POOLS_LOCK = threading.Lock()


def _pool(workers: int):
    from rspo.rewards.pool import TimeoutPool

    with _POOLS_LOCK:
        pool = _POOLS.get(workers)
        if pool is None or not pool.alive:
            pool = TimeoutPool("rspo.rewards.math:_score_in_worker", workers)
            _POOLS[workers] = pool
        return pool


def default_workers() -> int:
    """Worker processes used by score_batch by default: all usable cores."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def score_batch(
    completions: Sequence[str],
    answers: Sequence[Any],
    workers: int | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> list[tuple[float, str]]:
    """Score many items in `workers` worker processes, each item under a `timeout` deadline.

    The pool of a given size is created on first use and kept (workers take ~1-2 s to
    import sympy); items from concurrent callers share it. Safe to call from any thread.
    """
    if len(completions) != len(answers):
        raise ValueError(f"completions and answers differ in length: {len(completions)} != {len(answers)}")
    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    workers = default_workers() if workers is None else workers
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive int, got {workers!r}")
    for c, a in zip(completions, answers):
        if not isinstance(c, str):
            raise TypeError(f"completion must be a str, got {type(c).__name__}")
        _gold_strings(a)
    if not completions:
        return []
    pool = _pool(workers)
    futures = [pool.submit((c, a), timeout) for c, a in zip(completions, answers)]
    results: list[tuple[float, str]] = []
    for fut in futures:
        out = fut.result()
        if out.status == "ok":
            results.append((float(out.value[0]), str(out.value[1])))
        elif out.status == "timeout":
            results.append((0.0, "timeout"))
        elif out.status == "crash":
            results.append((0.0, f"verifier crashed: {out.detail}"))
        else:
            results.append((0.0, f"verifier error: {out.detail}"))
    return results
