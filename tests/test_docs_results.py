"""Every folder under docs/results has a reader: a test (or a target those tests run) that opens it
through the code that made it, so a folder nobody reads any more fails here instead of growing the
repository. A new folder is added to READERS with its reader; a folder whose reader is gone is removed
(git history keeps it)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"

ROLES = ("bases", "trials")
"""Folders that group items by role: each folder under them is one item (a committed base, a search's
record). Every other folder under docs/results is an item itself (a shipped archive, a measurement)."""

READERS = {
    "small": "tests/test_archive.py::test_a_fresh_clone_rebuilds_every_committed_small_result_byte_for_byte",
    "small-3seed": "tests/test_claims.py::test_the_earlier_studys_runs_under_todays_rule",
    "small-pieces": "tests/test_archive.py::test_the_shipped_study_is_the_merge_of_its_committed_pieces",
    "small-mismatch": "tests/test_docs_results.py::test_the_mismatch_screen_tables_rebuild_from_its_runs",
    "vllm": "tests/test_docs_results.py::test_the_vllm_side_by_side_tables_rebuild_from_its_json",
    "bases/small": "tests/test_base_pin.py::test_the_small_preset_pins_the_committed_base",
    "bases/small-any": "tests/test_sweep_file.py::test_every_committed_base_of_a_sweep_file_is_there_with_its_digest",
    "trials/small-round3": "tests/test_docs_results.py::test_each_trial_record_rebuilds_its_tables",
    "trials/small-round4": "tests/test_docs_results.py::test_each_trial_record_rebuilds_its_tables",
    "trials/small-round5": "tests/test_docs_results.py::test_each_trial_record_rebuilds_its_tables",
}


def _tests_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}


def test_every_folder_under_docs_results_has_a_reader():
    folders = {
        str(p.relative_to(RESULTS))
        for top in RESULTS.iterdir()
        if top.is_dir()
        for p in (sorted(x for x in top.iterdir() if x.is_dir()) if top.name in ROLES else [top])
    }
    assert folders == set(READERS), (
        f"folders without a reader: {sorted(folders - set(READERS))}; readers of absent folders: "
        f"{sorted(set(READERS) - folders)}"
    )
    for folder, reader in READERS.items():
        path, name = reader.split("::")
        assert name in _tests_in(ROOT / path), f"{folder}: its reader {reader} does not exist"
        source = (ROOT / path).read_text()
        assert Path(folder).name in source, f"{folder}: {path} does not name it"


@pytest.mark.parametrize("record", ["small-round3", "small-round4", "small-round5"])
def test_each_trial_record_rebuilds_its_tables(record):
    """A trial record's committed trials.md holds the trial table `rspo sweep` writes from its
    trials.jsonl, and the gate tables the gate code reads from it (round 5's from its steps)."""
    from rspo.regime_gates import plugin_outcomes, read_trials, record_steps
    from rspo.report.trials import drift_gate_table, gate_table, table

    path = RESULTS / "trials" / record / "trials.jsonl"
    rows = read_trials(path)
    text = (path.parent / "trials.md").read_text()
    assert table(rows) in text
    if plugin_outcomes(rows):
        assert gate_table(rows) in text
    steps = record_steps(path)
    if steps is not None:
        assert drift_gate_table(rows, steps) in text


def test_the_mismatch_screen_tables_rebuild_from_its_runs():
    """docs/results/small-mismatch/README.md quotes the tables scripts/mismatch_screen_table.py prints
    from the screen's runs.json."""
    out = subprocess.run(
        [sys.executable, "scripts/mismatch_screen_table.py", "docs/results/small-mismatch/runs.json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    readme = (RESULTS / "small-mismatch" / "README.md").read_text()
    blocks = [b.strip() for b in out.split("\n\n") if b.strip()]
    assert blocks and all(b in readme for b in blocks)


def test_the_vllm_side_by_side_tables_rebuild_from_its_json():
    """docs/results/vllm/side_by_side.md's tables are what scripts/vllm_side_by_side.py prints from the
    comparison's side_by_side.json (the per-step metrics of both backends)."""
    out = subprocess.run(
        [sys.executable, "scripts/vllm_side_by_side.py", "--tables", "docs/results/vllm/side_by_side.json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.startswith("| step |")
    assert out in (RESULTS / "vllm" / "side_by_side.md").read_text()
