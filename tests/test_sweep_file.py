"""rspo.sweep_file: the committed sweep files' bases and records are in the repository as the files
say (a committed base with its weights' sha256; a record whose every line is a trial of its file)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rspo import base_pin
from rspo.jsonl import iter_jsonl
from rspo.sweep_file import load_sweep

ROOT = Path(__file__).resolve().parents[1]
SWEEPS = sorted((ROOT / "configs" / "sweeps").glob("*.yaml"))


@pytest.mark.parametrize("sweep", SWEEPS, ids=lambda p: p.name)
def test_every_committed_base_of_a_sweep_file_is_there_with_its_digest(sweep):
    """docs/results/bases/small-any: the `solution: any` base the sweep files install by digest."""
    spec = load_sweep(sweep)
    committed = [(name, over) for name, over in spec.bases.items() if over and over.get("committed")]
    for name, over in committed:
        folder = ROOT / over["committed"]
        assert folder.is_relative_to(ROOT / "docs" / "results" / "bases"), f"bases.{name}: {folder}"
        assert base_pin.weights_sha256(folder) == over["sha256"], f"bases.{name}"


@pytest.mark.parametrize("sweep", SWEEPS, ids=lambda p: p.name)
def test_a_sweep_files_committed_record_holds_its_trials(sweep):
    spec = load_sweep(sweep)
    assert spec.record, f"{sweep.name}: no record: (where its committed record is)"
    record = spec.record_file(ROOT)
    assert record.parent.parent == ROOT / "docs" / "results" / "trials"
    spec.check_record([row for _, row in iter_jsonl(record)], record)
