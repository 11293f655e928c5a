"""The whole smoke DAG for real, several times in a row with maximal parallel starts (its own file,
so pytest-xdist runs it beside the rest of the workflow tests: it is the suite's longest part).
One repetition under `make test`; `make test-race` runs more (RSPO_SMOKE_REPEATS)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import yaml
from test_workflow import ROOT, job_counts, json_load, make_workspace, plan_outputs, snakemake

from rspo.plan import Plan

# ---------------------------------------------------------------------------- real commands (slow)


SMOKE_REPEATS = int(os.environ.get("RSPO_SMOKE_REPEATS", "1"))


@pytest.fixture(scope="module")
def smoke_dags(tmp_path_factory):
    """The whole smoke DAG, SMOKE_REPEATS times in a row in fresh workspaces, each with `--cores 4`
    and one thread per job (the smoke preset's): as many jobs start at once as can, the starts
    that once made two jobs race in MLflow's store. -> [(workspace, result), ...]"""
    out = []
    for i in range(SMOKE_REPEATS):
        ws = make_workspace(tmp_path_factory.mktemp(f"smoke{i}"))
        out.append((ws, snakemake(ws, "--cores", "4", "--config", "preset=smoke", timeout=1500)))
    return out


@pytest.mark.slow
def test_the_smoke_dag_with_maximal_parallel_starts_never_fails_on_tracking(smoke_dags):
    """Every repetition succeeds; no job's log carries a tracking warning (a write that did not
    land), and every repetition's store holds every run, finished."""
    import mlflow

    plan = Plan.from_file(ROOT / "configs" / "smoke.yaml")
    for ws, r in smoke_dags:
        assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
        res = ws / "results" / "smoke"
        warned = [p.name for p in (res / "logs").rglob("*.log") if "[mlflow]" in p.read_text(errors="replace")]
        assert not warned, warned
        client = mlflow.MlflowClient(f"sqlite:///{res / 'mlflow' / 'mlflow.db'}")
        exp = client.get_experiment_by_name(plan.preset["mlflow"]["experiment"])
        runs = client.search_runs([exp.experiment_id], max_results=1000)
        finished = {x.info.run_name for x in runs if x.info.status == "FINISHED"}
        assert set(plan.runs) | {"report", "pretrain-countdown"} <= finished
        assert len({x.info.run_name for x in runs}) == len(runs)  # no run twice


@pytest.mark.slow
def test_smoke_dag_end_to_end_with_the_library(smoke_dags):
    """The whole smoke DAG with the real `python -m rspo` commands (~4 min on 2 cores): data ->
    tokenizer -> pretrain (Countdown, math, code) -> every run of the grid -> evaluation -> every
    table and figure, non-empty; every run lands in the preset's MLflow store, none in the cwd,
    with its source and datasets, the report run holds every figure and table, and the job logs
    show per-step progress."""
    ws, r = smoke_dags[0]
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    res = ws / "results" / "smoke"
    plan = Plan.from_file(ws / "configs" / "smoke.yaml")
    for target in plan.targets():
        for f in plan_outputs(target):
            path = res / f
            assert path.is_file() and path.stat().st_size > 200, path
    for name in plan.runs:
        assert (res / "runs" / name / "final.json").is_file(), name
        assert (res / "runs" / name / "metrics.jsonl").stat().st_size > 0, name
    assert json_load(res / "eval" / "base" / "countdown.json")["splits"]["val"]["n"] == 16
    math = json_load(res / "eval" / "math-gmpo-rs0.8-s0" / "math.json")
    assert set(math["benchmarks"]) == {"aime24", "amc23", "amc22_23", "math500", "minerva", "olympiadbench"}
    # the Table 1 protocol of the preset: chat template, thinking on (math) / off (code), avg@2
    assert (math["config"]["template"], math["config"]["enable_thinking"]) == ("chat", True)
    assert math["benchmarks"]["aime24"]["n_samples"] == 2 and len(math["benchmarks"]["aime24"]["runs"]) == 2
    code = json_load(res / "eval" / "base" / "code.json")
    assert (code["config"]["template"], code["config"]["enable_thinking"]) == ("chat", False)
    table = (res / "tables" / "table_main.md").read_text()
    assert "- Protocol, math" in table and "- Protocol, code" in table and "Paper AMC23: every value" in table
    assert not (ws / "mlflow.db").exists() and not (ws / "mlruns").exists()  # no store in the cwd
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{res / 'mlflow' / 'mlflow.db'}")
    exp = client.get_experiment_by_name(plan.preset["mlflow"]["experiment"])
    found = {x.info.run_name: x for x in client.search_runs([exp.experiment_id], max_results=1000)}
    assert set(plan.runs) <= set(found)
    for name in plan.runs:
        assert found[name].info.status == "FINISHED"
        assert "router/shift_ratio_mean" in found[name].data.metrics
        # the runs table's Source and Dataset columns are filled
        assert found[name].data.tags["mlflow.source.name"] == "rspo train"
        contexts = {[t.value for t in d.tags][0] for d in client.get_run(found[name].info.run_id).inputs.dataset_inputs}
        assert "training" in contexts, name
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    # one report run holds every figure (PNG) and table (Markdown), tagged with its runs
    report = found["report"]
    arts = {a.path for d in ("figures", "tables") for a in client.list_artifacts(report.info.run_id, d)}
    for target in plan.targets():
        assert (f"figures/{target}.png" if target.startswith("fig") else f"tables/{target}.md") in arts, target
        if target != "table_efficiency":
            assert report.data.tags[f"runs/{target}"], target
    # every long job's log shows its progress, one parseable line per step of each RL run
    from rspo.progress import parse_line

    def progress(log: Path) -> list[dict]:
        return [r for r in map(parse_line, log.read_text().splitlines()) if r is not None]

    for name in plan.runs:
        rows = progress(res / "logs" / "train" / f"{name}.log")
        total = rows[-1]["total"]
        assert [r["step"] for r in rows if r["step"] > 0] == list(range(1, total + 1)), name
        assert all(isinstance(r["metrics"]["reward"], float) for r in rows if r["step"] > 0), name
    rows = progress(res / "logs" / "pretrain" / "base.log")
    assert rows[-1]["step"] == rows[-1]["total"] and isinstance(rows[-1]["metrics"]["acc"], float)
    assert progress(res / "logs" / "eval" / "base.countdown.log")[-1]["metrics"]["acc"] is not None
    assert {r["label"] for r in progress(res / "logs" / "data" / "countdown.log")} == {
        "generate train",
        "generate val",
        "generate val_target",
    }

    # reruns follow what changed: nothing, then an eval edit (no retraining, no pretraining),
    # then an RL edit (every run retrains; data and pretraining stay)
    r = snakemake(ws, "-n", "--config", "preset=smoke")
    assert r.returncode == 0 and "Nothing to be done" in r.stdout + r.stderr, (r.stdout + r.stderr)[-2000:]
    preset_path = ws / "configs" / "smoke.yaml"
    original = preset_path.read_text()
    data = yaml.safe_load(original)
    data["eval"]["countdown"]["size"] = 12
    preset_path.write_text(yaml.safe_dump(data))
    counts = job_counts(snakemake(ws, "-n", "--config", "preset=smoke").stdout)
    assert counts.get("evaluate_countdown", 0) > 0
    for rule in ("countdown_data", "tokenizer", "pretrain", "pretrain_task", "prepare_task", "train"):
        assert rule not in counts, (rule, counts)
    data = yaml.safe_load(original)
    data["rl"]["optim"]["lr"] = 2.0e-3
    preset_path.write_text(yaml.safe_dump(data))
    counts = job_counts(snakemake(ws, "-n", "--config", "preset=smoke").stdout)
    assert counts["train"] == len(plan.runs)
    for rule in ("countdown_data", "tokenizer", "pretrain", "pretrain_task", "prepare_task"):
        assert rule not in counts, (rule, counts)
    preset_path.write_text(original)


@pytest.mark.slow
def test_make_piece_packs_the_seeds_of_a_study_that_ran(smoke_dags):
    """The README's command for one piece of a study, `make piece SEEDS=0`, for real in the DAG's
    workspace (this venv as the Makefile's, nothing installed): Snakemake finds the piece's runs done,
    the piece is packed with its seeds and its tables, and it verifies against the preset."""
    import subprocess
    import sys

    ws, r = smoke_dags[0]
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    for name in ("Makefile", "pyproject.toml", "scripts"):
        if not (ws / name).exists():
            (ws / name).symlink_to(ROOT / name)
    venv = Path(sys.executable).parent.parent
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("MLFLOW_TRACKING_URI", None)
    stamp = venv / ".installed"  # the venv and the sandbox are this machine's: not remade
    cmd = ["make", "-o", str(stamp), "-o", "sandbox", "piece", "PRESET=smoke", "SEEDS=0", "CORES=2", f"VENV={venv}"]
    out = subprocess.run(cmd, cwd=ws, env=env, text=True, capture_output=True, timeout=600)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    piece = ws / "docs" / "results" / "smoke-pieces" / "seeds-0"
    manifest = json_load(piece / "archive.json")
    assert manifest["seeds"] == [0] and (piece / "runs.tar.xz").is_file()
    tables = sorted(p.name for p in (piece / "tables").iterdir())
    assert tables == sorted(p.name for p in (ws / "results" / "smoke" / "tables").iterdir()) and tables
    check = [sys.executable, "-m", "rspo", "archive", "verify", "--preset", "smoke", str(piece)]  # as merge does
    out = subprocess.run(check, cwd=ws, env=env, text=True, capture_output=True, timeout=300)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]


