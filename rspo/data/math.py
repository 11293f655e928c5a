"""Math RL training data: DeepScaleR, local files in its schema, and an offline arithmetic fallback.

The paper trains Qwen3-30B-A3B on DeepScaleR (``agentica-org/DeepScaleR-Preview-Dataset``, 40,315
problems, one file ``deepscaler.json`` with fields ``problem``, ``solution`` (may be ""),
``answer``). Every source here is normalised to one record per problem::

    {"prompt": str,                 # the raw problem text (no template; rspo.prompts adds it)
     "answer": str | list[str],     # gold answer(s), graded by rspo.rewards.math
     "source": str}                 # "deepscaler", "arithmetic_fallback" or the file's name

Sources (``load_math_train``):
- ``"hub"``: DeepScaleR from the Hugging Face hub at the pinned revision
  ``DEEPSCALER_REVISION`` (the dataset repository's commit b6ae8c6 "Update README.md", whose
  ``deepscaler.json`` is the released 40,315-problem file). Only loaded when asked.
- a path: a local ``.json`` (a list of rows), ``.jsonl`` or ``.parquet`` file in the DeepScaleR
  schema (``problem`` and ``answer`` required, ``solution`` optional).
- ``"fallback"``: a procedurally generated set of arithmetic word problems in the DeepScaleR
  schema, seeded and deterministic, with integer answers.

Deviations:
- The fallback is NOT DeepScaleR. It is what the smoke preset trains its tiny math model on when
  no hub is reachable, so that the whole pipeline (prepare -> train -> evaluate) runs offline.
  Its problems are generated from templates (one- and two-step +, -, x, / stories); they share no
  text with the evaluation suites (AIME24, AMC, MATH500, Minerva, OlympiadBench), which are never
  used for training, so there is no leakage. Numbers obtained on it say nothing about the paper.
- Rows whose ``answer`` is empty are rejected with an error naming the row (DeepScaleR has none);
  nothing is silently dropped.
"""

from __future__ import annotations

import gzip
import json
import os
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

DEEPSCALER_REPO = "agentica-org/DeepScaleR-Preview-Dataset"
# Commit of the hub dataset repository (main, "Update README.md"); deepscaler.json = 40,315 rows.
DEEPSCALER_REVISION = "b6ae8c60f5c1f2b594e2140b91c49c9ad0949e29"
DEEPSCALER_SIZE = 40_315

FALLBACK_SOURCE = "arithmetic_fallback"
# Fields of one normalised math record.
RECORD_FIELDS = ("prompt", "answer", "source")


# ----------------------------------------------------------------------------------------------
# File reading (shared with rspo.data.code)
# ----------------------------------------------------------------------------------------------
def read_rows(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Read a table of rows from ``.json`` (a list of objects), ``.jsonl`` (one object per
    line), either optionally gzipped, or ``.parquet``. Raises FileNotFoundError / ValueError."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"data file not found: {p}")
    name = p.name.lower()
    if name.endswith(".parquet"):
        import pyarrow.parquet as pq

        return pq.read_table(p).to_pylist()
    opener = gzip.open if name.endswith(".gz") else open
    stem = name[:-3] if name.endswith(".gz") else name
    if stem.endswith(".jsonl"):
        from rspo.jsonl import iter_jsonl

        return [row for _, row in iter_jsonl(p)]
    if stem.endswith(".json"):
        with opener(p, "rt", encoding="utf-8") as f:
            try:
                data = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"{p}: invalid JSON ({e.msg} at line {e.lineno})") from None
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise ValueError(f"{p}: a .json data file must hold a list of objects")
        return data
    raise ValueError(f"{p}: unsupported file type; use .json, .jsonl (optionally .gz) or .parquet")


# ----------------------------------------------------------------------------------------------
# Normalisation and validation
# ----------------------------------------------------------------------------------------------
def normalise_answer(answer: Any, where: str) -> str | list[str]:
    """Gold answer as str or list[str]. Integral floats become "142" (not "142.0")."""
    if isinstance(answer, bool):
        raise ValueError(f"{where}: answer must be a string, number or list of strings, got bool")
    if isinstance(answer, int):
        return str(answer)
    if isinstance(answer, float):
        if answer != answer or answer in (float("inf"), float("-inf")):
            raise ValueError(f"{where}: answer is not a finite number ({answer})")
        return str(int(answer)) if answer.is_integer() else repr(answer)
    if isinstance(answer, str):
        if not answer.strip():
            raise ValueError(f"{where}: answer is empty")
        return answer.strip()
    if isinstance(answer, (list, tuple)):
        out = [normalise_answer(a, where) for a in answer]
        if not out:
            raise ValueError(f"{where}: answer list is empty")
        return [a if isinstance(a, str) else str(a) for a in out]  # type: ignore[misc]
    raise ValueError(f"{where}: answer must be a string, number or list of strings, got {type(answer).__name__}")


