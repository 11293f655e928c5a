"""Code reward: run a Python program against its tests in the sandbox; 1.0 only if all pass.

Used for both the RL reward and the code evaluation (LiveCodeBench-style stdin and
functional tests, DeepCoder/TACO/PrimeIntellect/LeetCode data once converted to the
schema below). Isolation, limits and the process layout (one sandboxed interpreter per
program, one forked process per case) are described in rspo/rewards/sandbox/__init__.py;
`sandbox_backend()` there says which isolation is in use.

Tests schema
    {"kind": "stdin", "cases": [{"input": str, "output": str}, ...]}
    {"kind": "functional", "fn_name": str, "cases": [{"input": [args...], "output": value}, ...]}
    {"kind": "assert", "code": str, "call": str, "context": str, "stubs": [names], "timeout": s}
      (benchmarks whose checks are code: HumanEval/MBPP; built by
      rspo.evaluate.suites.assert_harness and decided by rspo.rewards.verdict.check_asserts)
optional keys: "timeout" (seconds per case, default 6 as in LiveCodeBench) and
"memory_mb" (address-space limit, default 1024). Functional inputs are already-decoded
argument lists (LCB stores each argument as one JSON line: decode with
`[json.loads(l) for l in s.split("\\n")]` and the expected value with `json.loads`).
The entry point is a top-level function `fn_name`, else `Solution().fn_name` (LeetCode).

Comparison (LiveCodeBench `lcb_runner/evaluation/testing_util.py`)
- stdin: both outputs are `strip()`ped, split on "\\n", each line `strip()`ped; the line
  counts must agree; lines must be equal, or else all their whitespace-separated tokens
  must parse as `Decimal` and be equal (so "1.0" == "1", "3.50" == "3.5", but
  0.30000000000000004 != 0.3: no tolerance, exactly as LCB).
- functional: the return value is serialised to JSON in the sandbox and compared with
  Python `==` to the expected value after a JSON round trip (tuples become lists at every
  depth; LCB converts only a top-level tuple). NumPy scalars/arrays are converted with
  item()/tolist(); other non-JSON values (sets, custom objects) fail the case.
- A problem passes only if every case passes; cases run in order and the run stops at the
  first failure (as LCB does). Case numbers in reasons are 1-based.

Where verdicts are decided (issue #14): never in the process that runs the program. For
"stdin" and "functional", the sandbox returns the case's stdout / the JSON text of the return
value and THIS process compares it with the expected output, which never enters the sandbox
(a program writing a fake record on its result fd can only claim a value, which is then
compared like any other; exiting early with status 0 gives an empty output, or for
"functional" no value = runtime error). A pass therefore means every case's output matched.
For "assert", the checks run in a trusted evaluator process against stubs of the program's
functions (rspo/rewards/verdict.py). Not guaranteed in any kind: a program may still use CPU,
memory, processes and disk up to the sandbox limits (rspo/rewards/sandbox/__init__.py).

Reasons: "ok", "syntax error: ...", "wrong answer on case k: expected ..., got ...",
"timeout on case k", "runtime error on case k: ZeroDivisionError: division by zero",
"output limit exceeded on case k", "memory limit exceeded on case k",
"runtime error on case k: killed by SIGSEGV", "sandbox error: ...".

Deviations from LiveCodeBench: real processes instead of mocked stdin/stdout (see
rspo/rewards/sandbox/__init__.py), a default 1 GiB address-space limit (LCB has none), nested tuples accepted as
lists in functional tests, and extract_code also accepts an untagged final ``` block.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal, InvalidOperation
from typing import Any

from rspo.rewards.sandbox import CaseResult, Limits, run_python, sandbox_backend

__all__ = [
    "extract_code",
    "outputs_match",
    "score",
    "score_completion",
    "score_batch",
    "sandbox_backend",
    "DEFAULT_TIMEOUT",
    "DEFAULT_MEMORY_MB",
]

DEFAULT_TIMEOUT = 6.0
DEFAULT_MEMORY_MB = 1024
_TRUNC = 80

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


def extract_code(completion: str) -> str:
    """The program in a markdown completion.

    The last ```python (or ```py / ```python3) block; else the last untagged ``` block;
    else the whole text. A final block cut off before its closing fence is taken up to the
    end of the text.
    """
    if not isinstance(completion, str):
        raise TypeError(f"completion must be a str, got {type(completion).__name__}")
    blocks = [(m.group(1).lower(), m.group(2)) for m in _FENCE.finditer(completion)]
    for wanted in (("python", "py", "python3"), ("",)):
        for lang, body in reversed(blocks):
            if lang in wanted:
                return body
    return completion


def _lines(s: str) -> list[str]:
    return [line.strip() for line in s.strip().split("\n")]


def _decimals(line: str) -> list[Decimal] | None:
    try:
        return [Decimal(tok) for tok in line.split()]
    except (InvalidOperation, ValueError):
        return None


def outputs_match(got: str, expected: str) -> bool:
    """LiveCodeBench stdin comparison: stripped lines equal, else equal as Decimal tokens."""
    a, b = _lines(got), _lines(expected)
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x == y:
            continue
        dx, dy = _decimals(x), _decimals(y)
        if dx is None or dy is None or dx != dy:
            return False
    return True


def _short(s: Any) -> str:
    s = s if isinstance(s, str) else repr(s)
    s = s.replace("\n", "\\n")
    return s if len(s) <= _TRUNC else s[: _TRUNC - 3] + "..."


def _check_tests(tests: dict) -> tuple[str, list, list, str | None, Limits]:
    if not isinstance(tests, dict):
        raise ValueError(f"tests must be a dict, got {type(tests).__name__}")
    kind = tests.get("kind")
    if kind not in ("stdin", "functional"):
        raise ValueError(f"tests['kind'] must be 'stdin' or 'functional', got {kind!r}")
    cases = tests.get("cases")
    if not isinstance(cases, list) or not cases:
        raise ValueError("tests['cases'] must be a non-empty list")
    fn_name = None
    if kind == "functional":
        fn_name = tests.get("fn_name")
        if not (isinstance(fn_name, str) and fn_name.isidentifier()):
            raise ValueError(f"functional tests need tests['fn_name'], a Python identifier, got {fn_name!r}")
    inputs, outputs = [], []
    for i, c in enumerate(cases):
        if not isinstance(c, dict) or "input" not in c or "output" not in c:
            raise ValueError(f"tests['cases'][{i}] must be a dict with 'input' and 'output'")
        inp, out = c["input"], c["output"]
        if kind == "stdin":
            if not isinstance(inp, str) or not isinstance(out, str):
                raise ValueError(f"stdin case {i}: 'input' and 'output' must be strings")
        else:
            if not isinstance(inp, (list, tuple)):
                raise ValueError(f"functional case {i}: 'input' must be a list of arguments")
            try:
                out = json.loads(json.dumps(out))  # the form the program's result takes
            except (TypeError, ValueError) as exc:
                raise ValueError(f"functional case {i}: 'output' is not JSON-compatible: {exc}") from exc
        inputs.append(inp)
        outputs.append(out)
    timeout = tests.get("timeout", DEFAULT_TIMEOUT)
    memory_mb = tests.get("memory_mb", DEFAULT_MEMORY_MB)
    if not (
        isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and math.isfinite(timeout) and timeout > 0
    ):
        raise ValueError(f"tests['timeout'] must be a positive number of seconds, got {timeout!r}")
    if not (isinstance(memory_mb, int) and not isinstance(memory_mb, bool) and memory_mb > 0):
        raise ValueError(f"tests['memory_mb'] must be a positive int, got {memory_mb!r}")
    return kind, inputs, outputs, fn_name, Limits(timeout=float(timeout), memory_mb=memory_mb)


def _case_verdict(kind: str, case: CaseResult, expected: Any) -> str | None:
    """None if the case passed, else the reason (without the case number)."""
    if case.status == "timeout":
        return "timeout"
    if case.status == "output":
        return "output limit exceeded"
    if case.status == "memory":
        return "memory limit exceeded"
    if case.status in ("error", "signal"):
        return f"runtime error: {case.error}"
    if case.status != "ok":
        return f"runtime error: {case.status} {case.error}".strip()
    if kind == "stdin":
        if outputs_match(case.stdout, expected):
            return None
        return f"wrong answer: expected {_short(expected.strip())}, got {_short(case.stdout.strip())}"
    try:
        got = json.loads(case.value) if case.value is not None else None
    except (ValueError, RecursionError):  # malformed, or nested too deep to decode
        return "runtime error: unreadable return value"
    if got == expected:
        return None
    return f"wrong answer: expected {_short(json.dumps(expected))}, got {_short(case.value)}"


def _with_case(verdict: str, k: int) -> str:
    head, sep, tail = verdict.partition(": ")
    return f"{head} on case {k}" + (f": {tail}" if sep else "")


def _check_assert_tests(tests: dict) -> None:
    for key in ("code", "stubs", "timeout"):
        if key not in tests:
            raise ValueError(f"assert tests need tests[{key!r}]")
    if not isinstance(tests["code"], str) or not isinstance(tests.get("call", ""), str):
        raise ValueError("tests['code'] and tests['call'] must be strings")
    stubs = tests["stubs"]
    if not isinstance(stubs, (list, tuple)) or not all(isinstance(n, str) and n.isidentifier() for n in stubs):
        raise ValueError(f"tests['stubs'] must be a list of identifiers, got {stubs!r}")
    timeout = tests["timeout"]
    if not (
        isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and math.isfinite(timeout) and timeout > 0
    ):
        raise ValueError(f"tests['timeout'] must be a positive number of seconds, got {timeout!r}")


def score(program: str, tests: dict, *, backend: str | None = None) -> tuple[float, str]:
    """(1.0, "ok") if `program` passes every case of `tests` in the sandbox, else (0.0, reason)."""
    if not isinstance(program, str):
        raise TypeError(f"program must be a str, got {type(program).__name__}")
    if isinstance(tests, dict) and tests.get("kind") == "assert":
        from rspo.rewards.verdict import check_asserts

        _check_assert_tests(tests)
        return check_asserts(program, tests, backend=backend)
    kind, inputs, outputs, fn_name, limits = _check_tests(tests)
    first_failure: list[str] = []

    def on_case(case: CaseResult) -> bool:
        verdict = _case_verdict(kind, case, outputs[case.index])
        if verdict is not None:
            first_failure.append(_with_case(verdict, case.index + 1))
            return False
        return True

    res = run_python(program, kind, inputs, fn_name=fn_name, limits=limits, on_case=on_case, backend=backend)
    if res.compile_error is not None:
        return 0.0, f"syntax error: {res.compile_error}"
    if first_failure:
        return 0.0, first_failure[0]
    if res.failure is not None:  # the sandbox died while running case len(res.cases)
        return 0.0, f"runtime error on case {min(len(res.cases) + 1, len(inputs))}: {res.failure}"
    if len(res.cases) != len(inputs):
        return 0.0, f"sandbox error: {len(res.cases)} of {len(inputs)} cases reported"
    return 1.0, "ok"


def score_completion(completion: str, tests: dict, *, backend: str | None = None) -> tuple[float, str]:
    """score(extract_code(completion), tests): the reward for a model's markdown answer."""
    return score(extract_code(completion), tests, backend=backend)


def score_batch(
    programs: Sequence[str],
    tests_list: Sequence[dict],
    workers: int | None = None,
    *,
    extract: bool = False,
    backend: str | None = None,
) -> list[tuple[float, str]]:
    """Score many programs, `workers` sandboxes at a time (threads: each case is a process).

    extract=True applies extract_code to each program first (markdown completions).
    """
    if len(programs) != len(tests_list):
        raise ValueError(f"programs and tests_list differ in length: {len(programs)} != {len(tests_list)}")
    if workers is None:
        try:
            workers = max(1, len(os.sched_getaffinity(0)))
        except AttributeError:  # pragma: no cover - not Linux
            workers = max(1, os.cpu_count() or 1)
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive int, got {workers!r}")
    for t in tests_list:
        if isinstance(t, dict) and t.get("kind") == "assert":
            _check_assert_tests(t)
        else:
            _check_tests(t)
    fn = score_completion if extract else score
    if not programs:
        return []
    sandbox_backend(backend)  # probe once before the threads start
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="code-reward") as ex:
        return list(ex.map(lambda pt: fn(pt[0], pt[1], backend=backend), zip(programs, tests_list)))
