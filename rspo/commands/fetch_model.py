"""`python -m rspo fetch-model --model ORG/NAME --out DIR`: fetch a hub model once into a local
folder (the workflow's `fetch_model` rule; offline, from the hub cache). The fetching is
`rspo.hub.fetch_model`."""

from __future__ import annotations

import argparse
import json
import sys

from rspo.hub import ModelFetchError, fetch_model, is_hub_id


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="rspo fetch-model",
        description="Fetch a hub model once into a local model folder (offline: from the hub cache).",
    )
    ap.add_argument("--model", required=True, help="hub id, e.g. Qwen/Qwen3-30B-A3B")
    ap.add_argument("--out", required=True, help="the local model folder to make")
    ap.add_argument("--revision", default=None, help="branch, tag or commit (default: main)")
    args = ap.parse_args(argv)
    if not is_hub_id(args.model):
        print(f"rspo fetch-model: {args.model!r} is not a hub id (ORG/NAME)", file=sys.stderr)
        return 2
    try:
        marker = fetch_model(args.model, args.out, args.revision)
    except ModelFetchError as e:
        print(f"rspo fetch-model: {e}", file=sys.stderr)
        return 1
    print(json.dumps({k: marker[k] for k in ("repo_id", "commit", "from", "bytes")}))
    return 0
