"""Fetching a task's hub data into a local folder (network): the program behind `rspo fetch-data`, the
workflow's local ``fetch_data`` rule. What the folder holds and how jobs read it: rspo.data.fetched."""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rspo.data.fetched import FETCHED_BENCHMARKS, MARKER, FetchedDataError, is_fetched, read_marker
from rspo.jsonl import write_json_atomic, write_jsonl_atomic


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

    unknown = [b for b in benchmarks if b not in FETCHED_BENCHMARKS]
    if unknown:  # before anything is downloaded
        raise FetchedDataError(f"nothing to fetch for benchmark(s) {unknown}; fetched are {list(FETCHED_BENCHMARKS)}")
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    # what an earlier fetch into this folder holds is kept (another preset may read it)
    files: dict[str, dict[str, Any]] = read_marker(folder).get("files", {}) if is_fetched(folder) else {}
    (folder / MARKER).unlink(missing_ok=True)  # the marker says the folder is whole: written last

    def hub_table(key: str, repo: str, config: str | None, split: str, revision: str) -> None:
        """A hub table's rows at ``revision`` (rspo.data.code.hub_rows), as they are, into ``<key>.jsonl``."""
        name = f"{key}.jsonl"
        n = write_jsonl_atomic(folder / name, (dict(r) for r in C.hub_rows(repo, config, split, revision, None)), str)
        files[key] = {"from": f"{repo}:{config or ''}", "revision": revision, "paths": [name], "rows": n}

    if task == "math" and train:
        hub_table("train.deepscaler", M.DEEPSCALER_REPO, None, "train", M.DEEPSCALER_REVISION)
    if task == "code" and train:
        for src in C.CODE_MIX:
            repo, config, revision = C.hub_source(src)
            hub_table(f"train.{src}", repo, config, "train", revision)
    for name in benchmarks:
        if name == "mbpp":
            hub_table("mbpp", B.MBPP_REPO, "full", "test", B.MBPP_REVISION)
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
    write_json_atomic(marker, folder / MARKER)
    return marker
