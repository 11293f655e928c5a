"""rspo.mlflow_sync, through its command `mlflow-sync` (rspo.commands.mlflow): a sync records in the
store what the result files hold and the store lacks (and a second sync writes nothing), fills a run
a job left incomplete without duplicating it, refuses a missing results folder; and a train job
whose tracking server dies mid-run finishes with a complete run folder, after which `mlflow-sync`
records everything it missed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow_server import MlflowServer
from tiny_moe import make_train_assets, train_args

from rspo.commands.mlflow import sync_main
from rspo.tracking import Tracker

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "configs" / "smoke.yaml"
RUN = "gmpo-rs0.8-s0"


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_train_assets(tmp_path_factory.mktemp("sync_assets"))


def train_cmd(assets: Path, out: Path, steps: int) -> list[str]:
    sets = (f"schedule.total_steps={steps}", "schedule.val_every=5", "rollout.max_new_tokens=6")
    args = train_args(assets, out, SMOKE, *sets, run=RUN, threads=1)
    return [sys.executable, "-m", "rspo", "train", *args, "--quiet"]


def env_with(uri: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ, MLFLOW_TRACKING_URI=uri, OMP_NUM_THREADS="1", **extra)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    return env


def results_folder(assets: Path, root: Path) -> Path:
    """results/smoke as the workflow lays it out: data, the base model and its pretraining
    metrics, one evaluation, one table and one figure (the run folder is added by the test)."""
    res = root / "results" / "smoke"
    (res / "data").mkdir(parents=True)
    shutil.copytree(assets / "data", res / "data" / "countdown")
    shutil.copytree(assets / "base", res / "models" / "base")
    (res / "models" / "base" / "pretrain.json").write_text(
        json.dumps({"task": "countdown", "steps": 20, "wall_time_s": 3.5, "heldout": {"accuracy": 0.25, "n": 8}})
    )
    (res / "models" / "base.work").mkdir()
    (res / "models" / "base.work" / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "pretrain/loss": 3.0 / s}) + "\n" for s in (1, 10, 20))
    )
    (res / "eval" / "base").mkdir(parents=True)
    (res / "eval" / "base" / "countdown.json").write_text(
        json.dumps({"model": str(res / "models" / "base"), "splits": {"val": {"accuracy": 0.25, "n": 8}}})
    )
    for folder, names in (("tables", ["table_countdown.md", "table_countdown.tex"]), ("figures", [])):
        (res / folder).mkdir()
        for name in names:
            (res / folder / name).write_text(f"{name}\n")
    (res / "figures" / "fig1_reward.pdf").write_bytes(b"%PDF fake")
    (res / "figures" / "fig1_reward.png").write_bytes(b"\x89PNG fake")
    return res


def sync(res: Path, uri: str, capsys) -> dict:
    assert sync_main(["--preset", str(SMOKE), "--results", str(res), "--uri", uri]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def client(uri):
    from mlflow.tracking import MlflowClient

    return MlflowClient(uri)


def runs_by_name(uri: str) -> dict:
    c = client(uri)
    exp = c.get_experiment_by_name("rspo-smoke")
    return {r.info.run_name: r for r in c.search_runs([exp.experiment_id], max_results=1000)}


def metric_steps(uri: str, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in client(uri).get_metric_history(run_id, key))


def test_sync_builds_a_store_from_the_files_and_a_second_sync_writes_nothing(assets, tmp_path, capsys):
    res = results_folder(assets, tmp_path)
    out = res / "runs" / RUN
    r = subprocess.run(train_cmd(assets, out, 3) + ["--no-mlflow"], env=env_with(""), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    first = sync(res, uri, capsys)
    assert first["runs created"] == 4  # pretraining, the RL run, the evaluation, the report run
    assert first["metric points"] > 0 and first["params"] > 0 and first["artifacts"] == 6
    assert sync(res, uri, capsys) == {"tracking_uri": uri, "experiment": "rspo-smoke"}  # nothing left to write

    runs = runs_by_name(uri)
    assert set(runs) == {RUN, "pretrain-countdown", "eval-countdown-base", "report"}
    run = runs[RUN]
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    for key in ("critic/score/mean", "groups/zero_std_frac", "router/shift_ratio_mean"):
        assert metric_steps(uri, run.info.run_id, key) == [x["step"] for x in rows if key in x]
    assert run.info.status == "FINISHED"
    assert run.data.params["algorithm/gamma_min"] == "0.8" and run.data.tags["algo"] == "gmpo"
    assert run.data.tags["rspo.key"] == f"train/{RUN}"
    assert run.data.tags["rspo.fingerprint"] == json.loads((out / "run.json").read_text())["fingerprint"]
    c = client(uri)
    assert {a.path for a in c.list_artifacts(run.info.run_id)} == {"config.json", "final.json"}
    contexts = {(d.dataset.name, d.tags[0].value) for d in c.get_run(run.info.run_id).inputs.dataset_inputs}
    assert contexts == {("data/train", "training"), ("data/val", "validation")}
    assert metric_steps(uri, runs["pretrain-countdown"].info.run_id, "pretrain/loss") == [1, 10, 20]
    assert runs["eval-countdown-base"].data.metrics == {"eval/countdown/val/accuracy": 0.25}
    report = runs["report"]
    arts = {a.path for d in ("figures", "tables") for a in c.list_artifacts(report.info.run_id, d)}
    assert arts == {
        "figures/fig1_reward.pdf",
        "figures/fig1_reward.png",
        "tables/table_countdown.md",
        "tables/table_countdown.tex",
    }
    assert report.data.tags["runs/fig1_reward"].startswith("grpo-s0")
    assert "**fig1_reward**" in report.data.tags["mlflow.note.content"]


def test_a_pretraining_without_its_metrics_file_starts_its_wall_time_before_it_ended(assets, tmp_path, capsys):
    """A run archive ships the base model without models/base.work: the pretraining's run starts at its
    end less the wall time pretrain.json records, never after it ended (it once showed -640,690 s)."""
    res = results_folder(assets, tmp_path)
    shutil.rmtree(res / "models" / "base.work")
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    sync(res, uri, capsys)
    info = runs_by_name(uri)["pretrain-countdown"].info
    ended = int((res / "models" / "base" / "pretrain.json").stat().st_mtime * 1000)
    assert (info.start_time, info.end_time) == (ended - 3500, ended)  # wall_time_s 3.5


def test_sync_fills_the_run_a_job_left_incomplete_without_making_another(assets, tmp_path, capsys):
    """The job's MLflow run got steps 1-2 only (the store failed after them); a run of an older
    config with the same name exists too. Sync finds the job's run by its key and fingerprint and
    adds exactly what is missing; the other run is left alone."""
    res = results_folder(assets, tmp_path)
    out = res / "runs" / RUN
    r = subprocess.run(train_cmd(assets, out, 4) + ["--no-mlflow"], env=env_with(""), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    fp = json.loads((out / "run.json").read_text())["fingerprint"]
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    partial = Tracker(uri, "rspo-smoke", RUN, key=f"train/{RUN}", tags={"rspo.fingerprint": fp})
    for row in rows[:3]:  # validation at step 0, steps 1 and 2
        partial.log_metrics({k: v for k, v in row.items() if k != "step"}, row["step"])
    older = Tracker(uri, "rspo-smoke", RUN, key=f"train/{RUN}", tags={"rspo.fingerprint": "an-older-config"})
    older.end()
    counts = sync(res, uri, capsys)
    assert counts["runs created"] == 3  # pretraining, evaluation, report: never the RL run again
    missing = sum(1 for row in rows[3:] for k, v in row.items() if k != "step" and v == v)  # NaN is never logged
    assert counts["metric points"] == missing + 4 + 1  # steps 3-4 + pretraining (3 losses, wall time) + evaluation
    assert metric_steps(uri, partial.run_id, "critic/score/mean") == [1, 2, 3, 4]
    assert client(uri).get_run(partial.run_id).info.status == "FINISHED"
    assert client(uri).get_run(older.run_id).data.metrics == {}
    assert sync(res, uri, capsys) == {"tracking_uri": uri, "experiment": "rspo-smoke"}


def test_sync_refuses_a_missing_results_folder(tmp_path, capsys):
    rc = sync_main(["--preset", str(SMOKE), "--results", str(tmp_path / "nope"), "--uri", "sqlite:///x.db"])
    assert rc == 2 and "no results folder" in capsys.readouterr().err
    rc = sync_main(["--preset", str(tmp_path / "missing.yaml")])
    assert rc == 2


@pytest.mark.slow
def test_a_train_job_outlives_its_tracking_server_and_sync_records_what_it_missed(assets, tmp_path, capsys):
    """The store is made unwritable mid-run (the tracking server is killed after step 2): the job
    retries for the bound, warns once naming the run, goes on and finishes with a complete run
    folder and exit 0; with the server back, `mlflow-sync` records every step it missed, its final
    artifact and its status, and a second sync writes nothing."""
    res = results_folder(assets, tmp_path)
    out = res / "runs" / RUN
    steps = 25
    with MlflowServer(tmp_path / "server") as server:
        env = env_with(server.uri, RSPO_MLFLOW_RETRY_S="2", RSPO_MLFLOW_PROBE_S="2")
        job = subprocess.Popen(
            train_cmd(assets, out, steps), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and job.poll() is None:
            lines = (out / "metrics.jsonl").read_text().splitlines() if (out / "metrics.jsonl").is_file() else []
            if sum('"critic/score/mean"' in ln for ln in lines) >= 2:
                break
            time.sleep(0.05)
        server.stop()  # the store goes away mid-run
        stdout, stderr = job.communicate(timeout=900)
        assert job.returncode == 0, stderr[-3000:]
        assert json.loads(stdout.strip().splitlines()[-1])["steps"] == steps
        final = json.loads((out / "final.json").read_text())
        assert final["steps"] == steps
        rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
        assert [x["step"] for x in rows if "critic/score/mean" in x] == list(range(1, steps + 1))
        assert f"[mlflow] run '{RUN}'" in stderr and "did not record" in stderr and "mlflow-sync" in stderr
        run_id = json.loads((out / "run.json").read_text())["mlflow_run_id"]
        assert run_id  # created before the outage
        server.start()  # back on the same database
        logged = metric_steps(server.uri, run_id, "critic/score/mean")
        assert len(logged) < steps  # the outage cost the store some steps
        os.environ["MLFLOW_TRACKING_URI"] = server.uri
        try:
            counts = sync(res, server.uri, capsys)
            # the RL run gets its steps and its status; pretraining, evaluation and report are new here
            assert counts["metric points"] > 0 and counts["runs created"] == 3 and counts["statuses"] == 1 + 2
            assert metric_steps(server.uri, run_id, "critic/score/mean") == list(range(1, steps + 1))
            run = client(server.uri).get_run(run_id)
            assert run.info.status == "FINISHED"
            assert {a.path for a in client(server.uri).list_artifacts(run_id)} == {"config.json", "final.json"}
            again = sync(res, server.uri, capsys)
            assert again == {"tracking_uri": server.uri, "experiment": "rspo-smoke"}
        finally:
            os.environ.pop("MLFLOW_TRACKING_URI", None)


def run_make_mlflow_ui(tmp_path, has=(), shipped="", unpack_fails=False):
    """`make mlflow-ui` in a copy of the Makefile with python and snakemake standing in (they record
    their arguments; snakemake fails with ``unpack_fails``) -> (make's result, the calls)."""
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("python", "snakemake"):
        fail = "exit 1\n" if unpack_fails and tool == "snakemake" else ""
        (bin_dir / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> "{tmp_path}/calls"\n{fail}')
        (bin_dir / tool).chmod(0o755)
    for rel in has:
        (tmp_path / "results" / "small" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "results" / "small" / rel).write_text("{}\n")
    # the venv is up to date (make figures asks): its stamp newer than pyproject.toml and the locks
    (tmp_path / "envs" / "locks").mkdir(parents=True)
    older = [
        tmp_path / "pyproject.toml",
        *(tmp_path / "envs" / "locks" / f"{n}.txt" for n in ("main", "evalplus", "uv")),
    ]
    for f in older:
        f.touch()
        os.utime(f, (0, 0))
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / ".installed").touch()
    r = subprocess.run(
        ["make", "mlflow-ui", f"BIN={bin_dir}", "PORT=5055", f"SHIPPED={shipped}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return r, (tmp_path / "calls").read_text().splitlines()


@pytest.mark.parametrize(
    ("has", "shipped", "want"),
    [
        ((), "", "shipped"),  # a fresh clone: the shipped study, unpacked first
        (("bench.json",), "", "shipped"),  # `make bench` without a model: nothing trained
        (("models/base/pretrain.json",), "", "own"),  # a pretraining is a run
        (("runs/grpo-s0/metrics.jsonl",), "", "own"),
        (("runs/grpo-s0/metrics.jsonl",), "1", "shipped"),  # SHIPPED=1: the shipped one beside yours
    ],
)
def test_make_mlflow_ui_shows_your_runs_or_the_shipped_study(tmp_path, has, shipped, want):
    """The Makefile's choice: your results/small when you trained anything, else (or with
    SHIPPED=1) results/small-archive, unpacked by `make figures` when it is not there yet;
    PORT= and HOST= (default 127.0.0.1) reach `mlflow-ui`; nothing is written into your results."""
    r, calls = run_make_mlflow_ui(tmp_path, has, shipped)
    assert r.returncode == 0, r.stdout + r.stderr
    if want == "own":
        assert calls == [
            "python -m rspo mlflow-sync --preset small",
            "python -m rspo mlflow-ui --preset small --host 127.0.0.1 --port 5055",
        ]
    else:
        figures = "snakemake --cores all --quiet rules --config preset=small archive=docs/results/small"
        assert calls[0].startswith(figures)
        assert calls[1:] == [
            "python -m rspo mlflow-sync --preset small --shipped",
            "python -m rspo mlflow-ui --preset small --shipped --host 127.0.0.1 --port 5055",
        ]
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file() and "results" in p.parts)
    assert written == sorted(f"results/small/{rel}" for rel in has)


def test_make_mlflow_ui_stops_when_the_archive_does_not_unpack(tmp_path):
    r, calls = run_make_mlflow_ui(tmp_path, unpack_fails=True)
    assert r.returncode != 0 and len(calls) == 1 and calls[0].startswith("snakemake")
