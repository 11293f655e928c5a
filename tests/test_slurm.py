"""The SLURM profile for real: scripts/slurm_local.sh starts a one-node SLURM cluster on
localhost (root + apt), a small DAG and the first stage of the real smoke DAG run through
`snakemake --profile cluster` (typed as a user would, from the workflow's root), then the
daemons started here are stopped. Where SLURM cannot start, the tests skip with the reason."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "slurm_local.sh"

TINY = """
rule all:
    input: "c.txt"

rule a:
    output: "a{i}.txt"
    resources: mem_mb=200, runtime=5
    shell: "echo $SLURM_JOB_ID > {output}"

rule c:
    input: "a1.txt", "a2.txt"
    output: "c.txt"
    resources: mem_mb=200, runtime=5
    shell: "cat {input} > {output}; echo $SLURM_JOB_ID >> {output}"
"""


@pytest.fixture(scope="module")
def slurm():
    if os.geteuid() != 0:
        pytest.skip("SLURM cannot start here: scripts/slurm_local.sh needs root")
    if shutil.which("apt-get") is None and shutil.which("slurmctld") is None:
        pytest.skip("SLURM cannot start here: slurm-wlm is not installed and apt-get is unavailable")
    was_up = subprocess.run([str(SCRIPT), "status"], capture_output=True).returncode == 0
    r = subprocess.run([str(SCRIPT), "start"], capture_output=True, text=True, timeout=300)
    if r.returncode in (3, 4, 5):
        reason = f"SLURM cannot start here: {r.stderr.strip() or r.stdout.strip()}"
        print(reason)
        pytest.skip(reason)
    assert r.returncode == 0, r.stdout + r.stderr
    yield
    if not was_up:  # stop only what this test started
        subprocess.run([str(SCRIPT), "stop"], capture_output=True, timeout=60)
        # and its slurm.conf: left without a controller, it makes every later Snakemake start wait
        # ~9 s (the SLURM plugin asks `scontrol show config` at import)
        conf = Path("/etc/slurm/slurm.conf")
        assert not (conf.exists() and "rspo scripts/slurm_local.sh" in conf.read_text()), "stop left its slurm.conf"


def _snakemake(cwd: Path, *args: str, timeout: int = 150, tracking_uri: str = "") -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("MLFLOW_TRACKING_URI", None)
    if tracking_uri:
        env["MLFLOW_TRACKING_URI"] = tracking_uri
    # SIGINT, not SIGTERM, ends a Snakemake waiting on SLURM status checks (workflow_facts.md 3).
    proc = subprocess.Popen(
        [sys.executable, "-m", "snakemake", *args],
        cwd=cwd,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(2)
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:  # never leave it behind, waiting on SLURM
            proc.kill()
            out, _ = proc.communicate()
        queue = subprocess.run(["squeue", "-o", "%i %P %T %r %C %b"], capture_output=True, text=True).stdout
        pytest.fail(f"snakemake via SLURM did not finish in {timeout} s (squeue: {queue.strip()}):\n{out[-3000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


def test_small_dag_through_the_cluster_profile(slurm, tmp_path):
    (tmp_path / "Snakefile").write_text(TINY)
    (tmp_path / "cluster").symlink_to(ROOT / "cluster")
    r = _snakemake(tmp_path, "--profile", "cluster", "--jobs", "2")
    assert r.returncode == 0, r.stdout[-4000:]
    ids = (tmp_path / "c.txt").read_text().split()
    assert len(ids) == 3 and len(set(ids)) == 3 and all(i.isdigit() for i in ids), ids  # three SLURM jobs
    assert "Auto-selected partition 'debug'" in r.stdout  # CPU jobs avoid the GPU partition
    assert list((tmp_path / "logs" / "slurm").glob("rule_a/*"))  # slurm-logdir of the profile


# the smallest figure of the smoke grid that still has a run with RS and one without (two train jobs;
# fig4_plugin needs four: the slice was that figure, and its other two runs added nothing here)
FIG = "fig6_mechanism"


@pytest.mark.slow
def test_smoke_slice_through_the_cluster_profile_into_a_tracking_server(slurm, tmp_path):
    """A slice of the real smoke DAG through `--profile cluster`: data -> tokenizer -> pretrain ->
    the two runs of FIG (GRPO, and GMPO with RS) -> FIG, every job a SLURM job, all tracked in a real
    `mlflow server` on 127.0.0.1 (MLFLOW_TRACKING_URI, as the README tells cluster users): every run of the
    slice is in the server, finished, and no sqlite store was made under results/."""
    from mlflow.tracking import MlflowClient
    from mlflow_server import MlflowServer

    from rspo.plan import Plan

    work = tmp_path / "wf"
    work.mkdir()
    for name in ("Snakefile", "workflow", "profiles", "envs", "cluster", "configs", "tests"):
        (work / name).symlink_to(ROOT / name)
    with MlflowServer(tmp_path / "server") as server:
        r = _snakemake(
            work,
            "--profile",
            "cluster",
            "--jobs",
            "2",
            FIG,
            "--config",
            "preset=smoke",
            timeout=900,
            tracking_uri=server.uri,
        )
        assert r.returncode == 0, r.stdout[-4000:]
        res = work / "results" / "smoke"
        assert (res / "figures" / f"{FIG}.pdf").stat().st_size > 1000
        assert (res / "models" / "base" / "pretrain.json").is_file()
        assert not (res / "mlflow" / "mlflow.db").exists()  # everything went to the server
        for rule in ("countdown_data", "tokenizer", "pretrain", "train", FIG):  # all were SLURM jobs
            assert list((work / "logs" / "slurm" / f"rule_{rule}").glob("**/*.log")), rule
        client = MlflowClient(server.uri)
        exp = client.get_experiment_by_name("rspo-smoke")
        found = {x.info.run_name: x for x in client.search_runs([exp.experiment_id], max_results=1000)}
        runs = Plan.from_file(ROOT / "configs" / "smoke.yaml").figure_runs(FIG)
        for name in [*runs, "pretrain-countdown"]:
            assert found[name].info.status == "FINISHED", name
        for name in runs:
            assert "critic/score/mean" in found[name].data.metrics, name
            assert found[name].data.tags["rspo.key"] == f"train/{name}"
        report = found["report"]
        assert report.data.tags[f"runs/{FIG}"] == ", ".join(runs)
        arts = {a.path for a in client.list_artifacts(report.info.run_id, "figures")}
        assert {f"figures/{FIG}.png", f"figures/{FIG}.pdf"} <= arts


TIME_LIMITED = """
rule train:
    output: "run/final.json"
    log: "train.log"
    resources: mem_mb=2000, runtime=1
    shell:
        "{PYTHON} -m rspo launch --processes 2 train {ARGS} --no-mlflow --quiet "
        '--time-limit-min "${{{{SLURM_JOB_ID:+{{resources.runtime}}}}}}" --stop-margin-min 1 > {{log}} 2>&1'
