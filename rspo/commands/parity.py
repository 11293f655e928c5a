"""`python -m rspo parity`: TRL's GRPOTrainer (or RSPO through TRL) on the same base, prompts and
verifier as a study's GRPO runs, evaluated as they are (`rspo.parity`, whose docstring is this
command's --help)."""

from __future__ import annotations

import argparse
import json
import sys

from rspo import parity
from rspo.commands import add_overrides


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="rspo parity", description=parity.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--preset", required=True, help="configs/<p>.yaml or a preset name")
    ap.add_argument("--base-model", required=True, help="the base checkpoint folder both trainers start from")
    ap.add_argument("--data", required=True, help="the generated Countdown folder")
    ap.add_argument("--out", required=True, help="folder for the run's metrics, model and parity.json")
    ap.add_argument("--seed", type=int, default=0, help="the run's seed (default 0)")
    ap.add_argument(
        "--trainer", choices=list(parity.TRAINERS), default="trl-grpo", help="TRL GRPO, or RSPO through TRL"
    )
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    add_overrides(ap, "rl override")
    args = ap.parse_args(argv)
    s = parity.run_parity(
        args.preset,
        args.base_model,
        args.data,
        args.out,
        seed=args.seed,
        threads=args.threads,
        overrides=args.overrides,
        trainer=args.trainer,
    )
    print(json.dumps({k: s[k] for k in ("base_accuracy", "final_accuracy", "wall_time_s")}), file=sys.stdout)
    return 0
