"""`python -m rspo bench`: throughput and memory of RSPO vs GMPO (paper Sec. 5.5), side by side, in one
process (`rspo.bench`, whose docstring is this command's --help)."""

from __future__ import annotations

import argparse

from rspo import bench
from rspo.commands import add_workload_args


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="rspo bench", description=bench.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_workload_args(ap, steps=8, steps_help="measured steps per configuration (after 1 warm-up)")
    ap.add_argument(
        "--data-parallel",
        type=int,
        default=0,
        metavar="N",
        help="also compare 1 process with N torchrun processes (0: skip)",
    )
    args = ap.parse_args(argv)
    bench.run_bench(
        args.preset,
        model=args.model,
        data=args.data,
        steps=args.steps,
        threads=args.threads,
        out=args.out,
        data_parallel=args.data_parallel,
        quiet=args.quiet,
    )
    return 0
