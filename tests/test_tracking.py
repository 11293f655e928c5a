"""rspo.tracking: the experiment is a model-training experiment (the UI's runs table), runs record
their source and their data files as dataset inputs (digest of the bytes, never loaded), the
report run is one run per preset even when report jobs race, and `mlflow-init` / `mlflow-ui`
print the runs table's address."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rspo import tracking
from rspo.commands import mlflow as mlflow_commands
from rspo.report import mlflow_run
from rspo.tracking import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, Tracker, ensure_experiment, file_dataset

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def uri(tmp_path):
    return f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}"


def client(uri):
    from mlflow.tracking import MlflowClient

    return MlflowClient(uri)


def test_experiment_is_marked_model_training_also_when_it_existed_before(uri):
    exp_id = ensure_experiment(uri, "rspo-test")
    assert client(uri).get_experiment(exp_id).tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND == "custom_model_development"
    old = client(uri).create_experiment("made-by-an-older-version")  # no tag
    assert ensure_experiment(uri, "made-by-an-older-version") == old
    assert client(uri).get_experiment(old).tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND
    assert tracking.experiment_url(exp_id) == (
        f"http://127.0.0.1:5000/#/experiments/{exp_id}/runs?workflowType=machine_learning"
    )


def test_file_dataset_digests_the_bytes_and_counts_rows(tmp_path):
    f = tmp_path / "countdown" / "train.jsonl"
    f.parent.mkdir()
    f.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(1000)) + '{"i": "last, no newline"}')
    ds = file_dataset(f)
    sha = hashlib.sha256(f.read_bytes()).hexdigest()
    assert ds.name == "countdown/train" and ds.digest == sha[:10]
    assert json.loads(ds.source.to_json()) == {"uri": str(f.resolve())}
    assert json.loads(ds.profile) == {"num_rows": 1001, "bytes": f.stat().st_size, "sha256": sha}
    entity = ds._to_mlflow_entity()
    assert entity.source_type == "local" and json.loads(entity.profile)["num_rows"] == 1001
    f.write_text("changed\n")  # a new version of the file gets a new digest (the cache keys on size/mtime)
    os.utime(f, ns=(1, 1))
    assert file_dataset(f).digest == hashlib.sha256(b"changed\n").hexdigest()[:10]


def test_tracker_records_source_and_datasets_once_per_run(uri, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text('{"a": 1}\n{"a": 2}\n')
    (data / "val.jsonl").write_text('{"a": 3}\n')
    files = [(data / "train.jsonl", "training"), (data / "val.jsonl", "validation")]
    t = Tracker(uri, "rspo-test", "grpo-s0", source="rspo train")
    t.log_datasets(files)
    t.end()
    resumed = Tracker(uri, "rspo-test", "grpo-s0", run_id=t.run_id)  # a resumed job logs them again
    resumed.log_datasets(files)
    run = client(uri).get_run(t.run_id)
    got = sorted(
        (d.dataset.name, d.dataset.digest, [(x.key, x.value) for x in d.tags][0][1]) for d in run.inputs.dataset_inputs
    )
    assert got == [
        ("data/train", hashlib.sha256((data / "train.jsonl").read_bytes()).hexdigest()[:10], "training"),
        ("data/val", hashlib.sha256((data / "val.jsonl").read_bytes()).hexdigest()[:10], "validation"),
    ]
    tags = run.data.tags
    assert tags["mlflow.source.name"] == "rspo train" and tags["mlflow.source.type"] == "LOCAL"
    assert tags["mlflow.source.git.commit"] == tags["git_commit"] == tracking.git_commit()
    assert tags["mlflow.user"] and tags["command"]


def test_command_line_is_what_a_user_types():
    main = str(ROOT / "rspo" / "__main__.py")
    assert tracking.command_line([main, "train", "--run", "a b"]) == "python -m rspo train --run 'a b'"
    assert tracking.command_line(["/x/bin/rspo", "report"]) == "python -m rspo report"


_LOG_ONE = """
import sys
from rspo.report.mlflow_run import log_report
from rspo.tracking import ensure_experiment
uri, target, png = sys.argv[1:4]
ensure_experiment(uri, "rspo-test")  # the store's engine is up: what follows is only the race
print("ready", flush=True)
sys.stdin.readline()  # every job starts logging at the same moment
log_report(uri, "rspo-test", "test", target, [png], ["grpo-s0", "gmpo-rs0.8-s0"])
"""


def test_parallel_report_jobs_share_one_report_run(uri, tmp_path):
    """Four report jobs at once on a store without a report run (as outside Snakemake): one run
    named `report` holds every file and every job's tag; its description links the runs."""
    ensure_experiment(uri, "rspo-test")  # the store exists before jobs start (mlflow-init)
    ids = {}
    for name in ("grpo-s0", "gmpo-rs0.8-s0"):
        t = Tracker(uri, "rspo-test", name)
        t.end()
        ids[name] = t.run_id
    procs = []
    targets = ["fig1_reward", "fig4_plugin", "fig7_entropy", "table_countdown"]
    for target in targets:
        f = tmp_path / f"{target}.png"
        f.write_bytes(b"\x89PNG fake " + target.encode())
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", _LOG_ONE, uri, target, str(f)],
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    for p in procs:
        assert p.stdout.readline().strip() == "ready", p.stderr.read()[-3000:]
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
    c = client(uri)
    exp = c.get_experiment_by_name("rspo-test")
    reports = c.search_runs([exp.experiment_id], "attributes.run_name = 'report'")
    assert len(reports) == 1
    run = reports[0]
    assert run.info.status == "FINISHED" and run.data.tags["kind"] == "report"
    assert run.data.tags["mlflow.source.name"] == "rspo report"
    for target in targets:
        assert run.data.tags[f"runs/{target}"] == "grpo-s0, gmpo-rs0.8-s0"
        assert f"**{target}**" in run.data.tags["mlflow.note.content"]
    note = run.data.tags["mlflow.note.content"]
    for name, rid in ids.items():
        assert f"[{name}](#/experiments/{exp.experiment_id}/runs/{rid})" in note
    files = {a.path for folder in ("figures", "tables") for a in c.list_artifacts(run.info.run_id, folder)}
    assert files == {
        "figures/fig1_reward.png",
        "figures/fig4_plugin.png",
        "figures/fig7_entropy.png",
        "tables/table_countdown.png",
    }
    # mlflow-init finds the same run instead of making another
    assert mlflow_run.report_run(uri, "rspo-test", "test") == run.info.run_id


