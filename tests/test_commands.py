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


# ---------------------------------------------------------------------------- under torchrun


class _Parser(Exception):
    def __init__(self, parser):
        self.parser = parser


def _parsers(main, argv: list[str], monkeypatch) -> list:
    """Every argparse parser that ``main(argv)`` builds and reads (its subcommands' too)."""
    import argparse

    def capture(self, *args, **kwargs):
        raise _Parser(self)

    with monkeypatch.context() as m:
        m.setattr(argparse.ArgumentParser, "parse_known_args", capture)
        with pytest.raises(_Parser) as e:
            main(argv)
    found, todo = [], [e.value.parser]
    while todo:
        parser = todo.pop()
        found.append(parser)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo.extend(action.choices.values())
    return found


def _command_lines(monkeypatch) -> dict[str, list[str]]:
    """{command line: its option strings} of every rspo command (each evaluate family) and of the
    memory simulation's worker: what a launch under torchrun may carry after ``-m rspo``."""
    from rspo.commands.evaluate import FAMILIES
    from rspo.gpu_memory import simulate

    mains = {
        name: (getattr(importlib.import_module(cli.COMMANDS[name].split(":")[0]), cli.COMMANDS[name].split(":")[1]), [])
        for name in cli.COMMANDS
        if name != "evaluate"
    }
    for family in FAMILIES:
        mains[f"evaluate {family}"] = (importlib.import_module("rspo.commands.evaluate").main, [family])
    mains["rspo.gpu_memory.simulate"] = (simulate.main, [])
    lines = {}
    for label, (main, argv) in mains.items():
        opts = {s for p in _parsers(main, argv, monkeypatch) for a in p._actions for s in a.option_strings}
        lines[label] = sorted(opts)
    return lines


def _torchrun_refuses(args: list[str]) -> str | None:
    """torchrun's own parser (the pinned torch's) on ``torchrun --standalone --nproc-per-node 2 -m rspo
    <args>``: None when it starts the script with ``args`` untouched, else its error."""
    import contextlib
    import io

    from torch.distributed.run import get_args_parser

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            ns = get_args_parser().parse_args(["--standalone", "--nproc-per-node", "2", "-m", "rspo", *args])
        except SystemExit:
            return err.getvalue().strip().splitlines()[-1]
    return None if ns.training_script_args == args else f"torchrun passed {ns.training_script_args}"


def test_torchrun_reads_no_option_of_an_rspo_command_as_its_own(monkeypatch):
    """Python's argparse looks at every argument for its own options' prefixes, also those after the
    script, so `torchrun ... -m rspo train --run X` once died with "ambiguous option: --run could
    match --run-path". No command's option may be read that way (each checked with the value 'x'
    and in its `--opt=x` form), and the check itself catches that spelling."""
    assert "ambiguous option: --run could match --run-path" in _torchrun_refuses(["train", "--run", "x"])
    refused = {}
    for line, opts in _command_lines(monkeypatch).items():
        words = line.split()
        for opt in opts:
            for args in ([*words, opt, "x"], [*words, f"{opt}=x"]):
                why = _torchrun_refuses(args)
                if why:
                    refused[" ".join(args)] = why
    assert not refused, refused


# ---------------------------------------------------------------------------- missing inputs


def _run_command(tmp_path, *args) -> subprocess.CompletedProcess:
    env = {k: v for k, v in __import__("os").environ.items() if k != "MLFLOW_TRACKING_URI"}
    return subprocess.run(
        [sys.executable, "-m", "rspo", *args], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300
    )


def _paper_math_with(tmp_path, model: str) -> Path:
    import yaml

    preset = yaml.safe_load((ROOT / "configs" / "paper_large_math.yaml").read_text())
    preset["rl"]["model"]["path"] = model
    preset["tasks"]["math"]["model"]["path"] = model
    path = tmp_path / "paper_large_math.yaml"
    path.write_text(yaml.safe_dump(preset))
    return path


SMALL = str(ROOT / "configs" / "small.yaml")
MISSING = {
    "train": (
        ["train", "--preset", SMALL, "--run-name", "gmpo-s0", "--base-model", "nope", "--out", "out", "--no-mlflow"],
        "rspo train: model checkpoint folder not found: nope; a study's base is pretrained by `make main`",
    ),
    "train data": (  # a hub id is not checked here (offline it may still be in the hub cache)
        ["train", "--preset", SMALL, "--base-model", "someone/model", "--train-data", "no.jsonl", "--out", "out"],
        "rspo train: data file not found: no.jsonl; `python -m rspo generate` (Countdown) or `python -m rspo prepare`",
    ),
    "evaluate": (
        ["evaluate", "countdown", "--preset", SMALL, "--model", "nope", "--data", "d", "--out", "out/c.json"],
        "rspo evaluate countdown: model checkpoint folder not found: nope;",
    ),
    "pretrain": (
        ["pretrain", "--preset", SMALL, "--data", "nodata", "--out", "out", "--no-mlflow"],
        "rspo pretrain: countdown folder not found: nodata; `python -m rspo generate --preset P --out DIR` writes it",
    ),
}