"""


@pytest.mark.slow
def test_a_train_job_stops_before_its_time_limit_and_the_resubmitted_jobs_finish_the_run(slurm, tmp_path):
    """A SLURM job of one minute (runtime=1) whose run needs more, in two data-parallel ranks through
    `rspo launch` (the paper presets' launch): with a margin of the whole minute, each job trains one
    step, writes a checkpoint and exits 75 before the limit, the launcher passes 75 on (torchrun alone
    exits 1, which Snakemake cannot tell from a crash); `--retries` resubmits it, each attempt resumes,
    and the run ends with the metrics of the same run made in one go in one process."""
    import json

    from dist_runs import MEASURED, assert_same_metrics
    from tiny_moe import make_train_assets, train_args

    assets = make_train_assets(tmp_path / "assets")
    sets = ("schedule.total_steps=3", "schedule.ckpt_every=1", "schedule.val_every=0")
    ref = subprocess.run(
        [
            sys.executable,
            "-m",
            "rspo",
            "train",
            *train_args(assets, tmp_path / "ref", ROOT / "configs" / "smoke.yaml", *sets),
            "--no-mlflow",
            "--quiet",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ref.returncode == 0, ref.stderr[-3000:]
    work = tmp_path / "wf"
    work.mkdir()
    (work / "cluster").symlink_to(ROOT / "cluster")
    args = " ".join(train_args(assets, work / "run", ROOT / "configs" / "smoke.yaml", *sets))
    (work / "Snakefile").write_text(TIME_LIMITED.format(PYTHON=sys.executable, ARGS=args))
    r = _snakemake(work, "--profile", "cluster", "--jobs", "1", "--retries", "5", timeout=900)
    assert r.returncode == 0, r.stdout[-4000:]
    jobs = sorted((work / "logs" / "slurm" / "rule_train").glob("*.log"))  # one per SLURM job
    stopped = [p for p in jobs if "returned non-zero exit status 75" in p.read_text()]
    assert len(jobs) == 3 and len(stopped) == 2, [p.read_text()[-1500:] for p in jobs]  # 3 steps: 3 jobs
    rows = [
        {k: v for k, v in json.loads(x).items() if not k.startswith(MEASURED)}
        for x in (work / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    want = [
        {k: v for k, v in json.loads(x).items() if not k.startswith(MEASURED)}
        for x in (tmp_path / "ref" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in rows] == [r["step"] for r in want] == [1, 2, 3]
    # two ranks sum in another order: float reduction order (a share over a threshold within one unit)
    config = json.loads((tmp_path / "ref" / "config.json").read_text())
    assert_same_metrics(rows, want, config, ignore=("router/cache_bytes",))
    for a, b in zip(rows, want):
        assert a["router/cache_bytes"] == b["router/cache_bytes"] / 2  # each rank caches its half of the rows
    assert json.loads((work / "run" / "run.json").read_text())["world_size"] == 2


def _scontrol_job(job_id: str) -> dict[str, str]:
    """slurmctld's own record of a job (kept MinJobAge seconds after it ends): its key=value fields."""
    out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, check=True).stdout
    return dict(re.findall(r"(\w[\w/:]*)=(\S*)", out))


