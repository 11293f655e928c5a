"""`python -m rspo sweep STEP SWEEP.yaml ...`: the steps of a regime search, each one Snakemake job of
`workflow/rules/trials.smk` (`make trials TRIALS=SWEEP.yaml`, or `snakemake trials --config
trials=SWEEP.yaml`), which plans them, runs them in parallel or under a SLURM profile, and resumes:

    base   SWEEP NAME --data DIR --tokenizer DIR --threads N    pretrain or install one base
    run    SWEEP --trial T --method M --seed S --data DIR --threads N [--mlflow]   train one run
    row    SWEEP --trial T                                       the trial's line of the record
    record SWEEP --table FILE [--steps FILE]                     trials.jsonl, the tables, the steps

(`rspo.sweep`, whose docstring says what a sweep file holds and what the record records)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rspo import sweep
from rspo.config import ConfigError
from rspo.jsonl import write_atomic
from rspo.sweep_file import load_sweep


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="rspo sweep", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="step", required=True)
    base = sub.add_parser("base", help="pretrain or install one base of the sweep")
    base.add_argument("sweep")
    base.add_argument("name")
    base.add_argument("--data", required=True, help="the preset's Countdown data folder (pretraining reads it)")
    base.add_argument("--tokenizer", required=True, help="the preset's tokenizer folder")
    base.add_argument("--threads", type=int, default=1, help="torch threads of the pretraining")
    run = sub.add_parser("run", help="train one run of a trial")
    run.add_argument("sweep")
    run.add_argument("--trial", required=True, help="the trial's name in the sweep file")
    run.add_argument("--method", required=True, help="one of the trial's methods, e.g. gmpo+freeze")
    run.add_argument("--seed", type=int, required=True, help="one of that method's seeds in the trial")
    run.add_argument("--data", required=True, help="the preset's Countdown data folder (train.jsonl, val.jsonl)")
    run.add_argument("--threads", type=int, default=1, help="torch threads of the run")
    run.add_argument("--mlflow", action="store_true", help="track the run in the preset's MLflow store")
    row = sub.add_parser("row", help="write a finished trial's line of the record")
    row.add_argument("sweep")
    row.add_argument("--line", required=True, help="<position>-<name> of the trial in the file, e.g. 00-r5a")
    record = sub.add_parser("record", help="write the record: trials.jsonl, the Markdown tables, the steps")
    record.add_argument("sweep")
    record.add_argument("--table", required=True, help="the Markdown trial and gate tables")
    record.add_argument("--steps", default=None, help="pack every run's per-step metrics into this tar.xz")
    args = ap.parse_args(argv)
    try:
        spec = load_sweep(args.sweep)
        if args.step == "base":
            sweep.ensure_base(spec, args.name, Path(args.data), Path(args.tokenizer), args.threads)
        elif args.step == "run":
            trial = spec.trial(args.trial)
            runs = {run for t in spec.trials if t.name == args.trial for run in t.methods()}
            if (args.method, args.seed) not in runs:
                raise sweep.SweepError(f"trial {args.trial!r} has no run {args.method} seed {args.seed}")
            sweep.train_run(spec, trial, args.method, args.seed, Path(args.data), args.threads, args.mlflow)
        elif args.step == "row":
            if args.line not in spec.lines():
                raise sweep.SweepError(f"no line {args.line!r}; the file's are {spec.lines()}")
            row = sweep.trial_row(spec, spec.lines().index(args.line))
            write_atomic(sweep.row_path(spec, args.line), json.dumps(row) + "\n")  # NaN kept: a 1-seed SD
        else:
            sweep.write_record(spec, args.table, args.steps)
    except (sweep.SweepError, ConfigError, RuntimeError) as e:
        print(f"rspo sweep: {e}", file=sys.stderr)
        return 2
    return 0