@pytest.mark.parametrize("case", sorted(MISSING))
def test_a_missing_input_is_one_line_exit_2_and_leaves_no_folder(case, tmp_path):
    args, message = MISSING[case]
    r = _run_command(tmp_path, *args)
    assert r.returncode == 2, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
    assert not any(tmp_path.iterdir()), list(tmp_path.iterdir())  # no empty output folder left behind


def test_preflight_refuses_a_hub_model_that_is_not_fetched_in_one_line(tmp_path):
    preset = _paper_math_with(tmp_path, "someone/unknown-moe")
    r = _run_command(tmp_path, "preflight", "--preset", str(preset), "--hub-dir", str(tmp_path / "hub"), "--out", "pf")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "no config.json for someone/unknown-moe: fetch the model first" in lines[0], lines
    assert not (tmp_path / "pf").exists()


def test_preflight_on_a_machine_without_the_gpu_the_preset_trains_on_says_so(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    r = _run_command(tmp_path, "preflight", "--preset", str(ROOT / "configs" / "paper_small.yaml"), "--out", "pf")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, lines
    assert lines[0].startswith("rspo preflight: the preset trains on GPUs (model.device: cuda) and ")
    assert "no GPU" in lines[0] or "torch sees no GPU" in lines[0]  # no driver here, or one beside a CPU torch
    assert "python -m rspo plan-memory --preset " in lines[0]  # what runs here instead
    assert not (tmp_path / "pf").exists()


def test_a_driver_older_than_cuda_13_is_told_apart_from_no_gpu(monkeypatch):
    """torch reports no GPU under a driver older than its CUDA needs: the check names the driver."""
    import torch

    from rspo.gpu_memory import driver

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(driver, "driver_version", lambda: "550.54.15")
    usable, line = driver.gpu_check()
    assert not usable and line.startswith(
        "the NVIDIA driver is older than CUDA 13 needs (found 550.54.15; needs >= 580)"
    )
    monkeypatch.setattr(driver, "driver_version", lambda: None)
    assert driver.gpu_check() == (
        False,
        "this machine has no GPU (no NVIDIA driver answers: nvidia-smi is missing or fails)",
    )
    monkeypatch.setattr(driver, "driver_version", lambda: "580.159.04")
    usable, line = driver.gpu_check()
    assert not usable and "present but torch sees no GPU" in line
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert driver.gpu_check() == (True, driver.floor_line() + "; found 580.159.04")
    assert "NVIDIA driver >= 580" in driver.floor_line()


def test_the_driver_version_is_read_from_nvidia_smi(monkeypatch, tmp_path):
    from rspo.gpu_memory import driver

    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 550.54.15\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    assert driver.driver_version() == "550.54.15"
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2; exit 9\n")
    assert driver.driver_version() is None
    monkeypatch.setenv("PATH", "/nonexistent")
    assert driver.driver_version() is None


def test_every_flag_of_every_command_says_what_it_is(monkeypatch):
    """--help documents every option of every command (each evaluate family and the simulation
    worker too); hidden internal options (help=SUPPRESS) aside."""
    import argparse

    from rspo.commands.evaluate import FAMILIES
    from rspo.gpu_memory import simulate

    mains = {name: (cli.COMMANDS[name].split(":"), []) for name in cli.COMMANDS if name != "evaluate"}
    bare = []
    for label, ((module, func), argv) in mains.items():
        parsers = _parsers(getattr(importlib.import_module(module), func), argv, monkeypatch)
        bare += [
            f"{label} {a.option_strings[0]}" for p in parsers for a in p._actions if a.option_strings and not a.help
        ]
    for family in FAMILIES:
        parsers = _parsers(importlib.import_module("rspo.commands.evaluate").main, [family], monkeypatch)
        bare += [
            f"evaluate {family} {a.option_strings[0]}"
            for p in parsers
            for a in p._actions
            if a.option_strings and not a.help
        ]
    parsers = _parsers(simulate.main, [], monkeypatch)
    bare += [f"simulate {a.option_strings[0]}" for p in parsers for a in p._actions if a.option_strings and not a.help]
    assert argparse.SUPPRESS != ""  # a hidden option's help is SUPPRESS, which is truthy: not listed
    assert not bare, bare
