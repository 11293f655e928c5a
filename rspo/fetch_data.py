"""Fetching a task's hub data into a local folder (network): the program behind `rspo fetch-data`, the
workflow's local ``fetch_data`` rule. What the folder holds and how jobs read it: rspo.data.fetched."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rspo.data.fetched import FETCHED_BENCHMARKS, MARKER, FetchedDataError, is_fetched, read_marker


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