def test_mlflow_init_creates_the_report_run_and_prints_the_runs_table(uri, capsys):
    assert mlflow_commands.init_main(["--preset", str(ROOT / "configs" / "smoke.yaml"), "--uri", uri]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ui"].endswith(f"#/experiments/{out['experiment_id']}/runs?workflowType=machine_learning")
    c = client(uri)
    assert c.get_run(out["report_run_id"]).info.run_name == "report"
    assert c.get_experiment(out["experiment_id"]).tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND


def test_mlflow_ui_refuses_a_missing_store(tmp_path, capsys):
    rc = mlflow_commands.ui_main(["--uri", f"sqlite:///{tmp_path / 'none.db'}", "--experiment", "x"])
    assert rc == 2 and "no MLflow store" in capsys.readouterr().err
    assert not (tmp_path / "none.db").exists()


# ---------------------------------------------------------------------------- many jobs, one store

_RACE = """
import json, sys
from pathlib import Path
from multiprocessing.managers import BaseManager

uri, root, index, rounds, address = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
from rspo.tracking import Tracker

class M(BaseManager):
    pass

M.register("barrier")
m = M(address=tuple(json.loads(address)), authkey=b"race")
m.connect()
barrier = m.barrier()
for r in range(rounds):
    data = root / f"round{r}"
    barrier.wait()  # every job creates its run at the same moment ...
    t = Tracker(uri, "rspo-race", f"job{index}-r{r}", params={"seed": str(index), "a/b": "1"},
                tags={"kind": "train"}, source="rspo train", key=f"train/job{index}-r{r}", retry_s=60)
    barrier.wait()  # ... then registers the same data files at the same moment (MLflow's race)
    t.log_datasets([(data / "train.jsonl", "training"), (data / "val.jsonl", "validation")])
    for step in range(3):
        t.log_metrics({"critic/score/mean": 0.1 * step, "actor/ppo_kl": step}, step)
    t.set_tag("collapse", "false")
    t.log_artifact(data / "train.jsonl")
    t.end()
    print(json.dumps({"round": r, "lost": t.net.lost}), flush=True)
"""


@pytest.mark.slow
def test_many_jobs_log_the_same_datasets_at_once_and_every_write_lands(uri, tmp_path):
    """8 processes released by a barrier create runs and register the same data files into one
    sqlite store, 6 rounds. MLflow looks a dataset up, then inserts it, so concurrent first
    registrations violate its unique key: before the fix, 9 of 10 such rounds had a process die
    with `UNIQUE constraint failed: datasets...` (the failure that stopped `make main`). Now every
    write lands: no process fails or loses anything, each dataset is stored once, every run is
    complete."""
    from multiprocessing.managers import BaseManager
    from threading import Barrier

    n, rounds = 8, 6
    ensure_experiment(uri, "rspo-race")  # mlflow-init: the store exists before jobs start
    for r in range(rounds):
        d = tmp_path / f"round{r}"
        d.mkdir()
        (d / "train.jsonl").write_text(json.dumps({"round": r}) + "\n")
        (d / "val.jsonl").write_text(json.dumps({"val": r}) + "\n")
    barrier = Barrier(n, timeout=600)

    class M(BaseManager):
        pass

    M.register("barrier", callable=lambda: barrier)
    manager = M(address=("127.0.0.1", 0), authkey=b"race")
    manager.start()
    try:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        env["OMP_NUM_THREADS"] = "1"
        addr = json.dumps(list(manager.address))
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", _RACE, uri, str(tmp_path), str(i), str(rounds), addr],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for i in range(n)
        ]
        outs = [p.communicate(timeout=900) for p in procs]
    finally:
        manager.shutdown()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
        reports = [json.loads(ln) for ln in out.splitlines()]
        assert [x["round"] for x in reports] == list(range(rounds))
        assert all(x["lost"] == {} for x in reports), reports
    c = client(uri)
    exp = c.get_experiment_by_name("rspo-race")
    runs = c.search_runs([exp.experiment_id], max_results=1000)
    assert len(runs) == n * rounds
    for run in runs:
        assert run.info.status == "FINISHED"
        assert run.data.params == {"seed": run.info.run_name[3], "a/b": "1"}
        assert run.data.tags["collapse"] == "false" and run.data.tags["rspo.key"] == f"train/{run.info.run_name}"
        assert len(c.get_metric_history(run.info.run_id, "critic/score/mean")) == 3
        assert len(c.get_run(run.info.run_id).inputs.dataset_inputs) == 2
        assert [a.path for a in c.list_artifacts(run.info.run_id)] == ["train.jsonl"]
    import sqlite3

    db = sqlite3.connect(str(tracking.sqlite_path(uri)))
    assert db.execute("select count(*), count(distinct name || digest) from datasets").fetchone() == (2 * rounds,) * 2


