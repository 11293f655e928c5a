"""`python -m rspo pretrain`: next-token SFT of a small MoE from scratch (`rspo.pretrain`, whose
docstring is this command's --help)."""

from __future__ import annotations

import argparse
import sys

from rspo import pretrain
from rspo.commands import add_overrides, refuse_missing
from rspo.config import ConfigError
from rspo.preset import Preset


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="rspo pretrain", description=pretrain.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--preset", required=True, help="configs/<p>.yaml or a preset name")
    ap.add_argument(
        "--task",
        default="countdown",
        choices=["countdown", "math", "code"],
        help="what to pretrain on (default countdown)",
    )
    ap.add_argument("--data", required=True, help="countdown: the generated folder; math/code: train.jsonl")
    ap.add_argument("--tokenizer", default=None, help="tokenizer folder (countdown); math/code train one")
    ap.add_argument("--out", required=True, help="checkpoint folder to write (a rerun resumes from its <out>.work)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    add_overrides(ap, "pretrain override, e.g. examples=1000")
    ap.add_argument("--no-mlflow", action="store_true", help="metrics.jsonl only, no MLflow run")
    ap.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (testing resume)")
    ap.add_argument("--quiet", action="store_true", help="no progress bar / progress lines")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    try:
        preset = Preset.load(args.preset)
        p = pretrain.pretrain_settings(preset, args.overrides)
    except (ConfigError, FileNotFoundError) as e:
        print(f"rspo pretrain: {e}", file=sys.stderr)
        return 2
    inputs: list = [
        (args.data, "countdown", ("train.jsonl", "val.jsonl")) if args.task == "countdown" else (args.data, "data")
    ]
    if args.tokenizer:
        inputs.append((args.tokenizer, "tokenizer", ("tokenizer.json",)))
    if refuse_missing("pretrain", inputs):
        return 2
    job = pretrain.PretrainJob(
        task=args.task,
        data=args.data,
        out=args.out,
        tokenizer=args.tokenizer,
        threads=args.threads,
        mlflow=not args.no_mlflow,
        quiet=args.quiet,
        max_steps=args.max_steps,
    )
    pretrain.run_pretraining(preset, p, job)
    return 0
