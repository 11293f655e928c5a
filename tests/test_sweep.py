"""rspo.sweep and workflow/rules/trials.smk (and the tables of rspo.report.trials): a tiny search end to
end through Snakemake and the real commands (data, pretraining, two RL runs), the trial and gate
tables, resumption (nothing finished is redone) and malformed sweep files."""

import json
import tarfile
from pathlib import Path

import pytest
import yaml
from test_workflow import job_counts, make_workspace, snakemake

from rspo import sweep
from rspo.base_pin import weights_sha256
from rspo.config import ConfigError
from rspo.report.trials import gate_table, table
from rspo.sweep_file import load_sweep, method_sets

ROOT = Path(__file__).resolve().parents[1]


def write_sweep(tmp_path: Path, **extra) -> Path:
    spec = {
        "preset": str(ROOT / "configs" / "smoke.yaml"),
        "work": str(tmp_path / "work"),
        "val_every": 1,
        "val_size": 4,
        "bases": {"tiny": {"examples": 256}},
        "trials": [T1],
    }
    spec.update(extra)
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


T1 = {
    "name": "t1",
    "base": "tiny",
    "steps": 2,
    # the router-lr schedule of round 5's learn-then-drift trials: x1 for step 1, x30 from step 2
    "set": ["optim.lr=1e-3", "optim.router_lr_mult_final=30", "optim.router_lr_change=[1, 1]"],
    "runs": {"gmpo": [0], "grpo": [0]},
}


