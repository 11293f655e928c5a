"""RL runs of one preset run with rollout.backend=hf and =vllm, same seed, side by side.

    .venv-vllm/bin/python scripts/vllm_side_by_side.py --preset configs/small.yaml --run gmpo-rs0.8-s0 \\
        --base-model results/small/models/base --data results/small/data/countdown --steps 20 --out results/vllm_sbs

Runs `python -m rspo train` once per backend (one after the other, --threads each), then prints a
table of the training reward and the held-out greedy score per step for both, and each run's
rollout tokens/s (the trainer's perf/rollout_tokens_per_s: response tokens of a step's rollout over
its wall time), weight-sync time and wall time. Needs the vLLM venv (make venv-vllm). The two
samplers differ (Gumbel-max streams vs vLLM's), so the curves are not expected to be equal."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rspo.run_record import REWARD, Steps, val_score


def run(args, backend: str) -> tuple[list[dict], float]:
    out = Path(args.out) / backend
    done = out / "wall_s.txt"
    if args.reuse and done.is_file():  # a finished run of an earlier call
        return _rows(out), float(done.read_text())
    data = Path(args.data)
    cmd = [sys.executable, "-m", "rspo", "train", "--preset", args.preset, "--run-name", args.run]
    cmd += ["--base-model", args.base_model, "--train-data", str(data / "train.jsonl")]
    cmd += ["--val", f"val={data / 'val.jsonl'}", "--out", str(out), "--threads", str(args.threads)]
    cmd += ["--no-mlflow", "--quiet"]
    for s in (
        f"rollout.backend={backend}",
        f"schedule.total_steps={args.steps}",
        f"schedule.val_every={args.val_every}",
        "schedule.ckpt_every=0",
    ):
        cmd += ["--set", s]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"{backend} run failed:\n{p.stderr[-4000:]}")
    done.write_text(f"{wall:.3f}")
    return _rows(out), wall


def _rows(out: Path) -> list[dict]:
    """A run's per-step metrics, one row per step (rspo.run_record)."""
    return [{"step": step, **row} for step, row in Steps.parse(out / "metrics.jsonl").rows.items()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", required=True)
    ap.add_argument("--run", required=True)
    ap.add_argument("--base-model", required=True)
    ap.add_argument("--data", required=True, help="folder with train.jsonl and val.jsonl")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--val-every", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", required=True)
    ap.add_argument("--reuse", action="store_true", help="keep a backend's finished run from an earlier call")
    args = ap.parse_args(argv)
    res = {b: run(args, b) for b in ("hf", "vllm")}
    by_step = {b: {r["step"]: r for r in rows} for b, (rows, _) in res.items()}
    fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    print("| step | reward hf | reward vllm | val hf | val vllm |")
    print("|---|---|---|---|---|")
    for step in sorted(set(by_step["hf"]) | set(by_step["vllm"])):
        h, v = by_step["hf"].get(step, {}), by_step["vllm"].get(step, {})
        print(
            f"| {step} | {fmt(h.get(REWARD))} | {fmt(v.get(REWARD))} | "
            f"{fmt(h.get(val_score()))} | {fmt(v.get(val_score()))} |"
        )
    print()
    print("| backend | mean reward | rollout tokens/s (median) | rollout s/step (median) | sync s (median) | wall s |")
    print("|---|---|---|---|---|---|")
    summary = {}
    for b, (rows, wall) in res.items():
        steps = [r for r in rows if REWARD in r]
        s = {
            "mean_reward": statistics.mean(r[REWARD] for r in steps),
            "rollout_tokens_per_s": statistics.median(r["perf/rollout_tokens_per_s"] for r in steps),
            "rollout_s": statistics.median(r["perf/rollout_s"] for r in steps),
            "sync_s": statistics.median(r["perf/sync_s"] for r in steps),
            "wall_s": wall,
        }
        summary[b] = s
        print(
            f"| {b} | {s['mean_reward']:.3f} | {s['rollout_tokens_per_s']:.0f} | {s['rollout_s']:.2f} | "
            f"{s['sync_s']:.4f} | {wall:.0f} |"
        )
    Path(args.out, "side_by_side.json").write_text(
        json.dumps({"summary": summary, "metrics": {b: rows for b, (rows, _) in res.items()}}, indent=1)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
