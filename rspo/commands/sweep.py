"""`python -m rspo sweep STEP SWEEP.yaml ...`: the steps of a regime search, each one Snakemake job of
`workflow/rules/trials.smk` (`make trials TRIALS=SWEEP.yaml`, or `snakemake trials --config
trials=SWEEP.yaml`), which plans them, runs them in parallel or under a SLURM profile, and resumes:

    base   SWEEP NAME --data DIR --tokenizer DIR --threads N    pretrain or install one base
    run    SWEEP --trial T --method M --seed S --data DIR --threads N    train one run of a trial
    row    SWEEP --trial T                                       the trial's line of the record
    record SWEEP --table FILE [--steps FILE]                     trials.jsonl, the tables, the steps

(`rspo.sweep`, whose docstring says what a sweep file holds and what the record records)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rspo import sweep


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
    row = sub.add_parser("row", help="write a finished trial's line of the record")
    row.add_argument("sweep")
    row.add_argument("--trial", required=True, help="the trial's name in the sweep file")
    record = sub.add_parser("record", help="write the record: trials.jsonl, the Markdown tables, the steps")
    record.add_argument("sweep")
    record.add_argument("--table", required=True, help="the Markdown trial and gate tables")
    record.add_argument("--steps", default=None, help="pack every run's per-step metrics into this tar.xz")
    args = ap.parse_args(argv)
    try:
        spec = sweep.load_sweep(args.sweep)
        if args.step == "base":
            sweep.ensure_base(spec, args.name, Path(args.data), Path(args.tokenizer), args.threads)
        elif args.step == "run":
            trial = sweep.trial_of(spec, args.trial)
            if (args.method, args.seed) not in sweep.trial_runs(trial):
                raise sweep.SweepError(f"trial {args.trial!r} has no run {args.method} seed {args.seed}")
            sweep.train_run(spec, trial, args.method, args.seed, Path(args.data), args.threads)
        elif args.step == "row":
            path = sweep.row_path(spec, args.trial)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(sweep.trial_row(spec, args.trial)) + "\n")
        else:
            sweep.write_record(spec, args.table, args.steps)
    except (sweep.SweepError, RuntimeError) as e:
        print(f"rspo sweep: {e}", file=sys.stderr)
        return 2
    return 0