def _trials(ws: Path, sweep_file: str, *more: str):
    r = snakemake(
        ws, "--cores", "2", "--config", "preset=smoke", f"trials={sweep_file}", *more, "--", "trials", timeout=900
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    return r


@pytest.mark.slow
def test_a_tiny_search_runs_through_snakemake_to_its_gate_tables_and_resumes(tmp_path):
    """The trials of a sweep file planned and run by the workflow (target `trials`): the data, the
    tokenizer, one base pretrained, two runs (tracked in MLflow), the trial's line and the record
    (trials.jsonl, the trial and gate tables, the packed steps); run again, nothing is redone; a file
    with more trials (the pinned base installed, another base, a committed base) runs only what is new."""
    ws = make_workspace(tmp_path)
    spec = {"preset": "configs/smoke.yaml", "work": "results/sweeps/tiny", "val_every": 1, "val_size": 4}
    spec |= {"bases": {"tiny": {"examples": 256}}, "trials": [T1]}
    (ws / "configs" / "sweeps").mkdir(exist_ok=True)
    (ws / "configs" / "sweeps" / "tiny.yaml").write_text(yaml.safe_dump(spec))
    r = _trials(ws, "configs/sweeps/tiny.yaml")
    counts = job_counts(r.stdout + r.stderr)
    assert {k: counts.get(k) for k in ("trial_base", "trial_run", "trial_row", "trial_record")} == {
        "trial_base": 1,
        "trial_run": 2,
        "trial_row": 1,
        "trial_record": 1,
    }
    work = ws / "results" / "sweeps" / "tiny"
    rows = [json.loads(ln) for ln in (work / "trials.jsonl").read_text().splitlines()]
    assert len(rows) == 1
    row = rows[0]
    # provenance: the trial's and each run's UTC start and end, the commit and the machine it ran on
    assert row["started_utc"] <= row["ended_utc"] and row["ended_utc"].endswith("Z")
    assert row["commit"] == sweep.commit() and row["commit"] != "unknown" and row["machine"] == sweep.machine()
    assert all(r["started_utc"] <= r["ended_utc"] for r in row["runs"])
    # the runs, packed: each run folder's files and its stamp, the same bytes when packed again
    steps = work / "steps.tar.xz"
    with tarfile.open(steps) as tf:
        names = sorted(tf.getnames())
        metrics = {n: tf.extractfile(n).read().decode() for n in names if n.endswith("metrics.jsonl")}
        stamp = json.loads(tf.extractfile(next(n for n in names if n.endswith("gmpo-s0/sweep_run.json"))).read())
    files = sorted(["config.json", "final.json", "metrics.jsonl", "run.json", "sweep_run.json"])
    assert [n.split("/", 1)[1] for n in names] == [f"{run}/{f}" for run in ("gmpo-s0", "grpo-s0") for f in files]
    assert stamp["commit"] == sweep.commit() and stamp["started_utc"] <= stamp["ended_utc"]
    for text in metrics.values():
        train = [json.loads(ln) for ln in text.splitlines() if '"actor/lr"' in ln]
        assert [m["actor/router_lr_mult"] for m in train] == [1.0, 30.0]  # the schedule, step by step
    packed = steps.read_bytes()
    assert sweep.pack_steps(work, tmp_path / "again.tar.xz").read_bytes() == packed
    assert row["name"] == "t1" and {r["algo"] for r in row["runs"]} == {"gmpo", "grpo"}
    for r in row["runs"]:
        assert [s for s, _ in r["val"]] == [0, 1, 2] and 0 <= r["final_acc"] <= 1
        assert 0 < r["min_gamma"] <= 1 and r["base_acc"] == row["base_acc"]
    assert row["gmpo"]["n"] == 1 and row["grpo"]["min_gamma"] == row["runs"][1]["min_gamma"]
    md = (work / "trials.md").read_text()
    setting = "optim.lr=1e-3 optim.router_lr_mult_final=30 optim.router_lr_change=[1, 1]"
    assert table(rows) in md and "Plug-in gate P(X)" not in md and f"| t1 | tiny | {setting} | 2 |" in md
    assert "| t1 | L(gmpo) | – | – | – | – | – | – | not judged: S = 1 needs 20 <= S < the trial's 2 steps |" in md
    assert "| tiny | examples=256 |" in md  # the bases table: overrides, accuracy, time
    commit = row["commit"]
    assert f"| t1 | {row['started_utc']} | {row['ended_utc']} | {commit} | {row['machine']} |" in md
    # each run is tracked in the preset's MLflow store under its trial's key, finished
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{ws / 'results' / 'smoke' / 'mlflow' / 'mlflow.db'}")
    exp = client.get_experiment_by_name(
        yaml.safe_load((ws / "configs" / "smoke.yaml").read_text())["mlflow"]["experiment"]
    )
    tracked = {x.data.tags.get("rspo.key"): x.info.status for x in client.search_runs([exp.experiment_id])}
    folder = next(p.name for p in (work / "runs").iterdir())
    assert {k: v for k, v in tracked.items() if k.startswith("trial/")} == {
        f"trial/{folder}/gmpo-s0": "FINISHED",
        f"trial/{folder}/grpo-s0": "FINISHED",
    }
    r = _trials(ws, "configs/sweeps/tiny.yaml")  # nothing left to do: no run is redone
    assert "Nothing to be done" in r.stdout + r.stderr

    # a preset that pins that base: `pinned` installs it (digest checked by every run), and a trial on
    # another base trains with --other-base (without it `rspo train` would refuse the base)
    tiny = next(p for p in (work / "bases").glob("tiny-*") if p.is_dir())
    preset = yaml.safe_load((ws / "configs" / "smoke.yaml").read_text())
    preset["base_model"] = {"path": str(tiny), "sha256": weights_sha256(tiny)}
    (ws / "configs" / "smoke.yaml").write_text(yaml.safe_dump(preset))
    other = {"name": "t3", "base": "tiny", "steps": 1, "runs": {"gmpo": [0]}}
    kept = {"name": "t4", "base": "kept", "steps": 1, "runs": {"grpo": [0]}}  # a committed trial base
    spec["bases"] |= {"pinned": {"pinned": True}, "kept": {"committed": str(tiny), "sha256": weights_sha256(tiny)}}
    spec["trials"] = [T1, {"name": "t2", "base": "pinned", "steps": 1, "runs": {"gmpo": [0]}}, other, kept]
    (ws / "configs" / "sweeps" / "tiny.yaml").write_text(yaml.safe_dump(spec))
    r = _trials(ws, "configs/sweeps/tiny.yaml")
    counts = job_counts(r.stdout + r.stderr)
    assert counts.get("trial_run") == 3 and counts.get("trial_base") == 2  # t1's runs and base are kept
    rows = [json.loads(ln) for ln in (work / "trials.jsonl").read_text().splitlines()]
    assert [r["name"] for r in rows] == ["t1", "t2", "t3", "t4"] and rows[1]["base_acc"] == rows[0]["base_acc"]
    assert rows[3]["base_acc"] == rows[0]["base_acc"] and rows[3]["pretrain_wall_s"] == 0
    installed = next(p for p in (work / "bases").glob("pinned-*") if p.is_dir())
    assert weights_sha256(installed) == weights_sha256(tiny) and rows[1]["pretrain_wall_s"] == 0
    md = (work / "trials.md").read_text()
    assert "| pinned | the preset's pinned base (base_model) |" in md
    # round 4's gate judges the unscheduled trials, round 5's the scheduled one
    assert gate_table(rows) in md and "| t2 | gmpo | ✗ +0.0 | ✗ – |" in md and "| t1 | L(gmpo) |" in md


def test_a_dry_run_plans_every_trial_of_the_shipped_search_files(tmp_path):
    """`snakemake -n trials --config trials=<file>` plans each committed sweep file's runs as jobs:
    rounds 1-4's 143 runs on 4 bases (144 entries, one run named twice), round 5's 25 on one committed
    base; one piece (trial_only) only its trials' runs."""
    ws = make_workspace(tmp_path)
    for name, runs, bases in (("small.yaml", 143, 4), ("small-round5.yaml", 25, 1)):
        r = snakemake(ws, "-n", "--config", f"trials=configs/sweeps/{name}", "--", "trials")
        assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
        counts = job_counts(r.stdout)
        assert (counts["trial_run"], counts["trial_base"], counts["trial_record"]) == (runs, bases, 1)
    r = snakemake(
        ws, "-n", "--config", "trials=configs/sweeps/small-round5.yaml", "trial_only=r5b-ramp-x150", "--", "trials"
    )
    assert job_counts(r.stdout)["trial_run"] == 9
    r = snakemake(ws, "-n", "--config", "trials=configs/sweeps/small-round5.yaml", "trial_only=nope", "--", "trials")
    assert r.returncode != 0 and "no trial 'nope'" in r.stdout + r.stderr
    r = snakemake(ws, "-n", "--config", "preset=smoke", "trials=configs/sweeps/small-round5.yaml", "--", "trials")
    assert r.returncode != 0 and "its preset is configs/small.yaml" in r.stdout + r.stderr


@pytest.mark.parametrize(
    "edit, message",
    [
        ({"trials": [{"name": "x", "base": "nope", "steps": 1, "runs": {"gmpo": [0]}}]}, "trials\\[0\\].base"),
        ({"trials": [{"name": "x", "base": "tiny", "steps": 1, "runs": {}}]}, "trials\\[0\\].runs: must not be empty"),
        ({"trials": [{"name": "x", "base": "tiny", "steps": 1, "runs": {"gmpo": [0]}, "lr": 1}]}, "trials\\[0\\].lr"),
        (
            {"trials": [{"name": "x", "base": "tiny", "steps": 0, "runs": {"gmpo": [0]}}]},
            "trials\\[0\\].steps: must be >= 1",
        ),
        ({"trials": [{"name": "x", "base": "tiny", "runs": {"gmpo": [0]}}]}, "trials\\[0\\].steps: required"),
        (
            {"trials": [{"name": "x", "base": "tiny", "steps": 1, "runs": {"gmpo": [0]}, "set": ["lr"]}]},
            "is not KEY=VALUE",
        ),
        ({"oops": 1}, "oops: unknown key"),
        ({"val_size": 0}, "val_size: must be >= 1"),
        ({"trials": [{"name": "x", "base": "tiny", "steps": 1, "runs": {"gmpo+frozen": [0]}}]}, "runs.gmpo\\+frozen"),
        ({"trials": [{"name": "x", "base": "tiny", "steps": 1, "runs": {"ppo": [0]}}]}, "unknown algorithm 'ppo'"),
        ({"bases": {"tiny": {"pinned": True, "examples": 5}}}, "bases.tiny: a pinned base"),
        ({"bases": {"tiny": {"committed": "x"}}}, "bases.tiny: a committed base names its weights' sha256"),
        (
            {"trials": [T1, {**T1, "steps": 3}]},
            "trials\\[1\\]: 't1' is named before with another base, steps or set",
        ),
    ],
)
def test_malformed_sweep_files_name_the_problem(tmp_path, edit, message):
    with pytest.raises(ConfigError, match=message):
        load_sweep(write_sweep(tmp_path, **edit))
    again = {**T1, "runs": {"gmpo": [1, 2]}}  # a trial named again with the same setting adds seeds
    assert load_sweep(write_sweep(tmp_path, trials=[T1, again])).lines() == ["00-t1", "01-t1"]


def test_a_method_names_its_algorithm_rs_and_routing_mode():
    assert method_sets("gmpo") == ["algorithm.algo=gmpo", "algorithm.router_shift=false", "algorithm.routing=none"]
    assert method_sets("grpo+rs")[1] == "algorithm.router_shift=true"
    assert method_sets("gmpo+freeze")[1:] == ["algorithm.router_shift=false", "algorithm.routing=freeze"]
    assert method_sets("gmpo+rs+index_replay")[1:] == ["algorithm.router_shift=true", "algorithm.routing=index_replay"]
    for bad in ("gmpo+freeze+logit_replay", "gmpo+rs+rs", "gmpo+tis"):
        with pytest.raises(ValueError, match="expected <algo>"):
            method_sets(bad)


def test_a_command_line_spells_each_flag_once():
    import sys

    from rspo.subcommand import rspo_argv

    argv = rspo_argv("train", preset="p.yaml", base_model=Path("b"), no_mlflow=True, other_base=False, sets=["a=1"])
    assert argv == [sys.executable, "-m", "rspo", "train", "--preset", "p.yaml", "--base-model", "b", "--no-mlflow"] + [
        "--set",
        "a=1",
    ]
    launched = rspo_argv("train", launcher=["-m", "torch.distributed.run"], threads=None)
    assert launched == [sys.executable, "-m", "torch.distributed.run", "-m", "rspo", "train"]


def test_the_bases_table_reads_a_committed_base_this_machine_has_not_installed(tmp_path):
    import json

    from rspo.sweep import bases_table

    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "model.safetensors").write_bytes(b"w")
    summary = {"heldout": {"accuracy": 0.6, "n": 200}, "examples": 180, "wall_time_s": 60}
    (kept / "pretrain.json").write_text(json.dumps(summary))
    bases = {"kept": {"committed": str(kept), "sha256": "0" * 64}}
    trials = [{"name": "t", "base": "kept", "steps": 1, "runs": {"gmpo": [0]}}]
    spec = load_sweep(write_sweep(tmp_path, bases=bases, trials=trials))
    assert "| kept | committed:" in bases_table(spec, [{"base": "kept"}])
    assert "| kept |" not in bases_table(spec, [])  # no trial ran on it: not listed


def test_the_provenance_table_says_when_and_where_each_trial_ran_and_dashes_what_a_record_predates():
    from rspo.report.trials import EARLIER_MACHINE, provenance_table

    stamped = {"name": "a", "started_utc": "2026-12-06T10:00:00Z", "ended_utc": "2026-12-06T11:00:00Z"}
    stamped |= {"commit": "abc1234", "machine": "AMD EPYC, 2 cores"}
    text = provenance_table([stamped, {"name": "old"}])
    assert "| a | 2026-12-06T10:00:00Z | 2026-12-06T11:00:00Z | abc1234 | AMD EPYC, 2 cores |" in text
    assert f"| old | - | - | - | {EARLIER_MACHINE} |" in text