@pytest.mark.slow
def test_a_gpu_asking_train_job_runs_once_as_one_task_holding_its_gpus(slurm, tmp_path):
    """The smoke preset with its train jobs asking 2 GPUs, 2 threads and 2 data-parallel processes (a
    CPU run: the node declares 2 stand-in GPUs, scripts/slurm_local.sh): one run's train job goes
    through the workflow's train rule and `--profile cluster` to the GPU partition, slurmctld accepts,
    schedules and runs it once as one task holding both GPUs and both CPUs, and `rspo launch`
    starts the two ranks inside it, to the run's final.json. The plugin's default for a job with GPUs
    (a task per GPU) would have asked 2 x 2 CPUs of a 2-CPU node (the next test)."""
    import json

    import yaml

    from rspo.plan import Plan

    work = tmp_path / "wf"
    work.mkdir()
    for name in ("Snakefile", "workflow", "profiles", "envs", "cluster", "tests"):
        (work / name).symlink_to(ROOT / name)
    shutil.copytree(ROOT / "configs", work / "configs")
    preset = yaml.safe_load((ROOT / "configs" / "smoke.yaml").read_text())
    preset["preset"] = "smoke_gpu"
    preset["resources"] = {"train": {"threads": 2, "gpu": 2, "processes": 2, "mem_mb": 4000}}
    (work / "configs" / "smoke_gpu.yaml").write_text(yaml.safe_dump(preset, sort_keys=False))
    run = next(iter(Plan.from_file(work / "configs" / "smoke_gpu.yaml").runs))
    target = f"results/smoke_gpu/runs/{run}/final.json"
    # the run's inputs (data, tokenizer, base model) made here first, without SLURM
    first = _snakemake(work, "--cores", "2", "--config", "preset=smoke_gpu", "--until", "pretrain", "--", target)
    assert first.returncode == 0, first.stdout[-4000:]
    cluster = ("--profile", "cluster", "--jobs", "1", "--config", "preset=smoke_gpu")
    r = _snakemake(work, *cluster, "--", target, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:]
    assert "Auto-selected partition 'gpu'" in r.stdout  # a GPU job goes to the partition with GPUs
    out = work / "results" / "smoke_gpu" / "runs" / run
    assert json.loads((out / "final.json").read_text())["steps"] > 0
    assert json.loads((out / "run.json").read_text())["world_size"] == 2  # two ranks inside the one task
    jobs = sorted((work / "logs" / "slurm" / "rule_train").glob("**/*.log"))
    assert len(jobs) == 1, jobs  # one SLURM job, run once
    job = _scontrol_job(jobs[0].stem)
    assert job["JobState"] == "COMPLETED" and job["Partition"] == "gpu", job
    assert job["NumTasks"] == "1" and job["NumCPUs"] == "2" and job["NumNodes"] == "1", job
    assert job["TresPerJob"] == "gres:gpu:2", job


ONE_TASK_PER_GPU = """
rule a:
    output: "a.txt"
    threads: {cpus}
    resources: mem_mb=200, runtime=5, gpu=2, nodes=1{tasks}
    shell: "echo $SLURM_JOB_ID ${{{{CUDA_VISIBLE_DEVICES:-none}}}} > {{output}}"
"""


@pytest.mark.slow
def test_a_gpu_job_asking_a_task_per_gpu_is_refused_for_cpus_the_node_lacks(slurm, tmp_path):
    """What a user met before the rules set tasks_per_gpu=0: a job asking 2 GPUs and all the node's
    CPUs, left to the plugin's default (--ntasks-per-gpu=1), asks twice the node's CPUs and SLURM
    refuses it at submission with the message Snakemake shows; the same job as one task runs."""
    cpus = os.cpu_count()
    (tmp_path / "cluster").symlink_to(ROOT / "cluster")
    for tasks, ok in (("", False), (", tasks_per_gpu=0", True)):
        (tmp_path / "a.txt").unlink(missing_ok=True)
        (tmp_path / "Snakefile").write_text(ONE_TASK_PER_GPU.format(cpus=cpus, tasks=tasks))
        r = _snakemake(tmp_path, "--profile", "cluster", "--jobs", "1", "--retries", "0")
        if ok:
            assert r.returncode == 0, r.stdout[-4000:]
            assert (tmp_path / "a.txt").read_text().split()[1] == "0,1"  # both GPUs in the one task
        else:
            assert r.returncode != 0
            assert "Requested node configuration is not available" in r.stdout, r.stdout[-4000:]
