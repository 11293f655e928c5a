"""rspo.archive_pieces.relabel: an archive given a later version of its preset (the regime search grew,
or the committed base moved) keeps its bundle byte for byte, takes the new preset's copy and digest and
records the relabelling; a preset that changes anything else a report reads, another preset's name, or
a damaged bundle is refused and nothing is written. (The merge of a study's pieces is tested in
tests/test_archive.py, beside the packing fixtures it shares.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from rspo.archive import ArchiveError, read_manifest, verify
from rspo.archive_pieces import relabel
from rspo.plan import preset_digest
from rspo.preset import Preset

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "docs" / "results" / "small"


@pytest.fixture
def archive(tmp_path):
    """A copy of the shipped small archive (manifest, bundle, preset copy)."""
    out = tmp_path / "archive"
    out.mkdir()
    for name in ("archive.json", "runs.tar.xz", "small.yaml"):
        shutil.copyfile(SHIPPED / name, out / name)
    return out


def _later(tmp_path: Path, name: str, **edit) -> Path:
    data = yaml.safe_load((SHIPPED / "small.yaml").read_text())
    data.update(edit)
    path = tmp_path / name / "small.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(data))
    return path


def test_relabel_gives_the_archive_the_later_preset_and_keeps_its_runs(archive, tmp_path):
    before = read_manifest(archive)
    bundle = (archive / "runs.tar.xz").read_bytes()
    later = _later(
        tmp_path,
        "later",
        regime_trials=["configs/sweeps/small.yaml"],
        base_model={"path": "elsewhere/base", "sha256": "0" * 64},  # where the base sits: no report reads it
    )
    m = relabel(archive, later)
    new = Preset.load(later).data
    assert m["preset_digest"] == preset_digest(new, "report") != before["preset_digest"]
    assert m == read_manifest(archive) and (archive / "runs.tar.xz").read_bytes() == bundle
    assert {k: m[k] for k in ("members", "bundle", "runs", "evals", "bases")} == {
        k: before[k] for k in ("members", "bundle", "runs", "evals", "bases")
    }
    entry = m["relabelled"][-1]
    assert entry["from"] == before["preset_digest"] and entry["to"] == m["preset_digest"]
    assert entry["changed"] == ["base_model", "regime_trials"] and entry["when"] and entry["git_commit"]
    assert (archive / "small.yaml").read_bytes() == later.read_bytes()
    verify(archive, new)  # the archive is of the later preset now
    with pytest.raises(ArchiveError, match="packed from another version"):
        verify(archive, Preset.load(SHIPPED / "small.yaml").data)
    assert relabel(archive, later) == m  # the same preset again: nothing to do
    assert len(read_manifest(archive)["relabelled"]) == len(before.get("relabelled", [])) + 1


@pytest.mark.parametrize(
    ("edit", "refused"),
    [
        ({"seeds": [0, 1, 2]}, "seeds"),  # another design: its runs are packed again
        ({"default_families": ["plugin"]}, "default_families"),  # a new family needs its runs: a piece, merged
        ({"preset": "other"}, "archive of preset 'small', not of 'other'"),
    ],
)
def test_relabel_refuses_what_the_runs_do_not_follow_and_writes_nothing(archive, tmp_path, edit, refused):
    files = {p.name: p.read_bytes() for p in archive.iterdir()}
    with pytest.raises(ArchiveError, match=refused):
        relabel(archive, _later(tmp_path, "p", **edit))
    assert {p.name: p.read_bytes() for p in archive.iterdir()} == files


def test_relabel_checks_every_member_first(archive, tmp_path):
    m = json.loads((archive / "archive.json").read_text())
    m["members"][0]["sha256"] = "0" * 64
    (archive / "archive.json").write_text(json.dumps(m))
    files = {p.name: p.read_bytes() for p in archive.iterdir()}
    with pytest.raises(ArchiveError, match="corrupt"):
        relabel(archive, _later(tmp_path, "later", regime_trials=["configs/sweeps/small.yaml"]))
    assert {p.name: p.read_bytes() for p in archive.iterdir()} == files


def test_the_command_line_relabels_and_names_a_refusal(archive, tmp_path, capsys):
    from rspo.commands.archive import main

    assert main(["relabel", str(archive), "--preset", str(_later(tmp_path, "s", seeds=[0]))]) == 2
    assert "differs from" in capsys.readouterr().err
    later = _later(tmp_path, "l", regime_trials=["configs/sweeps/small.yaml"])
    assert main(["relabel", str(archive), "--preset", str(later)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["preset_digest"] == preset_digest(Preset.load(later).data, "report")
