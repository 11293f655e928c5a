"""rspo.hub: hub models fetched once into a local folder, offline from the hub cache or refused
naming the model, resolved for every loader; the workflow's fetch_model rule before the jobs
that read it. No network: each test writes the hub cache it reads (huggingface_hub's layout)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
REPO = "test-org/tiny-moe"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory):
    """A hub cache holding REPO at COMMIT (refs/main -> snapshot), as huggingface_hub writes it: a
    tiny MoE whose tokenizer carries a chat template with a thinking switch, as Qwen3's does."""
    from tiny_moe import make_chat_checkpoint

    cache = tmp_path_factory.mktemp("hf") / "hub"
    repo = cache / "models--test-org--tiny-moe"
    model_dir = make_chat_checkpoint(tmp_path_factory.mktemp("model") / "m")
    snap = repo / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for f in model_dir.iterdir():  # blobs + links from the snapshot, as the cache stores them
        blob = repo / "blobs" / f"blob-{f.name}"
        shutil.copyfile(f, blob)
        (snap / f.name).symlink_to(os.path.relpath(blob, snap))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return cache


def env_for(cache: Path, **extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "MLFLOW_"))}
    env.update(HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), **extra)
    return env


def rspo(*args: str, env: dict[str, str], cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rspo", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=600
    )


def test_fetch_model_offline_takes_the_cached_snapshot_once(hub_cache, tmp_path):
    out = tmp_path / "hub" / "test-org--tiny-moe"
    r = rspo("fetch-model", "--model", REPO, "--out", str(out), env=env_for(hub_cache))
    assert r.returncode == 0, r.stderr[-3000:]
    marker = json.loads((out / "rspo_snapshot.json").read_text())
    assert marker["repo_id"] == REPO and marker["commit"] == COMMIT and marker["from"] == "hub cache"
    names = {f["name"] for f in marker["files"]}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= names
    blob = (hub_cache / "models--test-org--tiny-moe" / "snapshots" / COMMIT / "model.safetensors").resolve()
    assert (out / "model.safetensors").stat().st_ino == blob.stat().st_ino  # hard-linked, not a second copy
    before = (out / "rspo_snapshot.json").stat().st_mtime_ns
    r = rspo("fetch-model", "--model", REPO, "--out", str(out), env=env_for(hub_cache))
    assert r.returncode == 0 and (out / "rspo_snapshot.json").stat().st_mtime_ns == before  # nothing fetched twice


def test_offline_without_a_cached_snapshot_is_refused_naming_the_model(tmp_path):
    out = tmp_path / "m"
    r = rspo("fetch-model", "--model", "nobody/absent-model", "--out", str(out), env=env_for(tmp_path / "empty"))
    assert r.returncode == 1
    assert "model nobody/absent-model: not in the local hub cache and HF_HUB_OFFLINE is set" in r.stderr
    assert not (out / "rspo_snapshot.json").exists()
    r = rspo("fetch-model", "--model", "./not-a-hub-id", "--out", str(out), env=env_for(tmp_path / "empty"))
    assert r.returncode == 2 and "not a hub id" in r.stderr


def test_a_base_model_given_as_a_hub_id_is_evaluated_from_the_cache(hub_cache, tmp_path):
    out = tmp_path / "math.json"
    args = ["evaluate", "math", "--preset", str(ROOT / "configs" / "smoke.yaml"), "--model", REPO]
    args += ["--out", str(out), "--benchmarks", "math500", "--limit", "2", "--no-mlflow", "--quiet"]
    r = rspo(*args, env=env_for(hub_cache))
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["benchmarks"]["math500"]["n_problems"] == 2 and result["model"] == REPO
    # the settings that decoded are recorded (the token budget was written as null before)
    cfg = result["config"]
    assert cfg["max_new_tokens"] == 32 and cfg["dtype"] == "float32" and cfg["backend"] == "hf"


def test_the_workflow_fetches_a_hub_model_once_before_the_jobs_that_read_it(hub_cache, tmp_path):
    """A preset whose math runs start from a hub model: the fetch_model rule makes the local
    folder first, the base evaluation reads it (--model names the folder, not the hub id)."""
    preset = yaml.safe_load((ROOT / "configs" / "smoke.yaml").read_text())
    preset["preset"] = "hubtest"
    preset["tasks"]["math"]["model"] = {"path": REPO}
    ws = tmp_path / "ws"
    ws.mkdir()
    for name in ("Snakefile", "workflow", "profiles", "envs", "configs", "tests"):
        (ws / name).symlink_to(ROOT / name)
    (ws / "hubtest.yaml").write_text(yaml.safe_dump(preset))
    target = "results/hubtest/eval/base/math.json"
    env = env_for(hub_cache, MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}")
    cmd = [sys.executable, "-m", "snakemake", "--cores", "2", target, "--config", "preset=hubtest.yaml"]
    r = subprocess.run(cmd, cwd=ws, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    folder = ws / "results" / "hub" / "test-org--tiny-moe"
    assert json.loads((folder / "rspo_snapshot.json").read_text())["commit"] == COMMIT
    assert json.loads((ws / target).read_text())["model"] == "results/hub/test-org--tiny-moe"
    log = (ws / "results" / "hubtest" / "logs" / "eval" / "base.math.log").read_text()
    assert "Traceback" not in log
    # offline with nothing cached: the fetch rule fails naming the model, before any job reads it
    shutil.rmtree(ws / "results" / "hub")
    r = subprocess.run(
        [*cmd, "-F", "--allowed-rules", "fetch_model", "evaluate_task"],
        cwd=ws,
        env=env_for(tmp_path / "empty"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode != 0
    fetch_log = (ws / "results" / "hub" / "logs" / "test-org--tiny-moe.log").read_text()
    assert f"model {REPO}: not in the local hub cache" in fetch_log
