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
from rspo.tracking import ensure_experiment, log_report
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
    assert tracking.report_run(uri, "rspo-test", "test") == run.info.run_id


def test_mlflow_init_creates_the_report_run_and_prints_the_runs_table(uri, capsys):
    assert tracking.init_main(["--preset", str(ROOT / "configs" / "smoke.yaml"), "--uri", uri]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ui"].endswith(f"#/experiments/{out['experiment_id']}/runs?workflowType=machine_learning")
    c = client(uri)
    assert c.get_run(out["report_run_id"]).info.run_name == "report"
    assert c.get_experiment(out["experiment_id"]).tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND


def test_mlflow_ui_refuses_a_missing_store(tmp_path, capsys):
    rc = tracking.ui_main(["--uri", f"sqlite:///{tmp_path / 'none.db'}", "--experiment", "x"])
    assert rc == 2 and "no MLflow store" in capsys.readouterr().err
    assert not (tmp_path / "none.db").exists()
