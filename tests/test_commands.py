"""rspo.commands and the dispatcher rspo.cli: every command word reaches its module's `main`, whose
parser answers --help; `python -m rspo --help` lists exactly the dispatcher's commands; an unknown
command is refused by name; `--preset NAME` means configs/NAME.yaml."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from rspo import cli
from rspo.commands import preset_path

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
def test_every_command_resolves_to_a_main_whose_parser_answers_help(name, capsys):
    module, func = cli.COMMANDS[name].split(":")
    assert module.startswith("rspo.commands.")
    assert callable(getattr(importlib.import_module(module), func))
    argv = [name, "countdown", "--help"] if name == "evaluate" else [name, "--help"]
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_help_lists_exactly_the_dispatchers_commands():
    out = subprocess.run(
        [sys.executable, "-m", "rspo", "--help"], capture_output=True, text=True, cwd=ROOT, check=True
    ).stdout
    listed = [line.split()[0] for line in out.split("commands:")[1].split("\n\n")[0].strip().splitlines()]
    assert listed == list(cli.COMMANDS)


def test_an_unknown_command_is_refused_by_name(capsys):
    assert cli.main(["trian"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'trian'" in err and "train" in err


def test_preset_path_takes_a_name_or_a_path(tmp_path):
    assert preset_path("small") == ROOT / "configs" / "small.yaml"
    own = tmp_path / "mine.yaml"
    own.write_text("preset: mine\n")
    assert preset_path(str(own)) == own
    assert preset_path("configs/missing.yaml") == Path("configs/missing.yaml")  # a path stays a path
