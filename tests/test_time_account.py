"""rspo.train.time_account: a run's wall time split into its steps' phases, validation, saves,
start-up and the rest, in final.json and MLflow, summed over the jobs of a resumed run; and
`rspo report time`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_train import digit_task, make_cfg
from tiny_moe import make_train_assets

from rspo.train.run_folder import RunFolder
from rspo.train.time_account import PARTS, TimeAccount
from rspo.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]


def test_the_parts_add_up_to_the_wall_time_and_earlier_jobs_are_added():
    acc = TimeAccount(started=100.0)
    acc.seconds["startup"] = 5.0
    acc.add_step({"perf/rollout_s": 2.0, "perf/reward_s": 0.5, "perf/old_pass_s": 1.0, "perf/update_s": 3.0})
    acc.add("validation", 4.0)
    acc.add("checkpoint", 1.5)
    job = acc.job(now=130.0)
    assert job["wall"] == 30.0 and job["other"] == pytest.approx(30.0 - 17.0)
    assert sum(job[p] for p in PARTS) == pytest.approx(job["wall"])
    later = TimeAccount(started=200.0)
    later.restore(acc.state(now=130.0))
    later.add("validation", 1.0)
    total = later.summary(now=210.0)
    assert total["wall"] == 40.0 and total["validation"] == 5.0 and total["jobs"] == 2
    assert total["steps"] == pytest.approx(6.5) and total["non_step_share"] == pytest.approx(1 - 6.5 / 40)
    with pytest.raises(ValueError, match="unknown part"):
        acc.add("lunch", 1.0)


def test_the_run_folder_keeps_the_account_of_its_newest_save_and_no_other(tmp_path):
    folder = RunFolder(tmp_path / "run", fingerprint="f")
    assert folder.time_account(3) is None
    folder.write_time_account(3, {"seconds": {"wall": 9.0}, "jobs": 1})
    assert folder.time_account(3) == {"seconds": {"wall": 9.0}, "jobs": 1}
    assert folder.time_account(4) is None  # another step's (a save killed before its account was written)
    folder.time_account_path.write_text("{not json")
    assert folder.time_account(3) is None
    folder.write_time_account(3, {"seconds": {}, "jobs": 1})
    folder.reset_metrics()  # a run starting over keeps no account of an earlier attempt
    assert not folder.time_account_path.exists()


def test_a_run_records_its_time_account_in_final_json_and_across_a_resume(tmp_path):
    """Two steps, validation and a checkpoint each step, stopped at a 1 ms limit after step 1 and
    resumed: final.json's account spans both jobs, each part measured, the parts adding up to the wall."""
    assets = make_train_assets(tmp_path / "assets")
    cfg = make_cfg(assets, algo="gmpo", router_shift=True)
    first = Trainer(cfg, tmp_path / "run", task=digit_task(), job_limit=(1e-3, 0.0)).run()
    assert first["stopped"] == "time limit" and first["time_account"]["jobs"] == 1
    final = Trainer(cfg, tmp_path / "run", task=digit_task()).run()
    account = json.loads((tmp_path / "run" / "final.json").read_text())["time_account"]
    assert account == final["time_account"] and account["jobs"] == 2
    assert account["step_update"] > 0 and account["step_rollout"] > 0 and first["time_account"]["checkpoint"] > 0
    assert account["final_save"] > 0 and account["startup"] > 0
    # the first job counts whole, the save that ended it included (time_account.json, written after it)
    assert account["wall"] >= first["time_account"]["wall"] + account["startup"] - first["time_account"]["startup"]
    assert account["checkpoint"] >= first["time_account"]["checkpoint"] > 0
    assert sum(account[p] for p in PARTS) == pytest.approx(account["wall"], rel=1e-3, abs=1e-2)
    r = subprocess.run(
        [sys.executable, "-m", "rspo", "report", "time", "--runs-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("| run | startup | step_rollout") and any(x.startswith("| run | ") for x in lines)
    assert any(x.startswith("| sum |") for x in lines) and "Share of the summed wall time" in r.stdout