@pytest.mark.slow
def test_the_train_rule_launches_two_gloo_processes_that_equal_one(smoke_dags, tmp_path):
    """The workflow's own train rule with resources.train.processes 2 (what every paper preset does
    with 8): Snakemake runs the launch line users run, under torchrun on gloo, the run finishes and
    equals the same run trained by the DAG in one process. Runs last in this file: it retrains one
    run of the DAG's workspace (the other tests read it first)."""
    from dist_runs import assert_same_run, metrics

    ws, r = smoke_dags[0]
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    res, run = ws / "results" / "smoke", "gmpo-rs0.8-s0"
    one = tmp_path / "one-process"
    shutil.move(res / "runs" / run, one)
    preset_path = ws / "configs" / "smoke.yaml"
    original = preset_path.read_text()
    data = yaml.safe_load(original)
    data["resources"] = {"train": {"processes": 2}}
    preset_path.write_text(yaml.safe_dump(data))
    try:
        r = snakemake(ws, "--cores", "2", f"results/smoke/runs/{run}/final.json", "--config", "preset=smoke")
    finally:
        preset_path.write_text(original)
    log = (res / "logs" / "train" / f"{run}.log").read_text(errors="replace")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:] + log[-3000:]
    assert "python -m rspo launch --processes 2 train --preset" in r.stdout + r.stderr
    assert json_load(res / "runs" / run / "run.json")["world_size"] == 2
    total = yaml.safe_load(original)["rl"]["schedule"]["total_steps"]
    assert_same_run(one, res / "runs" / run, steps=tuple(range(total + 1)), ignore=("router/cache_bytes",))
    for a, b in zip(metrics(one), metrics(res / "runs" / run)):
        assert b.get("router/cache_bytes") == (a["router/cache_bytes"] / 2 if "router/cache_bytes" in a else None)
