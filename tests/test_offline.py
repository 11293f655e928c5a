"""Compute jobs that never reach the network: a task's hub data are fetched once by a local rule
(`fetch_data`, rspo.fetch_data; read through rspo.data.fetched), and the jobs that read them
(prepare, evaluate) run with the hub's offline switches set. Here the hub is faked with the shipped
fixtures in its exact schemas, and the jobs run under a socket guard that fails any connection to a
network address."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rspo.data.fetched import MARKER, FetchedDataError, benchmark_paths, rows_of
from rspo.fetch_data import fetch_task_data

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures"

GUARD = """
import socket
_connect, _connect_ex = socket.socket.connect, socket.socket.connect_ex
def _refuse(sock, address):
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        raise OSError(f"socket guard: a connection to {address} from an offline job")
def connect(self, address):
    _refuse(self, address)
    return _connect(self, address)
def connect_ex(self, address):
    _refuse(self, address)
    return _connect_ex(self, address)
socket.socket.connect, socket.socket.connect_ex = connect, connect_ex
"""


def guarded_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a job under the guard: a sitecustomize that refuses network connections,
    the hub's offline switches, no tracking server."""
    guard = tmp_path / "guard"
    guard.mkdir(exist_ok=True)
    (guard / "sitecustomize.py").write_text(GUARD)
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(PYTHONPATH=f"{guard}:{env.get('PYTHONPATH', '')}", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    env.update(OMP_NUM_THREADS="1")
    return env


def _rows(path: Path) -> list[dict]:
    from rspo.data.math import read_rows

    return read_rows(path)


@pytest.fixture
def fake_hub(monkeypatch):
    """datasets.load_dataset, LiveCodeBench's hub files and evalplus's release files from the fixtures;
    records every hub call."""
    import datasets

    from rspo.data import code as C
    from rspo.data import math as M
    from rspo.evaluate import benchmarks as B

    calls: list[tuple] = []
    tables = {
        (M.DEEPSCALER_REPO, None): FIX / "math" / "deepscaler_sample.json",
        (C.DEEPCODER_REPO, "primeintellect"): FIX / "code" / "deepcoder_primeintellect.jsonl",
        (C.DEEPCODER_REPO, "taco"): FIX / "code" / "deepcoder_taco.jsonl",
        (C.DEEPCODER_REPO, "lcbv5"): FIX / "code" / "deepcoder_lcbv5.jsonl",
        (C.LEETCODE_REPO, None): FIX / "code" / "leetcode_sample.jsonl",
        (B.MBPP_REPO, "full"): FIX / "code" / "mbpp_full_test.jsonl",
    }

    class Rows(list):  # what datasets returns, as far as the loaders use it
        def take(self, n):
            return Rows(self[:n])

        def select(self, indices):
            return Rows(self[i] for i in indices)

    def load_dataset(repo, config=None, split=None, revision=None, streaming=False):
        calls.append((repo, config, split, revision))
        return Rows(_rows(tables[(repo, config)]))

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    monkeypatch.setattr(B, "lcb_hub_files", lambda revision=B.LCB_REVISION: [FIX / "code" / "lcb_release_sample.jsonl"])
    plus = {"humaneval_plus": "humanevalplus_sample.jsonl", "mbpp_plus": "mbppplus_sample.jsonl"}
    monkeypatch.setattr(B, "evalplus_release_file", lambda name: str(FIX / "code" / plus[name]))
    return calls


def test_a_fetched_folder_gives_the_records_the_hub_gives_and_refuses_another_revision(fake_hub, tmp_path):
    from rspo.data import code as C
    from rspo.data import math as M

    code = fetch_task_data("code", tmp_path / "code", train=True, benchmarks=["mbpp", "livecodebench"])
    math = fetch_task_data("math", tmp_path / "math", train=True)
    assert set(code["files"]) == {
        "train.primeintellect",
        "train.taco",
        "train.lcbv5",
        "train.leetcode",
        "mbpp",
        "livecodebench",
    }
    assert (
        code["files"]["train.taco"]["revision"] == C.DEEPCODER_REVISION
        and math["files"]["train.deepscaler"]["rows"] == 4
    )
    assert C.load_code_train(str(tmp_path / "code"), limit=3, seed=1) == C.load_code_train("hub", limit=3, seed=1)
    assert M.load_math_train(str(tmp_path / "math"), limit=2) == M.load_math_train("hub", limit=2)
    with pytest.raises(FetchedDataError, match="fetched at revision .* was asked for"):
        rows_of(tmp_path / "math", "train.deepscaler", "0" * 40)
    with pytest.raises(FetchedDataError, match="humaneval_plus was not fetched"):
        rows_of(tmp_path / "code", "humaneval_plus", "x")
    # a later fetch into the folder keeps what an earlier one brought
    fetch_task_data("code", tmp_path / "code", train=False, benchmarks=["humaneval_plus"])
    paths = benchmark_paths(tmp_path / "code", ["mbpp", "livecodebench", "humaneval_plus", "humaneval"])
    assert set(paths) == {"mbpp", "livecodebench", "humaneval_plus"} and isinstance(paths["livecodebench"], list)


def test_prepare_and_the_code_benchmarks_read_a_fetched_folder_with_no_network(fake_hub, tmp_path):
    """`rspo prepare TASK --source FOLDER` and the evaluation's loaders, in processes that cannot
    connect anywhere: the records are those of the hub."""
    from rspo.data import code as C
    from rspo.data import math as M

    fetch_task_data("code", tmp_path / "code", train=True, benchmarks=["mbpp", "livecodebench", "humaneval_plus"])
    fetch_task_data("math", tmp_path / "math", train=True)
    env = guarded_env(tmp_path)
    probe = subprocess.run(
        [sys.executable, "-c", "import socket; socket.create_connection(('127.0.0.1', 9), timeout=1)"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert probe.returncode != 0 and "socket guard" in probe.stderr  # the guard is on
    for task, hub in (("code", C.load_code_train("hub")), ("math", M.load_math_train("hub"))):
        out = tmp_path / f"{task}.jsonl"
        r = subprocess.run(
            [sys.executable, "-m", "rspo", "prepare", task, "--out", str(out), "--source", str(tmp_path / task)],
            env=env,
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        assert r.returncode == 0, r.stderr[-2000:]
        assert _rows(out) == json.loads(json.dumps(hub))
    load = f"""
import json
from types import SimpleNamespace
from rspo.evaluate import benchmarks as B
from rspo.evaluate.run import code_data_paths
settings = SimpleNamespace(data_paths=SimpleNamespace(humaneval=None, mbpp=None, livecodebench=None),
                           benchmarks=("humaneval", "mbpp", "livecodebench", "humaneval_plus"))
paths = code_data_paths(settings, {str(tmp_path / "code")!r})
n = {{"humaneval": len(B.load_benchmark("humaneval", path=paths.get("humaneval"))),
     "mbpp": len(B.load_mbpp(paths["mbpp"])), "livecodebench": len(B.load_livecodebench(paths["livecodebench"])),
     "humaneval_plus": len(B.load_evalplus("humaneval_plus", paths["humaneval_plus"]))}}
print(json.dumps(n))
"""
    r = subprocess.run([sys.executable, "-c", load], env=env, capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {
        "humaneval": 164,
        "mbpp": 3,
        "livecodebench": 4,
        "humaneval_plus": 2,
    }


@pytest.mark.slow
def test_every_networked_rule_is_local_and_the_compute_jobs_run_offline(fake_hub, tmp_path):
    """A smoke preset shaped like the paper's (hub sources for math and code, MBPP and LiveCodeBench
    scored from the hub): fetch_data and fetch_model are the workflow's local rules, the jobs that
    read hub data get the offline switches and the fetched folder, and Snakemake runs the data
    preparation and the code evaluation of the base model under the socket guard, the hub data
    fetched beforehand (here from the fixtures)."""
    from test_workflow import make_workspace, snakemake

    (tmp_path / "ws").mkdir()
    ws = make_workspace(tmp_path / "ws")
    preset = yaml.safe_load((ROOT / "configs" / "smoke.yaml").read_text())
    preset["preset"] = "smoke_hub"
    preset["prepare"] = {"math": {"source": "hub"}, "code": {"source": "hub"}}
    preset["eval"]["code"].pop("data_paths")
    (ws / "configs" / "smoke_hub.yaml").write_text(yaml.safe_dump(preset))
    hub = ws / "results" / "hub" / "data"
    dry = snakemake(ws, "-n", "-p", "--config", "preset=smoke_hub")
    assert dry.returncode == 0, dry.stderr[-3000:]
    fetch_lines = [x for x in dry.stdout.splitlines() if "rspo fetch-data" in x]
    assert {x.split("fetch-data ")[1].split()[0] for x in fetch_lines} == {"math", "code"}
    assert "--train --benchmarks mbpp livecodebench" in next(x for x in fetch_lines if "fetch-data code" in x)
    jobs = [x for x in dry.stdout.splitlines() if "rspo prepare" in x or "rspo evaluate code" in x]
    assert jobs and all(
        x.split("Shell command: ")[-1].startswith("HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 ") for x in jobs
    )
    assert all("--source hub" not in x for x in jobs)
    assert all("--data-dir results/hub/data/code" in x for x in jobs if "evaluate code" in x)
    local = subprocess.run(
        [sys.executable, "-c", LOCAL_RULES], cwd=ws, capture_output=True, text=True, env=guarded_env(tmp_path)
    )
    assert local.returncode == 0, local.stderr[-2000:]
    assert {"fetch_data", "fetch_model"} <= set(json.loads(local.stdout.strip().splitlines()[-1]))
    # the local rule's work, done beforehand (the fake hub); then the compute jobs, offline
    fetch_task_data("math", hub / "math", train=True)
    fetch_task_data("code", hub / "code", train=True, benchmarks=["mbpp", "livecodebench"])
    targets = [
        "results/smoke_hub/data/math/train.jsonl",
        "results/smoke_hub/data/code/train.jsonl",
        "results/smoke_hub/eval/base/code.json",
    ]
    env = guarded_env(tmp_path)
    r = subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "2", *targets, "--config", "preset=smoke_hub"],
        cwd=ws,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    logs = "".join(p.read_text()[-1500:] for p in (ws / "results").rglob("*.log") if "socket guard" in p.read_text())
    assert r.returncode == 0, r.stderr[-3000:] + logs
    assert "rspo fetch-data" not in r.stdout + r.stderr  # nothing fetched inside the run
    result = json.loads((ws / "results" / "smoke_hub" / "eval" / "base" / "code.json").read_text())
    assert set(result["benchmarks"]) >= {"humaneval", "mbpp", "livecodebench"}
    assert len(_rows(ws / "results" / "smoke_hub" / "data" / "code" / "train.jsonl")) > 0
    assert (hub / "code" / MARKER).is_file()


LOCAL_RULES = """
import json
from pathlib import Path
from snakemake.api import SnakemakeApi
from snakemake.settings.types import ConfigSettings, OutputSettings, ResourceSettings, StorageSettings
with SnakemakeApi(OutputSettings()) as api:
    wf = api.workflow(resource_settings=ResourceSettings(cores=1), storage_settings=StorageSettings(),
                      config_settings=ConfigSettings(config={"preset": "smoke_hub"}), snakefile=Path("Snakefile"))
    wf.dag()
    print(json.dumps(sorted(wf._workflow._localrules)))
"""
