"""`python -m rspo speed`: our RL step beside TRL's GRPOTrainer, a plain training loop and plain
``generate``, in one process (`rspo.speed`, whose docstring is this command's --help)."""

from __future__ import annotations

import argparse

from rspo import speed
from rspo.commands import add_workload_args


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="rspo speed", description=speed.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_workload_args(ap, steps=5, steps_help="measured RL steps per contender (after 1 warm-up)")
    ap.add_argument(
        "--deep-layers", type=int, default=12, help="second table: random-init model of this depth (0: skip)"
    )
    ap.add_argument(
        "--contenders",
        default=",".join(speed.CONTENDERS),
        help=f"comma-separated subset of {','.join(speed.CONTENDERS)} (rspo always; default all)",
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="after the rounds, one more step of ours under torch.profiler: where its time goes (speed.profile_step)",
    )
    args = ap.parse_args(argv)
    speed.run_speed(
        args.preset,
        model=args.model,
        data=args.data,
        steps=args.steps,
        threads=args.threads,
        deep_layers=args.deep_layers,
        out=args.out,
        contenders=tuple(c.strip() for c in args.contenders.split(",")),
        quiet=args.quiet,
        profile=args.profile,
    )
    return 0
