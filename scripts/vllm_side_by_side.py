"""RL runs of one preset run with rollout.backend=hf and =vllm, same seed, side by side.

    .venv-vllm/bin/python scripts/vllm_side_by_side.py --preset configs/small.yaml --run gmpo-rs0.8-s0 \\
        --base-model results/small/models/base --data results/small/data/countdown --steps 20 --out results/vllm_sbs

Runs `python -m rspo train` once per backend (one after the other, --threads each), then prints a
table of the training reward and the held-out greedy score per step for both, and each run's
rollout tokens/s (the trainer's perf/rollout_tokens_per_s: response tokens of a step's rollout over
its wall time), weight-sync time and wall time. Needs the vLLM venv (make venv-vllm). The two
samplers differ (Gumbel-max streams vs vLLM's), so the curves are not expected to be equal.
``--tables side_by_side.json`` prints the tables of a finished comparison (docs/results/vllm) again."""

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
    ap.add_argument("--preset")
    ap.add_argument("--run")
    ap.add_argument("--base-model")
    ap.add_argument("--data", help="folder with train.jsonl and val.jsonl")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--val-every", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out")
    ap.add_argument("--reuse", action="store_true", help="keep a backend's finished run from an earlier call")
    ap.add_argument("--tables", metavar="JSON", help="print the tables of a side_by_side.json this wrote; run nothing")
    args = ap.parse_args(argv)
    if args.tables:
        data = json.loads(Path(args.tables).read_text())
        print(tables(data["metrics"], {b: s["wall_s"] for b, s in data["summary"].items()}), end="")
        return 0
    missing = [
        f"--{k.replace('_', '-')}" for k in ("preset", "run", "base_model", "data", "out") if not getattr(args, k)
    ]
    if missing:
        ap.error(f"a comparison needs {', '.join(missing)} (or --tables JSON)")
    res = {b: run(args, b) for b in ("hf", "vllm")}
    metrics = {b: rows for b, (rows, _) in res.items()}
    print(tables(metrics, {b: wall for b, (_, wall) in res.items()}), end="")
    Path(args.out, "side_by_side.json").write_text(
        json.dumps({"summary": summaries(metrics, {b: w for b, (_, w) in res.items()}), "metrics": metrics}, indent=1)
    )
    return 0


def summaries(metrics: dict[str, list[dict]], walls: dict[str, float]) -> dict[str, dict[str, float]]:
    """Per backend: mean training reward, median rollout tokens/s, rollout and weight-sync s per step, wall s."""
    out = {}
    for b, rows in metrics.items():
        steps = [r for r in rows if REWARD in r]
        out[b] = {
            "mean_reward": statistics.mean(r[REWARD] for r in steps),
            "rollout_tokens_per_s": statistics.median(r["perf/rollout_tokens_per_s"] for r in steps),
            "rollout_s": statistics.median(r["perf/rollout_s"] for r in steps),
            "sync_s": statistics.median(r["perf/sync_s"] for r in steps),
            "wall_s": walls[b],
        }
    return out


def tables(metrics: dict[str, list[dict]], walls: dict[str, float]) -> str:
    """The per-step table (training reward, held-out score per backend) and the per-backend summary."""
    by_step = {b: {r["step"]: r for r in rows} for b, rows in metrics.items()}
    fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    lines = ["| step | reward hf | reward vllm | val hf | val vllm |", "|---|---|---|---|---|"]
    for step in sorted(set(by_step["hf"]) | set(by_step["vllm"])):
        h, v = by_step["hf"].get(step, {}), by_step["vllm"].get(step, {})
        lines.append(
            f"| {step} | {fmt(h.get(REWARD))} | {fmt(v.get(REWARD))} | "
            f"{fmt(h.get(val_score()))} | {fmt(v.get(val_score()))} |"
        )
    lines += [
        "",
        "| backend | mean reward | rollout tokens/s (median) | rollout s/step (median) | sync s (median) | wall s |",
        "|---|---|---|---|---|---|",
    ]
    for b, s in summaries(metrics, walls).items():
        lines.append(
            f"| {b} | {s['mean_reward']:.3f} | {s['rollout_tokens_per_s']:.0f} | {s['rollout_s']:.2f} | "
            f"{s['sync_s']:.4f} | {s['wall_s']:.0f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