def normalise_deepscaler(rows: Iterable[dict[str, Any]], source: str = "deepscaler") -> list[dict]:
    """DeepScaleR-schema rows ({problem, answer, solution?}) -> records {prompt, answer, source}.

    Raises ValueError naming the first bad row (missing field, wrong type, empty text)."""
    out = []
    for i, row in enumerate(rows):
        where = f"{source} row {i}"
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected an object, got {type(row).__name__}")
        missing = [k for k in ("problem", "answer") if k not in row]
        if missing:
            raise ValueError(
                f"{where}: missing field(s) {missing}; the DeepScaleR schema is "
                f"problem, answer (, solution); got fields {sorted(row)}"
            )
        problem = row["problem"]
        if not isinstance(problem, str) or not problem.strip():
            raise ValueError(f"{where}: 'problem' must be a non-empty string")
        out.append({"prompt": problem, "answer": normalise_answer(row["answer"], where), "source": source})
    return out


def validate_math_record(rec: dict[str, Any], where: str = "record") -> None:
    """Check one normalised record {prompt: str, answer: str | list[str], source: str}."""
    if not isinstance(rec, dict):
        raise ValueError(f"{where}: expected an object, got {type(rec).__name__}")
    missing = [k for k in RECORD_FIELDS if k not in rec]
    if missing:
        raise ValueError(f"{where}: missing field(s) {missing}; expected {list(RECORD_FIELDS)}")
    if not isinstance(rec["prompt"], str) or not rec["prompt"].strip():
        raise ValueError(f"{where}: 'prompt' must be a non-empty string")
    ans = rec["answer"]
    ok = (isinstance(ans, str) and ans.strip()) or (
        isinstance(ans, list) and ans and all(isinstance(a, str) and a.strip() for a in ans)
    )
    if not ok:
        raise ValueError(f"{where}: 'answer' must be a non-empty string or list of strings")
    if not isinstance(rec["source"], str) or not rec["source"]:
        raise ValueError(f"{where}: 'source' must be a non-empty string")


# ----------------------------------------------------------------------------------------------
# Loaders
# ----------------------------------------------------------------------------------------------
def load_deepscaler_hub(
    revision: str = DEEPSCALER_REVISION, limit: int | None = None, fetched: str | os.PathLike | None = None
) -> list[dict]:
    """DeepScaleR from the hub at a pinned revision (network; only called when asked), or from the
    folder the workflow's ``fetch_data`` rule fetched it into (``fetched``: rspo.data.fetched)."""
    if fetched is not None:
        from rspo.data.fetched import rows_of

        return normalise_deepscaler(rows_of(fetched, "train.deepscaler", revision, limit), source="deepscaler")
    import datasets  # lazy: heavy, and only needed online

    ds = datasets.load_dataset(DEEPSCALER_REPO, split="train", revision=revision)
    if limit is not None:
        ds = ds.select(range(min(limit, len(ds))))
    return normalise_deepscaler(ds, source="deepscaler")


def load_math_file(path: str | os.PathLike, limit: int | None = None) -> list[dict]:
    """A local .json/.jsonl/.parquet file -> normalised records.

    Accepts the DeepScaleR schema (problem, answer, solution?) and the normalised schema this
    module writes (prompt, answer, source; e.g. the output of ``python -m rspo prepare math``)."""
    rows = read_rows(path)
    if limit is not None:
        rows = rows[:limit]
    if not rows:
        raise ValueError(f"{path}: no rows")
    if "prompt" in rows[0] and "problem" not in rows[0]:
        for i, r in enumerate(rows):
            validate_math_record(r, f"{path} row {i}")
        return [{k: r[k] for k in RECORD_FIELDS} for r in rows]
    return normalise_deepscaler(rows, source=Path(path).name)


