"""rspo.train.time_limit and a run that stops before its job's limit: the trainer stops at a step
boundary when the next step and a save would overrun the deadline (or a signal asks), writes a
checkpoint, and `rspo train` exits with 75; the same command resumes and ends with the metrics of an
uninterrupted run. Every job makes one step at least. Through a local SLURM cluster: tests/test_slurm.py."""

import os
import signal
import time

from dist_runs import MEASURED
from test_train import digit_task, make_cfg, read_metrics
from tiny_moe import make_train_assets

from rspo.distributed import Dist
from rspo.train.time_limit import EXIT_TIME_LIMIT, TimeLimit
from rspo.train.trainer import Trainer


def test_the_deadline_counts_the_next_step_and_a_save():
    assert not TimeLimit(Dist()).must_stop()  # no limit, no signal: never (and no collective)
    tl = TimeLimit(Dist(), limit_s=100.0, margin_s=10.0)
    tl.record_step(30.0)
    assert not tl.must_stop()  # now + 30 + 30 (a save not yet seen counts as a step) < 90
    tl.record_save(40.0)
    tl.deadline = time.monotonic() + 60.0
    assert tl.must_stop()  # 30 + 40 > 60
    watched = TimeLimit(Dist())
    watched.watch(signal.SIGUSR1)
    assert not watched.must_stop()
    os.kill(os.getpid(), signal.SIGUSR1)
    assert watched.must_stop()
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)


def test_a_run_stopped_before_its_limit_resumes_to_the_uninterrupted_run(tmp_path):
    assets = make_train_assets(tmp_path / "assets")
    cfg = make_cfg(assets, algo="gmpo", router_shift=True)
    Trainer(cfg, tmp_path / "ref", task=digit_task()).run()
    stops = []
    for _ in range(5):
        # a limit of 1 ms from the job's start: every step overruns, one step per job
        tr = Trainer(cfg, tmp_path / "run", task=digit_task(), job_limit=(1e-3, 0.0))
        final = tr.run()
        stops.append(final.get("stopped"))
        if "stopped" not in final:
            break
    assert stops == ["time limit", None]  # total_steps 2: one step per job, then the run ends
    a = [{k: v for k, v in r.items() if not k.startswith(MEASURED)} for r in read_metrics(tmp_path / "ref")]
    b = [{k: v for k, v in r.items() if not k.startswith(MEASURED)} for r in read_metrics(tmp_path / "run")]
    assert a == b
    assert (tmp_path / "run" / "final.json").is_file()
    assert EXIT_TIME_LIMIT == 75


def test_the_deadline_is_counted_from_the_jobs_start():
    """SLURM's end time where it exports one, else its start time plus the limit, else the start of
    the job's process plus the limit: start-up comes out of the job's limit."""
    from rspo.train.time_limit import job_deadline, job_process_start

    now = time.time()
    assert job_deadline(0.0, 60.0, {"SLURM_JOB_END_TIME": str(int(now + 600))}) == (None, "")  # no limit: none
    at = 1999996500.0  # 100 s into a one-hour job
    env = {"SLURM_JOB_END_TIME": "2000000000", "SLURM_JOB_START_TIME": "1999996400"}
    end, src = job_deadline(3600.0, 60.0, env, now=at)
    assert (end, src) == (2000000000 - 60.0, "SLURM's end time of the job")
    start, src = job_deadline(3600.0, 60.0, {"SLURM_JOB_START_TIME": "1999996400"}, now=at)
    assert (start, src) == (1999996400 + 3600.0 - 60.0, "SLURM's start time of the job")
    proc, src = job_deadline(3600.0, 60.0, {})
    assert src == "the start of the job's process" and proc == job_process_start() + 3540.0
    assert job_process_start() <= now
    # a job that spent 95 of its 100 s starting: 5 s are left, a 10 s step does not fit
    tl = TimeLimit.for_job(Dist(), 100.0, 0.0, {"SLURM_JOB_START_TIME": str(int(now - 95))})
    assert tl.remaining_s() < 6 and tl.counted_from == "SLURM's start time of the job"
    tl.record_step(10.0)
    assert tl.must_stop()


def test_an_end_or_start_time_that_cannot_be_this_jobs_is_ignored_with_a_warning(caplog):
    """A stale or foreign SLURM time (an end in the past or beyond now + the limit, a start in the
    future) is not taken as is: one warning line names it, and the next source counts."""
    import logging

    from rspo.train.time_limit import job_deadline, job_process_start

    at = 1999996500.0
    cases = [
        ({"SLURM_JOB_END_TIME": str(int(at - 10)), "SLURM_JOB_START_TIME": "1999996400"}, "in the past", "start time"),
        ({"SLURM_JOB_END_TIME": str(int(at + 7200))}, "beyond now + the job's limit", "process"),
        ({"SLURM_JOB_START_TIME": str(int(at + 60))}, "in the future", "process"),
    ]
    for env, why, fallback in cases:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="rspo.train.time_limit"):
            deadline, src = job_deadline(3600.0, 60.0, env, now=at)
        assert len(caplog.records) == 1 and why in caplog.text and "ignored" in caplog.text
        assert fallback in src
        if fallback == "process":
            assert deadline == job_process_start() + 3540.0


