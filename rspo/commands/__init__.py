"""The command-line entry points of `python -m rspo`: one module per command, or per family of
commands (`data`: generate, prepare; `mlflow`: mlflow-init, mlflow-sync, mlflow-ui).

A module here holds `main(argv) -> int` (a family: one `<command>_main` each). It parses its
arguments, loads what they name (a preset, a checkpoint, a data file), calls the library and turns
the library's errors into a message and an exit code. The work itself is in the library beside
this package (`rspo.train`, `rspo.evaluate`, `rspo.pretrain`, ...), which defines no `main()`.
`rspo.cli` dispatches a command word to its module here, imported lazily so that
`python -m rspo --help` stays fast. This package also holds what several commands' parsers share
(`preset_path`, `add_workload_args`, `respell`, `missing_input`).

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


def add_overrides(ap: argparse.ArgumentParser, help: str) -> None:
    """``--set KEY=VALUE`` (repeatable) into ``args.overrides``: the one spelling of a command's overrides."""
    ap.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE", help=help)


def add_workload_args(ap: argparse.ArgumentParser, *, steps: int, steps_help: str) -> None:
    """The arguments `rspo bench` and `rspo speed` share: which model, data and preset, how many
    measured steps, threads, where the JSON goes, and --quiet."""
    ap.add_argument("--preset", default="configs/small.yaml", help="{P} (default small)")
    ap.add_argument("--model", default=None, help="checkpoint (default: results/<preset>/models/base)")
    ap.add_argument("--data", default=None, help="Countdown folder (default: results/<preset>/data/countdown)")
    ap.add_argument("--steps", type=int, default=steps, help=steps_help)
    ap.add_argument("--threads", type=int, default=2, help="torch threads of the workload (default 2)")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    ap.add_argument("--quiet", action="store_true", help="no progress bar / progress lines")


# what makes each kind of input a command reads, for the one-line error when it is missing
MADE_BY = {
    "model": (
        "a study's base is pretrained by `make main` (the pretrain rule writes results/<preset>/models/base), "
        "a run's checkpoint by `rspo train`, a hub model is fetched by `python -m rspo fetch-model`"
    ),
    "countdown": (
        "`python -m rspo generate --preset P --out DIR` writes it (the countdown_data rule; `make main` runs it)"
    ),
    "data": (
        "`python -m rspo generate` (Countdown) or `python -m rspo prepare` (math, code) writes it; "
        "`make main` runs them"
    ),
    "tokenizer": "`python -m rspo tokenizer --out DIR` writes it (the tokenizer rule; `make main` runs it)",
}


def missing_input(path: str | Path, kind: str, files: tuple[str, ...] = ()) -> str:
    """Why an input a command reads is not there, in one line with what makes it ("" when it is).
    ``kind``: ``model`` (a checkpoint folder, or a hub id, which is not checked here), ``countdown``
    (a generated folder holding ``files``), ``tokenizer`` (a folder), ``data`` (a file)."""
    from rspo.hub import is_hub_id

    p = Path(path)
    if kind == "model":
        if is_hub_id(path):
            return ""
        from rspo.models import check_checkpoint

        try:
            check_checkpoint(p)
            return ""
        except FileNotFoundError as e:
            return f"{e}; {MADE_BY[kind]}"
    if kind == "data":
        return "" if p.is_file() else f"data file not found: {p}; {MADE_BY[kind]}"
    if not p.is_dir():
        return f"{kind} folder not found: {p}; {MADE_BY[kind]}"
    absent = [f for f in files if not (p / f).is_file()]
    return f"{kind} folder {p} has no {', '.join(absent)}; {MADE_BY[kind]}" if absent else ""


def refuse_missing(command: str, inputs: list[tuple[str | Path, str] | tuple[str | Path, str, tuple[str, ...]]]) -> int:
    """Check ``inputs`` (``missing_input``'s arguments) before a command writes anything: print the
    first problem as one line and return 2, or return 0 when every input is there."""
    for item in inputs:
        why = missing_input(*item)
        if why:
            print(f"rspo {command}: {why}", file=sys.stderr)
            return 2
    return 0