# ----------------------------------------------------------------------------------------------
# Offline fallback: arithmetic word problems in the DeepScaleR schema
# ----------------------------------------------------------------------------------------------
_NAMES = ("Ava", "Ben", "Chloe", "Dan", "Emma", "Finn", "Grace", "Hugo", "Iris", "Jack", "Lena", "Omar")
_ITEMS = ("apple", "marble", "book", "pencil", "sticker", "cookie", "stamp", "shell", "card", "coin")


def _story(rng: random.Random) -> tuple[str, str, int]:
    """One problem: (problem text, worked solution ending in \\boxed{answer}, integer answer)."""
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    kind = rng.randrange(7)
    if kind == 0:  # a + b
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        ans = a + b
        text = f"{name} has {a} {item}s and gets {b} more. How many {item}s does {name} have now?"
        sol = f"{name} has {a} + {b} = {ans} {item}s."
    elif kind == 1:  # a - b, a > b
        a = rng.randint(10, 99)
        b = rng.randint(1, a - 1)
        ans = a - b
        text = f"{name} has {a} {item}s and gives away {b}. How many {item}s are left?"
        sol = f"{a} - {b} = {ans} {item}s are left."
    elif kind == 2:  # a * b
        a, b = rng.randint(2, 12), rng.randint(2, 12)
        ans = a * b
        text = f"{name} buys {a} boxes with {b} {item}s in each box. How many {item}s does {name} buy?"
        sol = f"{a} x {b} = {ans} {item}s."
    elif kind == 3:  # (a*b) / b
        a, b = rng.randint(2, 12), rng.randint(2, 9)
        ans = a
        text = f"{name} shares {a * b} {item}s equally among {b} friends. How many {item}s does each friend get?"
        sol = f"{a * b} / {b} = {ans} {item}s each."
    elif kind == 4:  # a + b * c
        a, b, c = rng.randint(1, 50), rng.randint(2, 9), rng.randint(2, 9)
        ans = a + b * c
        text = (
            f"{name} has {a} {item}s, then buys {b} packs with {c} {item}s in each pack. "
            f"How many {item}s does {name} have in total?"
        )
        sol = f"The packs hold {b} x {c} = {b * c} {item}s, so {name} has {a} + {b * c} = {ans}."
    elif kind == 5:  # a - b + c
        a = rng.randint(10, 99)
        b, c = rng.randint(1, a - 1), rng.randint(1, 50)
        ans = a - b + c
        text = f"{name} has {a} {item}s, loses {b}, and then finds {c}. How many {item}s does {name} have now?"
        sol = f"After losing {b}: {a} - {b} = {a - b}. After finding {c}: {a - b} + {c} = {ans}."
    else:  # (a + b) * c
        a, b, c = rng.randint(1, 20), rng.randint(1, 20), rng.randint(2, 6)
        ans = (a + b) * c
        text = (
            f"Each of {c} children has {a} red {item}s and {b} blue {item}s. "
            f"How many {item}s do the children have altogether?"
        )
        sol = f"Each child has {a} + {b} = {a + b}, so together {a + b} x {c} = {ans}."
    return text, f"{sol} The answer is \\boxed{{{ans}}}.", ans


def generate_arithmetic_problems(n: int, seed: int = 0) -> list[dict]:
    """``n`` arithmetic word problems in the DeepScaleR schema {problem, solution, answer}.

    Deterministic in ``seed``; answers are non-negative integers written as strings."""
    if n <= 0:
        raise ValueError(f"n must be positive, got {n}")
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        text, sol, ans = _story(rng)
        rows.append({"problem": text, "solution": sol, "answer": str(ans)})
    return rows


def load_math_train(
    source: str = "fallback",
    limit: int | None = None,
    seed: int = 0,
    n_fallback: int = 2000,
    revision: str = DEEPSCALER_REVISION,
) -> list[dict]:
    """Normalised math training records from ``"hub"`` (DeepScaleR), ``"fallback"`` (offline
    arithmetic set of ``n_fallback`` problems, or ``limit`` if given) or a file path."""
    from rspo.data.fetched import is_fetched

    if source == "hub":
        return load_deepscaler_hub(revision=revision, limit=limit)
    if is_fetched(source):
        return load_deepscaler_hub(revision=revision, limit=limit, fetched=source)
    if source == "fallback":
        n = limit if limit is not None else n_fallback
        return normalise_deepscaler(generate_arithmetic_problems(n, seed), source=FALLBACK_SOURCE)
    if source in ("", None):
        raise ValueError("math source must be 'hub', 'fallback' or a file path")
    return load_math_file(source, limit=limit)
