"""A whole RL run around the trainer's step (rspo.train.trainer): the MLflow run and the run
folder's identity, the optional validation at step 0, the loop over steps (validation every
``schedule.val_every`` steps, one metrics row per step, collapse detection, checkpoints every
``schedule.ckpt_every`` steps), the final checkpoint and final.json, and the stop before a job's
time limit (rspo.train.time_limit). ``Trainer.run`` calls ``run``.
"""

from __future__ import annotations

import time
from typing import Any

from rspo.models import read_meta
from rspo.progress import Progress, train_progress_metrics


def run_info(t) -> dict[str, Any]:
    a = t.cfg.algorithm
    return {
        "run_name": t.cfg.run_name,
        "preset": t.cfg.preset,
        "task": t.cfg.data.task,
        "algo": a.algo,
        "router_shift": a.router_shift,
        "gamma_min": a.gamma_min,
        "stop_gradient": a.stop_gradient,
        "routing": a.routing,
        "seed": t.cfg.seed,
        "fingerprint": t.cfg.fingerprint(),
    }


def log(t, metrics: dict[str, float], step: int) -> None:
    """Every rank holds the same (reduced) metrics; rank 0 writes them."""
    row = {"step": step, **{k: float(v) for k, v in metrics.items()}}
    t._last_logged.update(row)
    if not t.dist.is_main:
        return
    t.folder.append_metrics(row)
    if t.tracker is not None:
        t.tracker.log_metrics(metrics, step)


def stop_for_time_limit(t, info: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """Save (unless this step's checkpoint exists) and return before the job's time limit."""
    saved = t.folder.latest_checkpoint()
    if saved is None or saved != t.folder.step_dir(t.step):
        t.save_checkpoint()
    progress.write(f"[train {t.cfg.run_name}] stopped at step {t.step} before the job's time limit; resubmit to resume")
    progress.close()
    if t.tracker:
        t.tracker.end("KILLED")
    return {**info, "stopped": "time limit", "steps": t.step}


def run(t) -> dict[str, Any]:
    cfg = t.cfg
    main = t.dist.is_main
    run_id = t.resumed_run_id  # the checkpoint, if any, was restored when the trainer was built
    info = run_info(t)
    if t.tracker_factory is not None and main:
        t.tracker = t.tracker_factory(
            run_id=run_id,
            run_name=cfg.run_name,
            params=cfg.flat_params(),
            tags={
                **{k: str(v) for k, v in info.items() if k != "fingerprint"},
                "rspo.fingerprint": info["fingerprint"],
            },
        )
    info["mlflow_run_id"] = t.tracker.run_id if t.tracker else None
    if t.dist.enabled:
        info["world_size"] = t.dist.world_size
    if main:
        t.folder.write_identity({**info, "collapsed": t.collapse.fired}, cfg.to_dict())
    if t.tracker:
        t.tracker.log_artifact(t.out / "config.json")
    sc = cfg.schedule
    # rank 0 shows a bar on a terminal, one line per step in a log (rspo.progress)
    progress = Progress(f"train {cfg.run_name}", sc.total_steps, initial=t.step, quiet=t.quiet, enabled=main, every=1)
    val_names = list(t.rollouts.val_records)
    try:
        if t.step == 0 and sc.val_every and t.rollouts.val_records:
            val0 = t.validate()
            log(t, val0, 0)
            progress.update(0, train_progress_metrics(val0, val_names), force=True)
        first = t.step
        while t.step < sc.total_steps:
            # the next step and a save would overrun the job's limit (each job makes one step at least)
            if t.step > first and t.time_limit.must_stop():
                return stop_for_time_limit(t, info, progress)
            t_step = time.perf_counter()
            metrics = t.train_step()
            t.step += 1
            fired = t.collapse.update(t.step, metrics)
            metrics["train/collapse"] = float(t.collapse.fired)
            if fired:
                progress.write(f"[train {cfg.run_name}] collapse detected at step {t.collapse.step}")
                if t.tracker:
                    t.tracker.set_tag("collapse", "true")
                    t.tracker.set_tag("collapse_step", t.collapse.step)
            if t.rollouts.val_records and sc.val_every and (t.step % sc.val_every == 0 or t.step == sc.total_steps):
                metrics.update(t.validate())
            log(t, metrics, t.step)
            progress.update(
                t.step,
                train_progress_metrics(metrics, val_names),
                force=any(k.startswith("val/") for k in metrics),
            )
            t.time_limit.record_step(time.perf_counter() - t_step)
            if sc.ckpt_every and (t.step % sc.ckpt_every == 0) and t.step < sc.total_steps:
                t.save_checkpoint()
        t.save_final({**read_meta(cfg.model.path), "run": info})
    except BaseException as e:
        progress.close()
        if t.tracker:
            t.tracker.end("KILLED" if isinstance(e, KeyboardInterrupt) else "FAILED")
        raise
    progress.close()
    # the whole file: a resumed run's earlier steps are in it, not in memory
    last = t.folder.last_metrics() if main else dict(t._last_logged)
    final = {
        **info,
        "collapsed": t.collapse.fired,
        "collapse_step": t.collapse.step,
        "collapse_kind": t.collapse.kind,
        "steps": t.step,
        "final_metrics": last,
    }
    if main:
        t.folder.write_identity({**info, "collapsed": t.collapse.fired})
        path = t.folder.write_final(final)
        if t.tracker:
            t.tracker.log_artifact(path)
    if t.tracker:
        t.tracker.end("FINISHED")
    t.dist.barrier()  # final.json exists before any rank returns
    return final
