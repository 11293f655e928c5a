"""The command-line entry points of `python -m rspo`: one module per command, or per family of
commands (`data`: generate, prepare; `mlflow`: mlflow-init, mlflow-sync, mlflow-ui).

A module here holds `main(argv) -> int` (a family: one `<command>_main` each). It parses its
arguments, loads what they name (a preset, a checkpoint, a data file), calls the library and turns
the library's errors into a message and an exit code. The work itself is in the library beside
this package (`rspo.train`, `rspo.evaluate`, `rspo.pretrain`, ...), which defines no `main()`.
`rspo.cli` dispatches a command word to its module here, imported lazily so that
`python -m rspo --help` stays fast. This package also holds what several commands' parsers share
(`preset_path`, `add_workload_args`, `respell`).

No option of a command may be a prefix of one of torchrun's (``--run`` of ``--run-path``, ``--n``
of ``--nnodes``): torchrun's argparse reads every argument, also those after the script, and
stops with "ambiguous option" (tests/test_commands.py runs torchrun's parser on every option).
An option renamed for that keeps its earlier spelling through `respell`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def respell(command: str, argv: list[str], renamed: dict[str, str]) -> list[str]:
    """``argv`` with each earlier option spelling (``renamed``: old -> new) replaced by today's, in
    both forms (``--run X``, ``--run=X``), saying so on stderr: what a user typed keeps working."""
    out = []
    for arg in argv:
        key, eq, value = arg.partition("=")
        if key in renamed:
            print(
                f"rspo {command}: {key} is now {renamed[key]} (torchrun would read {key} as an abbreviation "
                f"of its own options); read as {renamed[key]}",
                file=sys.stderr,
            )
            arg = renamed[key] + eq + value
        out.append(arg)
    return out


def preset_path(preset_arg: str) -> Path:
    """``--preset``: a path, or a name in configs/ (``small`` -> configs/small.yaml)."""
    from rspo.tracking import REPO_ROOT

    path = Path(preset_arg)
    if not path.is_file() and "/" not in preset_arg and not preset_arg.endswith((".yaml", ".yml")):
        path = REPO_ROOT / "configs" / f"{preset_arg}.yaml"
    return path


def add_workload_args(ap: argparse.ArgumentParser, *, steps: int, steps_help: str) -> None:
    """The arguments `rspo bench` and `rspo speed` share: which model, data and preset, how many
    measured steps, threads, where the JSON goes, and --quiet."""
    ap.add_argument("--preset", default="configs/small.yaml")
    ap.add_argument("--model", default=None, help="checkpoint (default: results/<preset>/models/base)")
    ap.add_argument("--data", default=None, help="Countdown folder (default: results/<preset>/data/countdown)")
    ap.add_argument("--steps", type=int, default=steps, help=steps_help)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None, help="also write the JSON here")
    ap.add_argument("--quiet", action="store_true", help="no progress bar / progress lines")
