"""`python -m rspo sweep SWEEP.yaml`: run the trials that choose a study's regime and write the trial
table (`rspo.sweep`, whose docstring is this command's --help)."""

from __future__ import annotations

import argparse
import sys

from rspo import sweep


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="rspo sweep", description=sweep.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("sweep", help="sweep file (YAML), e.g. configs/sweeps/small.yaml")
    ap.add_argument("--jobs", type=int, default=1, help="runs at once (each with --threads threads)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads per run")
    ap.add_argument("--table", default=None, help="write the Markdown trial table here")
    ap.add_argument("--steps", default=None, help="pack every run's per-step metrics into this tar.xz")
    ap.add_argument("--only", action="append", default=None, help="run only these trials (repeatable)")
    ap.add_argument(
        "--pretrain-threads",
        type=int,
        default=0,
        help="torch threads of a base's pretraining (default: jobs x threads, the whole budget)",
    )
    args = ap.parse_args(argv)
    try:
        sweep.run_sweep(
            args.sweep,
            jobs=args.jobs,
            threads=args.threads,
            table_path=args.table,
            only=args.only,
            pretrain_threads=args.pretrain_threads,
            steps_path=args.steps,
        )
    except sweep.SweepError as e:
        print(f"rspo sweep: {e}", file=sys.stderr)
        return 2
    return 0
