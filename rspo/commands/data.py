"""The data commands: ``python -m rspo generate`` (Countdown splits) and ``python -m rspo prepare
math|code`` (normalised math/code training records as JSONL).

    python -m rspo generate --out data/countdown --preset configs/small.yaml --workers 2
    python -m rspo prepare math --out data/math/train.jsonl --source hub            # DeepScaleR
    python -m rspo prepare math --out data/math/train.jsonl --source fallback --limit 2000 --seed 0
    python -m rspo prepare code --out data/code/train.jsonl --source hub            # DeepCoder mix
    python -m rspo prepare code --out data/code/train.jsonl --source some_file.jsonl

``generate``: the preset's top-level ``countdown:`` mapping gives the defaults of the generator
(rspo.data.countdown.CountdownConfig), flags override them; writes ``{split}.jsonl`` and
``meta.json`` (last), prints a JSON summary line.

``prepare --source``: ``hub`` (pinned hub revisions, network), ``fallback`` (offline generated set,
see rspo.data.math / rspo.data.code) or a local file in an upstream schema. Records are validated
and written atomically (temporary file + rename), so an interrupted run leaves no partial output.
A summary (record count, per-source counts, dropped rows) is printed as one JSON line on stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from rspo.data.countdown import CountdownConfig, generate
from rspo.jsonl import write_jsonl_atomic

# ---------------------------------------------------------------------------------------
# prepare


def build_prepare_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="rspo prepare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("task", choices=["math", "code"], help="which training set")
    ap.add_argument("--out", required=True, help="output JSONL file")
    ap.add_argument("--source", default="hub", help="hub | fallback | path to a local data file (default hub)")
    ap.add_argument("--limit", type=int, default=None, help="at most this many records (fallback: exactly this many)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the fallback generator / of the hub subsample")
    ap.add_argument("--n-fallback", type=int, default=2000, help="fallback size when --limit is not given")
    ap.add_argument("--revision", default=None, help="math hub: DeepScaleR revision (default: the pinned one)")
    ap.add_argument(
        "--sources", default=None, help="code hub: comma-separated subset of primeintellect,taco,lcbv5,leetcode"
    )
    ap.add_argument("--cutoff", default=None, help="code: keep problems dated before this day (default 2024-08-01)")
    ap.add_argument("--max-cases", type=int, default=None, help="code: keep at most this many tests per problem")
    return ap


def prepare_main(argv: list[str] | None = None) -> int:
    args = build_prepare_parser().parse_args(argv)
    if args.limit is not None and args.limit < 1:
        print("rspo prepare: --limit must be >= 1", file=sys.stderr)
        return 2
    stats: Counter = Counter()
    try:
        if args.task == "math":
            from rspo.tasks import math

            recs = math.prepare(
                args.source, limit=args.limit, seed=args.seed, n_fallback=args.n_fallback, revision=args.revision
            )
        else:
            from rspo.tasks import code

            sources = None if not args.sources else [s.strip() for s in args.sources.split(",") if s.strip()]
            recs = code.prepare(
                args.source,
                limit=args.limit,
                seed=args.seed,
                n_fallback=args.n_fallback,
                sources=sources,
                cutoff=args.cutoff,
                max_cases=args.max_cases,
                stats=stats,
            )
    except (FileNotFoundError, ValueError) as e:
        print(f"rspo prepare: {e}", file=sys.stderr)
        return 2
    if not recs:
        print(f"rspo prepare: no {args.task} records from source {args.source!r}", file=sys.stderr)
        return 2
    n = write_jsonl_atomic(args.out, recs)
    summary = {
        "task": args.task,
        "out": str(args.out),
        "records": n,
        "by_source": dict(Counter(r["source"] for r in recs)),
        "stats": dict(stats),
    }
    print(json.dumps(summary))
    return 0


# ---------------------------------------------------------------------------------------
# generate

_CLI_KEYS = [f.name for f in dataclasses.fields(CountdownConfig)]


def _countdown_section(path: str) -> dict:
    from rspo.preset import Preset

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"preset not found: {p}")
    preset = Preset.load(p)
    if not preset.has("countdown"):
        raise ValueError(f"preset {p} has no top-level 'countdown:' mapping")
    section = preset.section("countdown")
    if not isinstance(section, dict):
        raise ValueError(f"preset {p}: 'countdown' must be a mapping, got {type(section).__name__}")
    unknown = sorted(set(section) - set(_CLI_KEYS))
    if unknown:
        raise ValueError(
            f"preset {p}: unknown key(s) in 'countdown': {', '.join(map(str, unknown))} "
            f"(allowed: {', '.join(_CLI_KEYS)})"
        )
    return section


def build_generate_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m rspo generate",
        description="Generate Countdown splits (train, val, val_target) as JSONL + meta.json.",
    )
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--preset", help="YAML preset; its top-level 'countdown:' mapping gives defaults")
    types = {f.name: (float if f.name == "heldout_target_frac" else int) for f in dataclasses.fields(CountdownConfig)}
    for name in _CLI_KEYS:
        default = CountdownConfig.__dataclass_fields__[name].default
        ap.add_argument(
            f"--{name.replace('_', '-')}", dest=name, type=types[name], default=None, help=f"(default {default})"
        )
    ap.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    ap.add_argument("--quiet", action="store_true", help="no progress bar / progress lines")
    ap.add_argument(
        "--no-traces",
        dest="traces",
        action="store_false",
        help="omit search_path/optimal_path/rating/search_type (rebuilt on demand by "
        "format_completion); ~10x smaller and faster for 4 numbers",
    )
    return ap


def generate_main(argv: list[str] | None = None) -> int:
    parser = build_generate_parser()
    args = parser.parse_args(argv)
    values: dict[str, Any] = {}
    try:
        if args.preset:
            values.update(_countdown_section(args.preset))
        for name in _CLI_KEYS:
            if getattr(args, name) is not None:
                values[name] = getattr(args, name)
        if args.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {args.workers}")
        cfg = CountdownConfig(**values)
    except (ValueError, FileNotFoundError) as e:
        parser.error(str(e))  # exits with status 2 and the message on stderr
    t0 = time.perf_counter()
    meta = generate(cfg, args.out, workers=args.workers, traces=args.traces, progress=not args.quiet)
    summary = {"out": str(args.out), "counts": meta["counts"], "seconds": round(time.perf_counter() - t0, 2)}
    print(json.dumps(summary))
    return 0
