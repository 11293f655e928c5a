"""`python -m rspo fetch-data TASK --out DIR [--train] [--benchmarks B ...]`: a task's hub data fetched
once into a local folder (the workflow's `fetch_data` rule, a local rule: compute nodes may have no
internet): rspo.fetch_data. What the folder holds and how jobs read it: rspo.data.fetched."""

from __future__ import annotations

import argparse
import json
import sys

from rspo.data.fetched import FETCHED_BENCHMARKS, FetchedDataError
from rspo.fetch_data import fetch_task_data


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="rspo fetch-data", description="Fetch a task's hub data once into a local folder (network)."
    )
    ap.add_argument("task", choices=("math", "code"))
    ap.add_argument("--out", required=True, help="the folder to fill (its rspo_data.json is written last)")
    ap.add_argument("--train", action="store_true", help="the task's RL training source (DeepScaleR / the code mix)")
    ap.add_argument(
        "--benchmarks", nargs="*", default=[], help=f"code benchmarks to fetch, of {list(FETCHED_BENCHMARKS)}"
    )
    args = ap.parse_args(argv)
    try:
        marker = fetch_task_data(args.task, args.out, train=args.train, benchmarks=args.benchmarks)
    except FetchedDataError as e:
        print(f"rspo fetch-data: {e}", file=sys.stderr)
        return 2
    except (OSError, ConnectionError) as e:
        print(f"rspo fetch-data: {args.task}: the hub could not be reached or read ({e})", file=sys.stderr)
        return 1
    print(json.dumps({"task": args.task, "rows": {k: v["rows"] for k, v in marker["files"].items()}}))
    return 0