def _train(assets, out, *launch, env=None, limit_min=0.01, mlflow=False):
    """`python <launch> train ...` on the tiny assets (2 steps, a checkpoint each) with a time limit of
    ``limit_min`` minutes and no margin (tracked in MLflow when ``mlflow``: give MLFLOW_TRACKING_URI)."""
    import subprocess
    import sys
    from pathlib import Path

    from tiny_moe import train_args

    root = Path(__file__).resolve().parents[1]
    sets = ("schedule.total_steps=2", "schedule.ckpt_every=1", "schedule.val_every=0")
    args = train_args(assets, out, root / "configs" / "smoke.yaml", *sets, threads=2)
    cmd = [sys.executable, *launch, "train", *args, *([] if mlflow else ["--no-mlflow"]), "--quiet"]
    cmd += ["--time-limit-min", str(limit_min)]
    cmd += ["--stop-margin-min", "0"]
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "LOCAL_"))}
    return subprocess.run(cmd, cwd=root, env={**full_env, **(env or {})}, capture_output=True, text=True, timeout=300)


def test_a_slow_start_counts_against_the_jobs_limit(tmp_path):
    """A job whose start-up already took its limit (SLURM's start time 100 s ago, a limit of 100 s):
    it makes its one step, saves and exits 75, where a deadline counted from the first step (the
    earlier behaviour) would have let the tiny run finish both steps well inside 100 s and exit 0."""
    assets = make_train_assets(tmp_path / "assets")
    slow = {"SLURM_JOB_START_TIME": str(int(time.time() - 100))}
    r = _train(assets, tmp_path / "run", "-m", "rspo", env=slow, limit_min=100 / 60)
    assert r.returncode == EXIT_TIME_LIMIT, r.stderr[-3000:]
    assert "start-up" in r.stderr and "SLURM's start time of the job" in r.stderr
    assert not (tmp_path / "run" / "final.json").exists()


def test_rspo_launch_passes_a_time_limit_stop_on_as_75_where_torchrun_exits_1(tmp_path):
    assets = make_train_assets(tmp_path / "assets")
    plain = _train(
        assets, tmp_path / "plain", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "rspo"
    )
    assert plain.returncode == 1  # torchrun: "ChildFailedError", exit 1, for ranks that stopped at the limit
    r = _train(assets, tmp_path / "run", "-m", "rspo", "launch", "--processes", "2")
    assert r.returncode == EXIT_TIME_LIMIT, r.stderr[-3000:]
    assert "rspo launch: train ended with exit 75" in r.stderr
    assert (tmp_path / "run" / "checkpoints" / "step_000001").is_dir()  # it saved before it stopped


SLOW_END = """
import os
if os.environ.get("RANK") == "0":  # rank 0 of a torchrun job: its MLflow end takes 4 s
    import time
    from rspo import tracking
    _end = tracking.Tracker.end
    def slow_end(self, *a, **k):
        time.sleep(4)
        return _end(self, *a, **k)
    tracking.Tracker.end = slow_end
"""


def test_a_stop_at_the_limit_ends_the_mlflow_run_before_any_rank_exits(tmp_path):
    """Two ranks through `rspo launch`, rank 0's tracker slow to end (a sitecustomize patch in the
    ranks' processes): torchrun's agent SIGTERMs the other ranks at the first exit 75, so a rank 1 that
    left at once killed rank 0 inside its end and the run stayed RUNNING. The run is KILLED, tagged with
    the step it stopped at, and rank 0 prints its last line."""
    from mlflow.tracking import MlflowClient

    assets = make_train_assets(tmp_path / "assets")
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SLOW_END)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {"MLFLOW_TRACKING_URI": uri, "PYTHONPATH": f"{hook}:{os.environ.get('PYTHONPATH', '')}"}
    r = _train(assets, tmp_path / "run", "-m", "rspo", "launch", "--processes", "2", env=env, mlflow=True)
    assert r.returncode == EXIT_TIME_LIMIT, r.stderr[-3000:]
    assert '"steps": 1, "stopped": "time limit"' in r.stdout  # rank 0 lived to print its last line
    client = MlflowClient(uri)
    runs = [run for e in client.search_experiments() for run in client.search_runs([e.experiment_id])]
    assert len(runs) == 1 and runs[0].info.status == "KILLED", [x.info.status for x in runs]
    assert runs[0].data.tags["stopped_at_step"] == "1" and runs[0].data.tags["stopped"] == "time limit"


def test_a_resumed_run_removes_the_save_a_killed_job_left(tmp_path):
    assets = make_train_assets(tmp_path / "assets")
    cfg = make_cfg(assets, algo="gmpo", router_shift=True)
    tr = Trainer(cfg, tmp_path / "run", task=digit_task(), job_limit=(1e-3, 0.0))
    assert tr.run().get("stopped") == "time limit"
    left = tmp_path / "run" / "checkpoints" / ".tmp_step_000002"  # a save killed halfway
    (left / "state").mkdir(parents=True)
    (left / "state" / "__0_0.distcp").write_bytes(b"x" * 1024)
    Trainer(cfg, tmp_path / "run", task=digit_task())
    assert not left.exists() and (tmp_path / "run" / "checkpoints" / "step_000001").is_dir()
