"""Rollout speed of the hf and vllm backends on one checkpoint, at the same batch.

    .venv-vllm/bin/python scripts/bench_rollout_vllm.py --model results/small/models/base \\
        --data results/small/data/countdown/train.jsonl --prompts 32 --group 8 --max-new-tokens 48

Loads the model, builds both backends (timing the vLLM engine start: import, engine, first weight
load), then alternates --rounds rollouts of each on the same prompts (temperature 1, different
seeds per round) and times a weight sync into the engine. Prints a table: response tokens/s
(median over rounds) and seconds per rollout of each backend, engine start and sync time. Run it
alone, with one thread (OMP_NUM_THREADS=1, the default here): timings on a shared machine are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="checkpoint folder (rspo pretrain output)")
    ap.add_argument("--data", required=True, help="Countdown JSONL (prompts are its first records)")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None, help="also write the numbers here")
    args = ap.parse_args(argv)
    if args.prompts < 1 or args.group < 1 or args.rounds < 1:
        sys.exit("--prompts, --group and --rounds must be >= 1")
    import torch

    torch.set_num_threads(args.threads)
    from rspo.models import load_model, load_tokenizer_checked
    from rspo.rollout import Sampling, make_backend
    from rspo.tasks import get_task, load_records

    task = get_task("countdown")
    prompts = [task.prompt(r) for r in load_records(task, args.data)[: args.prompts]]
    tok = load_tokenizer_checked(args.model)
    model = load_model(args.model, dtype="float32", device="cpu").eval()
    hf = make_backend("hf", model, tok)
    t0 = time.perf_counter()
    vllm = make_backend("vllm", model, tok, model_path=args.model, dtype="float32")
    engine_s = time.perf_counter() - t0
    warm = Sampling(temperature=1.0, max_new_tokens=args.max_new_tokens, seed=999)
    vllm.generate(prompts[:2], 2, warm)  # first-call overheads out of the timing
    hf.generate(prompts[:2], 2, warm)
    speed: dict[str, list[float]] = {"hf": [], "vllm": []}
    secs: dict[str, list[float]] = {"hf": [], "vllm": []}
    for r in range(args.rounds):
        for name, backend in (("hf", hf), ("vllm", vllm)):
            t = time.perf_counter()
            batch = backend.generate(prompts, args.group, Sampling(1.0, max_new_tokens=args.max_new_tokens, seed=r))
            dt = time.perf_counter() - t
            secs[name].append(dt)
            speed[name].append(batch.num_response_tokens / dt)
    syncs = []
    for _ in range(args.rounds):
        vllm.sync_weights(model)
        syncs.append(vllm.last_sync_s)
    out = {
        "batch": f"{args.prompts} prompts x {args.group}, <= {args.max_new_tokens} new tokens",
        "threads": args.threads,
        "engine_start_s": engine_s,
        "sync_s_median": statistics.median(syncs),
        **{f"{n}_tokens_per_s": statistics.median(v) for n, v in speed.items()},
        **{f"{n}_rollout_s": statistics.median(v) for n, v in secs.items()},
    }
    print(f"rollout of {out['batch']}, {args.threads} thread(s), median of {args.rounds} rounds")
    print("| backend | response tokens/s | s per rollout |")
    print("|---|---|---|")
    for n in ("hf", "vllm"):
        print(f"| {n} | {out[f'{n}_tokens_per_s']:.0f} | {out[f'{n}_rollout_s']:.2f} |")
    print(f"vLLM engine start (incl. import and first weight load): {engine_s:.1f} s")
    print(f"vLLM weight sync (median of {args.rounds}): {1000 * out['sync_s_median']:.0f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
