"""`python -m rspo evaluate countdown|math|code`: score a checkpoint, write JSON, log to MLflow
(`rspo.evaluate.run`: the settings, the evaluation and its MLflow run; its docstring says what is
scored and how)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from rspo.commands import refuse_missing, respell
from rspo.evaluate import run
from rspo.preset import Preset

FAMILIES = ("countdown", "math", "code")


def build_parser(family: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=f"rspo evaluate {family}")
    ap.add_argument("--preset", required=True, help="configs/<p>.yaml or a preset name")
    ap.add_argument("--model", required=True, help="checkpoint folder (or hub id)")
    ap.add_argument("--out", required=True, help="output JSON")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--temperature", type=float, default=None, help="sampling temperature (default: the preset's eval)")
    ap.add_argument("--samples", dest="n", type=int, default=None, help="samples per prompt (was --n)")
    ap.add_argument("--limit", type=int, default=None, help="problems per benchmark/split (0 = all)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="response budget (default: the preset's eval)")
    ap.add_argument("--seed", type=int, default=None, help="sampling seed (math/code; default the preset's, else 0)")
    ap.add_argument("--backend", default=None, help="hf | vllm (default: the preset's rl.rollout.backend)")
    ap.add_argument("--no-mlflow", action="store_true", help="write the JSON only, no MLflow run")
    ap.add_argument("--quiet", action="store_true", help="no progress bar / progress lines")
    if family == "countdown":
        ap.add_argument("--data", required=True, help="the generated Countdown folder")
        ap.add_argument("--splits", nargs="+", default=None, help="splits to score (default: the preset's eval)")
    else:
        ap.add_argument("--benchmarks", nargs="+", default=None, help="benchmarks to score (default: the preset's)")
    if family == "code":
        ap.add_argument(
            "--data-dir",
            default=None,
            help="a folder `rspo fetch-data code` filled: its benchmarks are read there, not from the network",
        )
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = list(argv or [])
    if not argv or argv[0] not in FAMILIES:
        print(
            f"usage: python -m rspo evaluate {{{'|'.join(FAMILIES)}}} --preset P --model DIR --out FILE ...",
            file=sys.stderr,
        )
        return 2
    family = argv[0]
    args = build_parser(family).parse_args(respell(f"evaluate {family}", argv[1:], {"--n": "--samples"}))
    from rspo.models import set_threads
    from rspo.tracking import model_label

    set_threads(args.threads)
    preset = Preset.load(args.preset)
    flags = {k: getattr(args, k, None) for k in ("temperature", "n", "limit", "max_new_tokens", "backend")}
    if family == "countdown":  # a split's problems: `size` (`limit` its earlier spelling, which size outranks)
        flags["size"] = flags.pop("limit")
    else:
        flags["seed"] = args.seed
    flags.update({k: getattr(args, k, None) for k in ("splits", "benchmarks") if getattr(args, k, None)})
    settings, engine = run.evaluation_settings(preset, family, {k: v for k, v in flags.items() if v is not None})
    inputs: list = [(args.model, "model")]
    if family == "countdown":
        splits = tuple(f"{s}.jsonl" for s in settings.splits)
        inputs.append((args.data, "countdown", splits))
    if refuse_missing(f"evaluate {family}", inputs):
        return 2
    t0 = time.time()
    progress = run.PhaseProgress(f"eval {family} {model_label(args.model)}", args.quiet)
    datasets: list[tuple[str, str]] = []
    if family == "countdown":
        fmt = preset.rl().data.prompt_format
        result = run.evaluate_countdown(args.model, args.data, settings, engine, fmt, progress)
        datasets = [(str(Path(args.data) / f"{s}.jsonl"), "evaluation") for s in result["splits"]]
    else:
        result = run.evaluate_suite(family, args.model, settings, engine, progress, getattr(args, "data_dir", None))
    result["wall_time_s"] = time.time() - t0
    from rspo.jsonl import write_json_atomic

    write_json_atomic(result, args.out)
    if not args.no_mlflow:
        run.log_evaluation(preset, family, args.model, result, datasets)
    summary = (
        {s: r["accuracy"] for s, r in result["splits"].items()}
        if family == "countdown"
        else {"average": result.get("average")}
    )
    print(json.dumps(summary))
    return 0
