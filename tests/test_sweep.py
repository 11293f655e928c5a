"""rspo.sweep: a tiny sweep end to end through the real commands (data, pretraining, two RL runs),
the trial table, resumption (a finished trial is not rerun) and malformed sweep files."""

from pathlib import Path

import pytest
import yaml

from rspo.sweep import SweepError, gate_table, load_sweep, method_sets, run_sweep, table

ROOT = Path(__file__).resolve().parents[1]


def write_sweep(tmp_path: Path, **extra) -> Path:
    spec = {
        "preset": str(ROOT / "configs" / "smoke.yaml"),
        "work": str(tmp_path / "work"),
        "val_every": 1,
        "val_size": 4,
        "bases": {"tiny": {"examples": 256}},
        "trials": [
            {"name": "t1", "base": "tiny", "steps": 2, "set": ["optim.lr=1e-3"], "runs": {"gmpo": [0], "grpo": [0]}}
        ],
    }
    spec.update(extra)
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.slow
def test_a_tiny_sweep_writes_the_trial_table_and_resumes(tmp_path):
    path = write_sweep(tmp_path)
    rows = run_sweep(str(path), jobs=2, threads=1, table_path=str(tmp_path / "trials.md"))
    assert len(rows) == 1
    row = rows[0]
    assert row["name"] == "t1" and {r["algo"] for r in row["runs"]} == {"gmpo", "grpo"}
    for r in row["runs"]:
        assert [s for s, _ in r["val"]] == [0, 1, 2] and 0 <= r["final_acc"] <= 1
        assert 0 < r["min_gamma"] <= 1 and r["base_acc"] == row["base_acc"]
    assert row["gmpo"]["n"] == 1 and row["grpo"]["min_gamma"] == row["runs"][1]["min_gamma"]
    md = (tmp_path / "trials.md").read_text()
    assert table(rows) in md and md.endswith(gate_table(rows)) and "| t1 | tiny | optim.lr=1e-3 | 2 |" in md
    assert "| t1 | gmpo | ✗ +0.0 | ✗ – |" in md  # the gate's line: no learning, no collapse in 2 steps
    assert "| tiny | examples=256 |" in md  # the bases table: overrides, accuracy, time
    lines = (tmp_path / "work" / "trials.jsonl").read_text().splitlines()
    assert len(lines) == 1
    run_sweep(str(path), jobs=1, threads=1)  # nothing left to do: the trial is not rerun
    assert (tmp_path / "work" / "trials.jsonl").read_text().splitlines() == lines


@pytest.mark.parametrize(
    "edit, message",
    [
        ({"trials": [{"name": "x", "base": "nope", "steps": 1, "runs": {"gmpo": [0]}}]}, "trials\\[0\\].base"),
        ({"trials": [{"name": "x", "base": "tiny", "steps": 1, "runs": {}}]}, "trials\\[0\\].runs"),
        ({"trials": [{"name": "x", "base": "tiny", "steps": 1, "runs": {"gmpo": [0]}, "lr": 1}]}, "trials\\[0\\].lr"),
        ({"oops": 1}, "unknown key 'oops'"),
        ({"trials": [{"name": "x", "base": "tiny", "steps": 1, "runs": {"gmpo+frozen": [0]}}]}, "runs.gmpo\\+frozen"),
        ({"trials": [{"name": "x", "base": "tiny", "steps": 1, "runs": {"ppo": [0]}}]}, "unknown algorithm 'ppo'"),
    ],
)
def test_malformed_sweep_files_name_the_problem(tmp_path, edit, message):
    with pytest.raises(SweepError, match=message):
        load_sweep(write_sweep(tmp_path, **edit))


def test_a_method_names_its_algorithm_rs_and_routing_mode():
    assert method_sets("gmpo") == ["algorithm.algo=gmpo", "algorithm.router_shift=false", "algorithm.routing=none"]
    assert method_sets("grpo+rs")[1] == "algorithm.router_shift=true"
    assert method_sets("gmpo+freeze")[1:] == ["algorithm.router_shift=false", "algorithm.routing=freeze"]
    assert method_sets("gmpo+rs+index_replay")[1:] == ["algorithm.router_shift=true", "algorithm.routing=index_replay"]
    for bad in ("gmpo+freeze+logit_replay", "gmpo+rs+rs", "gmpo+tis"):
        with pytest.raises(ValueError, match="expected <algo>"):
            method_sets(bad)