# ---------------------------------------------------------------------------- a broken store


class Flaky:
    """Wraps a client: calls of the named methods raise while `down` is set."""

    def __init__(self, inner, methods):
        self.inner, self.methods, self.down, self.calls = inner, set(methods), False, 0

    def __getattr__(self, name):
        fn = getattr(self.inner, name)
        if name not in self.methods:
            return fn

        def call(*a, **kw):
            self.calls += 1
            if self.down:
                import sqlite3

                raise sqlite3.OperationalError("attempt to write a readonly database")
            return fn(*a, **kw)

        return call


def test_a_store_that_breaks_mid_run_never_fails_the_job(uri, capsys):
    """Writes fail for longer than the retry bound: the tracker warns once (naming the run and
    what was not recorded), stops trying except one probe per probe interval, resumes when the
    store answers again, and lists everything it missed at the end."""
    t = Tracker(uri, "rspo-test", "grpo-s0", retry_s=0.3, probe_s=0.2, preset="small")
    t.client = Flaky(t.client, {"log_batch", "set_tag", "log_artifact", "set_terminated"})
    t.log_metrics({"critic/score/mean": 0.5}, 1)
    t.client.down = True
    t.log_metrics({"critic/score/mean": 0.6}, 2)  # retried for 0.3 s, then given up
    assert t.net.offline and t.client.calls > 2
    calls = t.client.calls
    t.log_metrics({"critic/score/mean": 0.7}, 3)  # skipped: within the probe interval
    t.set_tag("collapse", "true")
    assert t.client.calls == calls
    import time

    time.sleep(0.25)
    t.client.down = False
    t.log_metrics({"critic/score/mean": 0.8}, 4)  # the probe goes through: tracking resumes
    assert not t.net.offline
    t.end()
    err = capsys.readouterr().err
    assert "run 'grpo-s0': metrics not recorded: the store failed for 0.3 s" in err
    assert "attempt to write a readonly database" in err and "the store answers again" in err
    assert "did not record: metrics (2 steps, 2-3), tag collapse" in err
    assert "python -m rspo mlflow-sync --preset small" in err
    c = client(uri)
    steps = [m.step for m in c.get_metric_history(t.run_id, "critic/score/mean")]
    assert sorted(steps) == [1, 4] and c.get_run(t.run_id).info.status == "FINISHED"


