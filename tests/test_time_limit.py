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
        tr = Trainer(cfg, tmp_path / "run", task=digit_task())
        tr.time_limit = TimeLimit(tr.dist, limit_s=1e-3)  # every step overruns: one step per job
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
