"""Code RL training data: the DeepCoder mix and LeetCodeDataset, normalised to one schema.

The paper trains Qwen3-30B-A3B for code on the DeepCoder mix. Sources and their upstream schemas:

- ``agentica-org/DeepCoder-Preview-Dataset`` (pinned at ``DEEPCODER_REVISION``), configs
  ``primeintellect`` (16,252), ``taco`` (7,436) and ``lcbv5`` (train). Each row has ``problem``,
  ``starter_code``, ``metadata`` ({"func_name": ...}, a struct or a JSON string) and ``tests``, a
  JSON **string** in one of three encodings:
    * TACO:  ``{"inputs": [...], "outputs": [...], "fn_name"?: str}``; stdin inputs/outputs are
      strings (or lists of lines); call-based inputs are argument lists and outputs are wrapped in a
      one-element list (APPS convention).
    * PrimeIntellect: ``[{"type": "stdin_stdout" | "function_call", "input", "output",
      "fn_name"?}, ...]`` (PrimeIntellect's ``verification_info.test_cases``).
    * LiveCodeBench: ``[{"input", "output", "testtype": "stdin" | "functional"}, ...]``; a
      functional input is one JSON value per line (one per positional argument) and the output is
      one JSON value.
- ``newfacade/LeetCodeDataset`` (train split, 2,641 problems): ``problem_description``,
  ``starter_code`` (``class Solution: def f(self, ...)``), ``entry_point``
  (``"Solution().f"``), ``test`` (``def check(candidate): assert candidate(a = 1, b = [2]) == 3``)
  and ``input_output`` (``[{"input": "a = 1, b = [2]", "output": "3"}]``).
- LiveCodeBench release files (``test.jsonl`` ... ``test6.jsonl``, see rspo.evaluate.benchmarks)
  can also be given as training files; they carry ``contest_date`` and are cut like ``lcbv5``.

Normalised record (one per problem)::

    {"prompt": str, "starter_code": str, "source": str,
     "tests": {"kind": "stdin", "cases": [{"input": str, "output": str}, ...]}
           or {"kind": "functional", "fn_name": str, "cases": [{"input": [args...], "output": value}]},
     "solution": str}     # a reference program when upstream has one (DeepCoder ``solutions[0]``,
                          # LeetCode ``completion``, the fallback's), else "" (used only for SFT)

``tests`` is what ``rspo.rewards.code.score(program, tests)`` takes.

Leakage cut: the code benchmark is LiveCodeBench v4-v5 (problems released 2024-08-01 .. 2025-01-31,
i.e. added by release_v4 and release_v5). Training keeps only problems released before
``LCB_TRAIN_CUTOFF`` = 2024-08-01 (contest_date < cutoff); this is also DeepCoder's own LCB training
window (2023-05-01 .. 2024-07-31). The cut is applied to every row that carries a date: LCB rows
(``contest_date``) and LeetCode rows (``estimated_date``; LeetCode problems are a third of LCB).
DeepCoder's ``lcbv5`` rows carry no date upstream: they are kept as DeepCoder split them (its train
split is the pre-2024-08 window) and counted as ``undated_kept``.

Deviations / choices (each says what upstream does):
- TACO / PrimeIntellect call-based outputs are unwrapped when they are a one-element list (APPS
  convention ``outputs[i] = [return_value]``); TACO's grader accepts either the raw or the unwrapped
  value, our functional test holds one expected value.
- LeetCode cases are read from the ``test`` function (Python literals, exactly what the dataset's
  own checker asserts) rather than from ``input_output``, whose ``output`` column is ``str()`` of
  the return value (ambiguous for strings) and also holds canonical-solution failures
  ("Error: ...", "Execution timed out"). Asserts that are not ``candidate(<literals>) ==
  <literal>`` (ListNode / TreeNode helpers, float tolerances) are skipped; a problem left with no
  case is dropped (counted). ``input_output`` is used only when ``test`` is absent. Keyword
  arguments are put in the signature's order (parsed from ``starter_code``).
- All of a problem's tests are kept by default; rLLM keeps only the 15 with the longest inputs for
  TACO / PrimeIntellect (``max_cases`` reproduces a cap, keeping the longest inputs).
- Problems whose tests mix stdin and call-based cases, or cannot be decoded, are dropped and
  counted, never silently altered.
- ``generate_code_problems`` (rspo.data.code_fallback) is an OFFLINE FALLBACK (templated stdin /
  function problems with reference outputs computed there) so the smoke preset can train a tiny
  code model without a hub.
  It is not the DeepCoder mix and shares nothing with the code benchmarks.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import pickle
import random
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from rspo.data.leetcode_tests import cases_from_io, cases_from_test, signature_params
from rspo.data.math import read_rows

log = logging.getLogger(__name__)

DEEPCODER_REPO = "agentica-org/DeepCoder-Preview-Dataset"
# Commit of the hub dataset repository (main, "Update README.md").
DEEPCODER_REVISION = "177913a7bd43791646ef6a43645caa3c871ab3db"
DEEPCODER_CONFIGS = ("primeintellect", "taco", "lcbv5")
LEETCODE_REPO = "newfacade/LeetCodeDataset"
# Commit of the hub dataset repository holding LeetCodeDataset v0.3.1 (train 2,641 / test 228).
LEETCODE_REVISION = "215604aeed660029df7de2fea5a4d7b6ed476a08"
CODE_MIX = ("primeintellect", "taco", "lcbv5", "leetcode")
# First day of the LiveCodeBench v4-v5 evaluation window; training keeps contest_date < this.
LCB_TRAIN_CUTOFF = "2024-08-01"
FALLBACK_SOURCE = "code_fallback"
TEST_KINDS = ("stdin", "functional")


# ----------------------------------------------------------------------------------------------
# Test decoding
# ----------------------------------------------------------------------------------------------
def _lines(x: Any, where: str) -> str:
    """A stdin/stdout blob: a string, or a list of lines joined with newlines (TACO/APPS)."""
    if isinstance(x, str):
        return x
    if isinstance(x, list) and all(isinstance(s, str) for s in x):
        return "\n".join(x)
    raise ValueError(f"{where}: expected a string or a list of lines, got {type(x).__name__}")


def _unwrap(x: Any) -> Any:
    """APPS/TACO call-based expected outputs are stored as [return_value]."""
    return x[0] if isinstance(x, list) and len(x) == 1 else x


def _as_args(x: Any) -> list:
    """Call-based input -> positional argument list."""
    if isinstance(x, list):
        return x
    if isinstance(x, str):
        # Some dumps store the argument list as a JSON string, one argument per line.
        try:
            return [json.loads(line) for line in x.split("\n") if line.strip()]
        except json.JSONDecodeError:
            return [x]
    return [x]


def _cap_cases(cases: list[dict], max_cases: int | None) -> list[dict]:
    """Keep the ``max_cases`` cases with the longest inputs (rLLM's rule), in original order."""
    if max_cases is None or len(cases) <= max_cases:
        return cases
    size = [len(c["input"]) if isinstance(c["input"], str) else len(json.dumps(c["input"])) for c in cases]
    keep = sorted(sorted(range(len(cases)), key=lambda i: -size[i])[:max_cases])
    return [cases[i] for i in keep]


def parse_taco_tests(tests: dict, fn_name: str | None = None, where: str = "taco") -> dict:
    """TACO ``{"inputs", "outputs", "fn_name"?}`` -> normalised tests."""
    if not isinstance(tests, dict) or "inputs" not in tests or "outputs" not in tests:
        raise ValueError(f"{where}: TACO tests need 'inputs' and 'outputs'")
    ins, outs = tests["inputs"], tests["outputs"]
    if not isinstance(ins, list) or not isinstance(outs, list) or len(ins) != len(outs):
        raise ValueError(f"{where}: 'inputs' and 'outputs' must be lists of equal length")
    fn = tests.get("fn_name") or fn_name
    if fn:
        cases = [{"input": _as_args(i), "output": _unwrap(o)} for i, o in zip(ins, outs)]
        return {"kind": "functional", "fn_name": str(fn), "cases": cases}
    cases = [{"input": _lines(i, where), "output": _lines(o, where)} for i, o in zip(ins, outs)]
    return {"kind": "stdin", "cases": cases}


def parse_primeintellect_tests(tests: list, fn_name: str | None = None, where: str = "primeintellect") -> dict:
    """PrimeIntellect ``[{"type": "stdin_stdout"|"function_call", "input", "output", "fn_name"?}]``."""
    if not isinstance(tests, list) or not tests:
        raise ValueError(f"{where}: PrimeIntellect tests must be a non-empty list")
    types = {t.get("type") for t in tests}
    if types == {"stdin_stdout"}:
        cases = [{"input": _lines(t["input"], where), "output": _lines(t["output"], where)} for t in tests]
        return {"kind": "stdin", "cases": cases}
    if types == {"function_call"}:
        fn = tests[0].get("fn_name") or fn_name
        if not fn:
            raise ValueError(f"{where}: function_call tests without fn_name")
        cases = [{"input": _as_args(t["input"]), "output": _unwrap(t["output"])} for t in tests]
        return {"kind": "functional", "fn_name": str(fn), "cases": cases}
    raise ValueError(f"{where}: unsupported or mixed test types {sorted(map(str, types))}")


def parse_lcb_tests(tests: list, fn_name: str | None = None, where: str = "lcb") -> dict:
    """LiveCodeBench ``[{"input", "output", "testtype": "stdin"|"functional"}]`` -> normalised.

    Functional: each input line is ``json.loads``-ed into one positional argument and the expected
    value is ``json.loads(output)`` (lcb_runner's grader)."""
    if not isinstance(tests, list) or not tests:
        raise ValueError(f"{where}: LiveCodeBench tests must be a non-empty list")
    types = {t.get("testtype") for t in tests}
    if types == {"stdin"}:
        return {"kind": "stdin", "cases": [{"input": t["input"], "output": t["output"]} for t in tests]}
    if types == {"functional"}:
        if not fn_name:
            raise ValueError(f"{where}: functional tests need metadata func_name")
        cases = []
        for t in tests:
            try:
                args = [json.loads(line) for line in t["input"].split("\n") if line.strip()]
                out = json.loads(t["output"])
            except (json.JSONDecodeError, AttributeError) as e:
                raise ValueError(f"{where}: functional test is not JSON ({e})") from None
            cases.append({"input": args, "output": out})
        return {"kind": "functional", "fn_name": str(fn_name), "cases": cases}
    raise ValueError(f"{where}: unsupported or mixed testtype {sorted(map(str, types))}")


def decode_lcb_private(s: str) -> list:
    """LiveCodeBench ``private_test_cases``: a JSON string, or base64(zlib(pickle(json_str)))."""
    try:
        return json.loads(s)
    except json.JSONDecodeError:
        pass
    try:
        # pickle of a str from LiveCodeBench's own release files (trusted upstream data).
        return json.loads(pickle.loads(zlib.decompress(base64.b64decode(s.encode("utf-8")))))
    except Exception as e:  # noqa: BLE001 - any failure means the blob is not in either encoding
        raise ValueError(f"private_test_cases is neither JSON nor base64(zlib(pickle(json))): {e}") from None


def _metadata(row: dict) -> dict:
    md = row.get("metadata") or {}
    if isinstance(md, str):
        md = json.loads(md) if md.strip() else {}
    if not isinstance(md, dict):
        raise ValueError(f"metadata must be an object or a JSON string, got {type(md).__name__}")
    return md


def decode_deepcoder_tests(tests: Any, fn_name: str | None = None, where: str = "deepcoder") -> tuple[str, dict]:
    """DeepCoder ``tests`` (JSON string or decoded) -> (encoding name, normalised tests).

    The encoding is recognised from its shape: a dict = TACO, a list with ``testtype`` =
    LiveCodeBench, a list with ``type`` = PrimeIntellect."""
    if isinstance(tests, str):
        try:
            tests = json.loads(tests)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: tests is not valid JSON ({e.msg})") from None
    if isinstance(tests, dict):
        return "taco", parse_taco_tests(tests, fn_name, where)
    if isinstance(tests, list) and tests and isinstance(tests[0], dict):
        if "testtype" in tests[0]:
            return "lcb", parse_lcb_tests(tests, fn_name, where)
        if "type" in tests[0]:
            return "primeintellect", parse_primeintellect_tests(tests, fn_name, where)
    raise ValueError(f"{where}: unrecognised tests encoding (expected TACO dict or a list of test dicts)")


def validate_tests(tests: dict, where: str = "tests") -> None:
    """Check a normalised tests dict (what rspo.rewards.code.score takes)."""
    if not isinstance(tests, dict) or tests.get("kind") not in TEST_KINDS:
        raise ValueError(f"{where}: 'kind' must be one of {list(TEST_KINDS)}")
    cases = tests.get("cases")
    if not isinstance(cases, list) or not cases:
        raise ValueError(f"{where}: 'cases' must be a non-empty list")
    for j, c in enumerate(cases):
        if not isinstance(c, dict) or "input" not in c or "output" not in c:
            raise ValueError(f"{where}: case {j} needs 'input' and 'output'")
        if tests["kind"] == "stdin" and not (isinstance(c["input"], str) and isinstance(c["output"], str)):
            raise ValueError(f"{where}: stdin case {j} needs string input and output")
        if tests["kind"] == "functional" and not isinstance(c["input"], list):
            raise ValueError(f"{where}: functional case {j} needs a list of arguments as input")
    if tests["kind"] == "functional" and not (isinstance(tests.get("fn_name"), str) and tests["fn_name"]):
        raise ValueError(f"{where}: functional tests need 'fn_name'")


RECORD_FIELDS = ("prompt", "starter_code", "tests", "source", "solution")


def validate_code_record(rec: dict, where: str = "record") -> None:
    """Check one normalised record {prompt, starter_code, tests, source, solution?}."""
    if not isinstance(rec, dict):
        raise ValueError(f"{where}: expected an object")
    missing = [k for k in ("prompt", "starter_code", "tests", "source") if k not in rec]
    if missing:
        raise ValueError(f"{where}: missing field(s) {missing}")
    if not isinstance(rec["prompt"], str) or not rec["prompt"].strip():
        raise ValueError(f"{where}: 'prompt' must be a non-empty string")
    if not isinstance(rec["starter_code"], str):
        raise ValueError(f"{where}: 'starter_code' must be a string")
    if not isinstance(rec.get("solution", ""), str):
        raise ValueError(f"{where}: 'solution' must be a string")
    validate_tests(rec["tests"], f"{where}.tests")


# ----------------------------------------------------------------------------------------------
# Dates (leakage cut)
# ----------------------------------------------------------------------------------------------
def _date_str(x: Any) -> str | None:
    """ISO date 'YYYY-MM-DD' of a date/datetime/ISO string, or None."""
    if x is None or x == "":
        return None
    if hasattr(x, "isoformat"):
        x = x.isoformat()
    s = str(x)
    if len(s) < 10 or s[4] != "-" or s[7] != "-":
        raise ValueError(f"unrecognised date {s!r} (expected ISO YYYY-MM-DD...)")
    return s[:10]


def before_cutoff(date: Any, cutoff: str | None = LCB_TRAIN_CUTOFF) -> bool | None:
    """True if ``date`` < cutoff (or no cutoff), False if on/after it, None if there is no date."""
    d = _date_str(date)
    if d is None:
        return None
    return True if cutoff is None else d < _date_str(cutoff)  # type: ignore[operator]


# ----------------------------------------------------------------------------------------------
# Normalisers per source
# ----------------------------------------------------------------------------------------------
class _Dropped(Exception):
    """A row left out of the training mix, counted under ``<source>:<reason>``."""

    def __init__(self, reason: str, why: object = None):
        super().__init__(reason)
        self.reason, self.why = reason, why


def _normalise(
    rows: Iterable[dict], label: str, stat: str, convert: Callable[[dict, str], dict], stats: Counter | None
) -> list[dict]:
    """The one row loop of the normalisers: ``convert(row, where)`` gives a record or raises _Dropped
    (counted in ``stats`` as ``<stat>:<reason>``; a malformed row's ValueError propagates); the kept
    rows are counted as ``<stat>:kept``."""
    stats = Counter() if stats is None else stats
    out = []
    for i, row in enumerate(rows):
        where = f"{label} row {i}"
        try:
            out.append(convert(row, where))
        except _Dropped as d:
            stats[f"{stat}:{d.reason}"] += 1
            if d.why is not None:
                log.debug("%s dropped: %s", where, d.why)
    stats[f"{stat}:kept"] += len(out)
    return out


def normalise_deepcoder(
    rows: Iterable[dict],
    config: str,
    cutoff: str | None = LCB_TRAIN_CUTOFF,
    max_cases: int | None = None,
    stats: Counter | None = None,
) -> list[dict]:
    """DeepCoder rows of one config -> normalised records (bad rows dropped and counted)."""
    stats = Counter() if stats is None else stats

    def convert(row: dict, where: str) -> dict:
        missing = [k for k in ("problem", "tests") if k not in row]
        if missing:
            raise ValueError(
                f"{where}: missing field(s) {missing}; the DeepCoder schema is problem, starter_code, "
                f"tests, metadata; got fields {sorted(row)}"
            )
        try:
            md = _metadata(row)
        except ValueError as e:
            raise ValueError(f"{where}: bad metadata ({e})") from None
        date = row.get("contest_date", md.get("contest_date"))
        keep = before_cutoff(date, cutoff)
        if keep is False:
            raise _Dropped("after_cutoff")
        if keep is None and config == "lcbv5":
            stats["deepcoder/lcbv5:undated_kept"] += 1
        try:
            _, tests = decode_deepcoder_tests(row["tests"], md.get("func_name"), where)
            tests["cases"] = _cap_cases(tests["cases"], max_cases)
            validate_tests(tests, where)
        except (ValueError, KeyError, TypeError) as e:
            raise _Dropped("bad_tests", e) from None
        sols = row.get("solutions") or []
        return {
            "prompt": row["problem"],
            "starter_code": row.get("starter_code") or "",
            "tests": tests,
            "source": f"deepcoder/{config}",
            "solution": sols[0] if sols and isinstance(sols[0], str) else "",
        }

    return _normalise(rows, f"deepcoder/{config}", f"deepcoder/{config}", convert, stats)


def normalise_leetcode(
    rows: Iterable[dict],
    cutoff: str | None = LCB_TRAIN_CUTOFF,
    max_cases: int | None = None,
    stats: Counter | None = None,
) -> list[dict]:
    """LeetCodeDataset rows -> normalised functional records (see module docstring)."""

    def convert(row: dict, where: str) -> dict:
        missing = [k for k in ("problem_description", "starter_code", "entry_point") if k not in row]
        if missing or ("test" not in row and "input_output" not in row):
            raise ValueError(
                f"{where}: missing field(s) {missing or ['test/input_output']}; the LeetCodeDataset "
                f"schema has problem_description, starter_code, entry_point, test, input_output; "
                f"got fields {sorted(row)}"
            )
        if before_cutoff(row.get("estimated_date"), cutoff) is False:
            raise _Dropped("after_cutoff")
        fn = str(row["entry_point"]).split(".")[-1].strip()
        params = signature_params(row["starter_code"], fn)
        try:
            if row.get("test"):
                cases = cases_from_test(row["test"], params)
            else:
                cases = cases_from_io(row.get("input_output") or [], params)
        except (SyntaxError, ValueError) as e:
            raise _Dropped("bad_tests", e) from None
        if not cases:
            raise _Dropped("no_literal_cases")
        return {
            "prompt": row["problem_description"],
            "starter_code": row["starter_code"],
            "tests": {"kind": "functional", "fn_name": fn, "cases": _cap_cases(cases, max_cases)},
            "source": "leetcode",
            "solution": row.get("completion") or "",
        }

    return _normalise(rows, "leetcode", "leetcode", convert, stats)


def lcb_row_tests(row: dict, where: str = "livecodebench") -> dict:
    """A LiveCodeBench release row -> normalised tests from public + private test cases."""
    for k in ("public_test_cases", "private_test_cases", "metadata"):
        if k not in row:
            raise ValueError(f"{where}: missing field {k!r} (LiveCodeBench release schema)")
    public = row["public_test_cases"]
    public = json.loads(public) if isinstance(public, str) else public
    private = row["private_test_cases"]
    private = decode_lcb_private(private) if isinstance(private, str) else private
    md = _metadata(row)
    return parse_lcb_tests(list(public) + list(private), md.get("func_name"), where)


def normalise_lcb_release(
    rows: Iterable[dict],
    cutoff: str | None = LCB_TRAIN_CUTOFF,
    max_cases: int | None = None,
    stats: Counter | None = None,
) -> list[dict]:
    """LiveCodeBench release rows (test*.jsonl) as TRAINING records, keeping contest_date < cutoff."""

    def convert(row: dict, where: str) -> dict:
        if "question_content" not in row or "contest_date" not in row:
            raise ValueError(f"{where}: missing question_content/contest_date (LiveCodeBench release schema)")
        if before_cutoff(row["contest_date"], cutoff) is False:
            raise _Dropped("after_cutoff")
        tests = lcb_row_tests(row, where)
        tests["cases"] = _cap_cases(tests["cases"], max_cases)
        return {
            "prompt": row["question_content"],
            "starter_code": row.get("starter_code") or "",
            "tests": tests,
            "source": "livecodebench",
            "solution": "",
        }

    return _normalise(rows, "livecodebench", "lcb", convert, stats)


# ----------------------------------------------------------------------------------------------
# Loaders
# ----------------------------------------------------------------------------------------------
def hub_source(source: str) -> tuple[str, str | None, str]:
    """(repository, config, pinned revision) of one source of the code mix."""
    if source == "leetcode":
        return LEETCODE_REPO, None, LEETCODE_REVISION
    return DEEPCODER_REPO, source, DEEPCODER_REVISION


def hub_rows(repo: str, config: str | None, split: str, revision: str, limit: int | None) -> list[dict]:
    """Rows of a hub dataset at a pinned revision (network; the first ``limit``, streamed)."""
    import datasets  # lazy: only online

    if limit is None:
        return list(datasets.load_dataset(repo, config, split=split, revision=revision))
    stream = datasets.load_dataset(repo, config, split=split, revision=revision, streaming=True)
    return list(stream.take(limit))


def load_code_hub(
    sources: Sequence[str] = CODE_MIX,
    limit: int | None = None,
    cutoff: str | None = LCB_TRAIN_CUTOFF,
    max_cases: int | None = None,
    stats: Counter | None = None,
    fetched: str | os.PathLike | None = None,
) -> list[dict]:
    """The code mix from the hub at pinned revisions (network; only called when asked), or from the
    folder the workflow's ``fetch_data`` rule fetched them into (``fetched``: rspo.data.fetched).

    ``limit`` caps the rows read from EACH source (streamed, so nothing else is downloaded)."""
    from rspo.data.fetched import rows_of

    unknown = [s for s in sources if s not in CODE_MIX]
    if unknown:
        raise ValueError(f"unknown code source(s) {unknown}; choose from {list(CODE_MIX)}")
    stats = Counter() if stats is None else stats
    out: list[dict] = []
    for s in sources:
        repo, config, revision = hub_source(s)
        if fetched is not None:
            rows = rows_of(fetched, f"train.{s}", revision, limit)
        else:
            rows = hub_rows(repo, config, "train", revision, limit)
        if s == "leetcode":
            out += normalise_leetcode(rows, cutoff, max_cases, stats)
        else:
            out += normalise_deepcoder(rows, s, cutoff, max_cases, stats)
    return out


def detect_code_schema(row: dict) -> str:
    """Which schema a row is in: 'normalised', 'leetcode', 'livecodebench' or 'deepcoder'."""
    if "prompt" in row and isinstance(row.get("tests"), dict) and "source" in row:
        return "normalised"
    if "problem_description" in row and "entry_point" in row:
        return "leetcode"
    if "question_content" in row and "public_test_cases" in row:
        return "livecodebench"
    if "problem" in row and "tests" in row:
        return "deepcoder"
    raise ValueError(
        "unrecognised code data schema; expected DeepCoder (problem, tests, ...), LeetCodeDataset "
        f"(problem_description, entry_point, test, ...), LiveCodeBench (question_content, "
        f"public_test_cases, ...) or normalised records (prompt, starter_code, tests, source); "
        f"got fields {sorted(row)}"
    )


def load_code_file(
    path: str | os.PathLike,
    limit: int | None = None,
    cutoff: str | None = LCB_TRAIN_CUTOFF,
    max_cases: int | None = None,
    stats: Counter | None = None,
) -> list[dict]:
    """A local file in DeepCoder, LeetCodeDataset, LiveCodeBench or the normalised schema (the
    output of ``python -m rspo prepare code``) -> normalised records.

    DeepCoder rows are labelled by the encoding of their tests (taco / primeintellect / lcbv5)."""
    rows = read_rows(path)
    if not rows:
        raise ValueError(f"{path}: no rows")
    if limit is not None:
        rows = rows[:limit]
    stats = Counter() if stats is None else stats
    schema = detect_code_schema(rows[0])
    if schema == "normalised":
        for i, r in enumerate(rows):
            validate_code_record(r, f"{path} row {i}")
        return [{**{k: r.get(k, "") for k in RECORD_FIELDS}} for r in rows]
    if schema == "leetcode":
        return normalise_leetcode(rows, cutoff, max_cases, stats)
    if schema == "livecodebench":
        return normalise_lcb_release(rows, cutoff, max_cases, stats)
    out = []
    label = {"taco": "taco", "primeintellect": "primeintellect", "lcb": "lcbv5"}
    for row in rows:
        try:
            enc, _ = decode_deepcoder_tests(row.get("tests"), _metadata(row).get("func_name"))
        except ValueError:
            enc = "taco"  # let normalise_deepcoder count it as bad tests under some label
        out += normalise_deepcoder([row], label[enc], cutoff, max_cases, stats)
    return out


def load_code_train(
    source: str = "fallback",
    limit: int | None = None,
    seed: int = 0,
    n_fallback: int = 2000,
    sources: Sequence[str] = CODE_MIX,
    cutoff: str | None = LCB_TRAIN_CUTOFF,
    max_cases: int | None = None,
    stats: Counter | None = None,
) -> list[dict]:
    """Normalised code training records from ``"hub"`` (the mix), ``"fallback"`` or a file path.

    With ``"hub"`` and ``limit``, ``limit`` rows are streamed from each source, the union is
    shuffled with ``seed`` and cut to ``limit`` so that every source is represented."""
    from rspo.data.fetched import is_fetched

    stats = Counter() if stats is None else stats
    if source == "hub" or is_fetched(source):
        recs = load_code_hub(sources, limit, cutoff, max_cases, stats, fetched=None if source == "hub" else source)
        if limit is not None:
            random.Random(seed).shuffle(recs)
            recs = recs[:limit]
        return recs
    if source == "fallback":
        n = limit if limit is not None else n_fallback
        from rspo.data.code_fallback import generate_code_problems

        recs = normalise_deepcoder(generate_code_problems(n, seed), "taco", cutoff, max_cases, stats)
        for r in recs:
            r["source"] = FALLBACK_SOURCE
        return recs
    if not source:
        raise ValueError("code source must be 'hub', 'fallback' or a file path")
    return load_code_file(source, limit, cutoff, max_cases, stats)
