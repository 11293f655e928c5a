"""`python -m rspo tokenizer --out DIR`: build the Countdown tokenizer (`rspo.tokenizer`) and save
it; with `--data`, check that it round-trips a split and report its tokens per example."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rspo.tokenizer import save_tokenizer, token_stats, tokenizer_fingerprint


def main(argv: list[str] | None = None) -> int:
    from rspo.data.countdown import STYLES

    ap = argparse.ArgumentParser(
        prog="python -m rspo tokenizer",
        description="Build the Countdown tokenizer and save it with save_pretrained.",
    )
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument(
        "--style",
        default="steps",
        choices=STYLES,
        help="text style whose token counts are reported with --data (default steps)",
    )
    ap.add_argument("--data", help="optional split JSONL: check round-trips, report tokens/example")
    ap.add_argument("--limit", type=int, default=10_000, help="records of --data to check")
    args = ap.parse_args(argv)
    tok = save_tokenizer(args.out)
    summary = {"out": str(args.out), "vocab_size": len(tok), "fingerprint": tokenizer_fingerprint(tok)}
    if args.data:
        try:
            summary.update(token_stats(tok, Path(args.data), args.style, args.limit))
        except (ValueError, FileNotFoundError) as e:
            print(f"rspo tokenizer: {e}", file=sys.stderr)
            return 2
    print(json.dumps(summary))
    return 0
