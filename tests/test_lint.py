"""Lint and format: `ruff check`, `ruff format --check` and `snakefmt --check` on the whole tree find
nothing (settings in pyproject.toml, [tool.ruff] and [tool.snakefmt]; `make lint` runs the same).

Each check is skipped, with the reason, when its tool is not installed (`pip install -e '.[dev]'`
installs the pinned versions)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def tool(name: str) -> str:
    """The tool beside this interpreter (the venv), else on PATH; skip the test when absent."""
    local = Path(sys.executable).parent / name
    found = str(local) if local.is_file() else shutil.which(name)
    if not found:
        pytest.skip(f"{name} is not installed (pip install -e '.[dev]' installs it)")
    return found


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=ROOT, text=True, capture_output=True, timeout=300)


def test_ruff_check_is_clean():
    r = run(tool("ruff"), "check", "--no-cache", "--output-format", "concise", ".")
    assert r.returncode == 0, f"ruff check found problems (fix them, or `ruff check --fix .`):\n{r.stdout}{r.stderr}"


def test_ruff_format_is_clean():
    r = run(tool("ruff"), "format", "--no-cache", "--check", ".")
    assert r.returncode == 0, f"files ruff format would change (run `ruff format .`):\n{r.stdout}{r.stderr}"


def test_snakefmt_is_clean():
    r = run(tool("snakefmt"), "--check", ".")
    assert r.returncode == 0, f"workflow files snakefmt would change (run `snakefmt .`):\n{r.stdout}{r.stderr}"