def test_no_store_at_all_costs_the_job_a_bounded_time(capsys):
    """A tracking server that is down from the start: the job goes on, each call is retried for
    at most the bound, later calls are skipped, and the end says no run was created."""
    import time

    t0 = time.monotonic()
    t = Tracker("http://127.0.0.1:9", "rspo-test", "gmpo-s1", retry_s=1.0, probe_s=60)
    for step in range(50):
        t.log_metrics({"x": step}, step)
    t.log_artifact(__file__)
    t.end()
    assert time.monotonic() - t0 < 30
    assert t.run_id is None
    err = capsys.readouterr().err
    assert "gmpo-s1" in err and "no MLflow run (never created)" in err and "metrics (50 steps, 0-49)" in err


def test_a_rejected_value_is_reported_at_once_not_retried(uri, capsys):
    t = Tracker(uri, "rspo-test", "grpo-s0", params={"lr": "1"}, retry_s=30)
    import time

    t0 = time.monotonic()
    t.log_params({"lr": "2"})  # MLflow refuses to change a param: permanent, no 30 s of retries
    assert time.monotonic() - t0 < 5 and not t.net.offline
    assert "params not recorded" in capsys.readouterr().err
    t.log_metrics({"x": 1.0}, 1)  # the store still takes everything else
    assert client(uri).get_run(t.run_id).data.metrics == {"x": 1.0}


def test_a_retried_run_creation_does_not_make_a_second_run(uri):
    """A creation that went through but reported an error (a server timeout after its commit) is
    found again by the tracker's uid on the retry."""
    from mlflow.tracking import MlflowClient

    real = MlflowClient.create_run
    state = {"n": 0}

    def create_then_fail(self, *a, **kw):
        state["n"] += 1
        run = real(self, *a, **kw)
        if state["n"] == 1:
            raise ConnectionError("read timed out (after the server committed)")
        return run

    MlflowClient.create_run = create_then_fail
    try:
        t = Tracker(uri, "rspo-test", "grpo-s0", retry_s=10)
    finally:
        MlflowClient.create_run = real
    exp = client(uri).get_experiment_by_name("rspo-test")
    assert [r.info.run_id for r in client(uri).search_runs([exp.experiment_id])] == [t.run_id]
    assert state["n"] == 1  # the retry found it instead of creating another


def test_sqlite_connections_wait_for_locks(uri):
    ensure_experiment(uri, "rspo-test")  # creates the store (and configures the clients)
    from sqlalchemy import create_engine, text

    with create_engine(uri).connect() as conn:
        assert conn.execute(text("PRAGMA busy_timeout")).scalar() == tracking.SQLITE_BUSY_TIMEOUT_MS


def test_a_tag_past_mlflows_limit_is_cut_with_its_whole_value_an_artifact(uri, capsys):
    """The report run's description grows with the runs (16,311 characters seen): the tag is cut
    at MLflow's limit, the last line names the artifact, the artifact holds every character, and
    the warning names the key."""
    from mlflow.utils.validation import MAX_TAG_VAL_LENGTH

    c = client(uri)
    exp_id = ensure_experiment(uri, "rspo-test")
    rid = c.create_run(exp_id).info.run_id
    tracking.set_long_tag(c, rid, "short", "a, b")
    value = ", ".join(f"gmpo-rs0.8-s{i}" for i in range(1500))
    assert len(value) > MAX_TAG_VAL_LENGTH
    tracking.set_long_tag(c, rid, "mlflow.note.content", value)
    tags = c.get_run(rid).data.tags
    assert tags["short"] == "a, b"
    kept = tags["mlflow.note.content"]
    assert len(kept) == MAX_TAG_VAL_LENGTH and value.startswith(kept.split("\n\n... cut at")[0])
    assert kept.endswith(f"all {len(value):,}: artifact tags/mlflow.note.content.txt")
    whole = c.download_artifacts(rid, "tags/mlflow.note.content.txt", str(Path(uri[len("sqlite:///") :]).parent))
    assert Path(whole).read_text(encoding="utf-8") == value
    err = capsys.readouterr().err
    assert "tag mlflow.note.content" in err and f"{len(value):,} characters" in err and "tags/" in err
    assert "is truncated to" not in err  # MLflow's own warning, which names neither, never fires
