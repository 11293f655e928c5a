"""`python -m rspo train`: one RL run from a preset (grid run name) plus overrides.

    python -m rspo train --preset configs/small.yaml --run-name gmpo-rs0.8-s0 \
        --base-model results/small/models/base --train-data results/small/data/countdown/train.jsonl \
        --val val=results/small/data/countdown/val.jsonl --out results/small/runs/gmpo-rs0.8-s0

Rerunning the same command after a kill resumes from the last checkpoint into the same MLflow run;
a folder that holds a run with another config is refused.

Data parallel: launch the same command under torchrun, e.g.
``torchrun --standalone --nproc-per-node 2 -m rspo train ...`` (gloo on CPU, NCCL on GPUs). The
run is named by ``--run-name``: torchrun's own parser reads every argument, also those after the
script, and takes ``--run`` for an abbreviation of its ``--run-path`` ("ambiguous option"), so no
option of a command launched under torchrun may be a prefix of one of torchrun's
(tests/test_commands.py runs torchrun's parser on each). ``--run``, the earlier spelling, still
works where no torchrun reads it, with a message. The
model is sharded with FSDP2, ``--threads`` is the job's total and is split over the processes,
and rank 0 writes the run folder and the MLflow run. An error on one rank stops every rank within
seconds; the log names the failing rank, the step and the error (rspo.distributed.fail_together).

Jobs longer than a cluster allows: with ``--time-limit-min`` (the train rule passes its SLURM
runtime) the run stops before the limit, counted from the job's start, writes a checkpoint and
exits with code 75; the rule's retries resubmit it and it resumes (rspo.train.time_limit). SIGUSR1
sent to the process asks for the same stop.
On GPUs the process sets ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (rollout and
training alternate on one GPU; the engine is built, slept and woken with it off:
rspo.rollout.colocate) and ``NCCL_NVLS_ENABLE=0`` (NVLink SHARP buffers cost GPU memory per
communicator) unless they are set already (rspo.distributed.gpu_environment).

Progress (rank 0; off with ``--quiet``): a bar on a terminal, else one line per step in the log,
``[train <run>] step 12/80 (15%) elapsed 0:00:14 eta 0:01:19 s/step 1.12 reward 0.531 val - ...``
(rspo.progress). The MLflow run records the training and validation files as dataset inputs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from rspo.commands import add_overrides, refuse_missing, respell


def _minutes(text: str) -> float:
    """A time limit in minutes; empty is none (the train rule passes its runtime only under SLURM)."""
    return float(text) if text.strip() else 0.0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="rspo train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--preset", required=True, help="configs/<preset>.yaml")
    ap.add_argument(
        "--run-name",
        dest="run",
        default=None,
        help="a run name of the preset's grid (e.g. gmpo-rs0.8-s0); without it the run is named by its overrides",
    )
    ap.add_argument("--base-model", default=None, help="base checkpoint folder or hub id (sets model.path)")
    ap.add_argument(
        "--other-base",
        action="store_true",
        help="train from a Countdown base other than the one the preset pins (base_model:), e.g. a sweep's trial base",
    )
    ap.add_argument("--train-data", default=None, help="training JSONL (sets data.train_path)")
    ap.add_argument("--val", action="append", default=[], metavar="NAME=FILE", help="held-out set (repeatable)")
    ap.add_argument("--out", required=True, help="run folder")
    add_overrides(ap, "override, e.g. --set algorithm.gamma_min=0.5 --set schedule.total_steps=10")
    ap.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads of the job, split over torchrun processes (sets model.threads)",
    )
    ap.add_argument(
        "--time-limit-min",
        type=_minutes,
        default=0.0,
        help="the job's wall-clock limit: stop (checkpoint, exit 75) before it, to be resubmitted (0/empty: none)",
    )
    ap.add_argument(
        "--stop-margin-min", type=float, default=5.0, help="with --time-limit-min: minutes kept free at the end"
    )
    ap.add_argument("--no-mlflow", action="store_true", help="write metrics.jsonl only")
    ap.add_argument(
        "--tracking-key",
        default=None,
        help="the MLflow run's rspo.key (default train/<run name>); a regime-search trial's run names its trial",
    )
    ap.add_argument("--quiet", action="store_true", help="no progress bar / progress lines")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(
        respell("train", list(sys.argv[1:] if argv is None else argv), {"--run": "--run-name"})
    )
    from rspo.distributed import gpu_environment

    gpu_environment()  # harmless on a CPU: nothing reads them there
    from rspo.config import ConfigError
    from rspo.grid import load_train_config
    from rspo.preset import Preset
    from rspo.tracking import Tracker, default_tracking_uri

    overrides = list(args.overrides)
    if args.base_model:
        overrides.append(f"model.path={json.dumps(args.base_model)}")
    if args.train_data:
        overrides.append(f"data.train_path={json.dumps(args.train_data)}")
    if args.val:
        vals = {}
        for item in args.val:
            if "=" not in item:
                print(f"rspo train: --val expects NAME=FILE, got {item!r}", file=sys.stderr)
                return 2
            k, v = item.split("=", 1)
            vals[k] = v
        overrides.append(f"data.val_paths={json.dumps(vals)}")
    if args.threads:
        from rspo.distributed import Dist

        overrides.append(f"model.threads={max(1, args.threads // Dist.from_env().world_size)}")
    try:
        preset = Preset.load(args.preset)  # once: the run's config, the base's pin, the MLflow experiment
        cfg = load_train_config(preset, args.run, overrides)
    except (ConfigError, FileNotFoundError) as e:
        print(f"rspo train: {e}", file=sys.stderr)
        return 2
    inputs = [(cfg.model.path, "model"), (cfg.data.train_path, "data")]
    if refuse_missing("train", inputs + [(p, "data") for p in cfg.data.val_paths.values()]):
        return 2
    if cfg.data.task == "countdown" and os.path.isdir(cfg.model.path) and not args.other_base:
        from rspo import base_pin

        try:  # a preset that pins its base trains from that base only (a resumed run included)
            base_pin.check(preset, cfg.model.path)
        except ConfigError as e:
            print(f"rspo train: {e}", file=sys.stderr)
            return 2

    from rspo.gpu_memory.plan import planned_phases
    from rspo.train.time_limit import EXIT_TIME_LIMIT, job_process_start
    from rspo.train.trainer import Trainer

    factory = None
    if not args.no_mlflow:
        from rspo.tracking import experiment_name

        preset_name = preset.name
        uri = cfg.tracking.tracking_uri or default_tracking_uri(preset_name)
        experiment = experiment_name(preset, cfg.tracking.experiment)

        def factory(**kw):
            tracker = Tracker(
                uri,
                experiment,
                source="rspo train",
                key=args.tracking_key or f"train/{cfg.run_name}",
                preset=preset_name,
                **kw,
            )
            files = [(cfg.data.train_path, "training")] + [(p, "validation") for p in cfg.data.val_paths.values()]
            tracker.log_datasets([(p, c) for p, c in files if Path(p).is_file()])
            return tracker

    from rspo.distributed import Dist, fail_together

    trainer = None
    # under torchrun, an error on one rank ends every rank promptly, the failing one named in the log
    with fail_together(Dist.from_env(), "rspo train", lambda: f"at step {trainer.step}" if trainer else "at start"):
        try:
            trainer = Trainer(
                cfg,
                args.out,
                tracker_factory=factory,
                quiet=args.quiet,
                memory_plan=planned_phases,
                # stop cleanly before the job's limit, counted from the job's start, or at SIGUSR1
                job_limit=(args.time_limit_min * 60, args.stop_margin_min * 60),
                started=job_process_start(),  # the run's start-up counts from the job's process start
            )
        except ConfigError as e:  # e.g. a batch that does not split over the torchrun processes
            print(f"rspo train: {e}", file=sys.stderr)
            return 2
        if trainer.dist.is_main:
            left = trainer.time_limit.remaining_s()
            deadline = (
                "" if left is None else f"; stops by {left / 60:.1f} min from now ({trainer.time_limit.counted_from})"
            )
            print(
                f"[train {cfg.run_name}] start-up {time.time() - job_process_start():.0f} s{deadline}", file=sys.stderr
            )
        final = trainer.run()
    if trainer.dist.is_main:
        print(json.dumps({k: final[k] for k in ("run_name", "steps", "collapsed", "stopped") if k in final}))
    if trainer.dist.enabled:
        import torch.distributed as tdist

        tdist.destroy_process_group()
    return EXIT_TIME_LIMIT if final.get("stopped") else 0
