"""`python -m rspo launch --processes N <command> ...`: an rspo command in N data-parallel processes
on this node, under torchrun (what the train rule runs when resources.train.processes > 1).

    python -m rspo launch --processes 8 train --preset configs/paper_large_math.yaml --run-name ... --out ...

Two things plain ``torchrun ... -m rspo <command>`` does not do:

- The command's arguments never reach torchrun's parser. torchrun's argparse reads every argument
  for its own options' prefixes, also those after the script (it would read ``--run`` as its
  ``--run-path``); here only ``--standalone --nproc-per-node N -m rspo`` is parsed by it and the
  command's arguments are handed to the ranks as they are.
- A time-limit stop reaches the scheduler as itself. torchrun exits 1 whenever a rank exits with a
  non-zero code, so a job that stopped before its limit (every rank saved and exited 75,
  rspo.train.time_limit) looked like a crash; this launcher exits 75 when the first rank to fail
  (torchrun's root cause) exited 75, and 1 for any other failure. A rank stopped by a signal after
  that first exit counts as part of it.
"""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="rspo launch",
        usage="python -m rspo launch --processes N <command> [args...]",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--processes", type=int, required=True, help="data-parallel processes (torchrun's --nproc-per-node)"
    )
    return ap


def exit_code(failures: dict) -> int:
    """The launcher's exit status for torchrun's failures ({rank: ProcessFailure}): 75 when the first
    failure (by time) exited 75, the time-limit stop; else 1."""
    from rspo.train.time_limit import EXIT_TIME_LIMIT

    first = min(failures.values(), key=lambda f: f.timestamp)
    return EXIT_TIME_LIMIT if first.exitcode == EXIT_TIME_LIMIT else 1


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    at = 0  # our options (and their values) come first; the command is the first word after them
    while at < len(argv) and argv[at].startswith("-"):
        action = parser._option_string_actions.get(argv[at])
        at += 2 if action is not None and action.nargs is None else 1  # an option with a value: both words
    args = parser.parse_args(argv[:at])  # our options only: the command's are not read here
    command = argv[at:]
    if not command:
        print("rspo launch: name the rspo command to run after the options (e.g. train ...)", file=sys.stderr)
        return 2
    if args.processes < 1:
        print(f"rspo launch: --processes must be >= 1, got {args.processes}", file=sys.stderr)
        return 2
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, record
    from torch.distributed.run import get_args_parser, run

    config = get_args_parser().parse_args(["--standalone", "--nproc-per-node", str(args.processes), "-m", "rspo"])
    config.training_script_args = command
    try:
        record(run)(config)  # torchrun's own entry point, with its error summary
    except ChildFailedError as e:
        code = exit_code(e.failures)
        print(f"rspo launch: {command[0]} ended with exit {code} (first failing rank's code)", file=sys.stderr)
        return code
    return 0
