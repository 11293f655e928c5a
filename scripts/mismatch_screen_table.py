"""The tables of docs/results/small-mismatch from a screen's run folders (scripts/mismatch_screen.sh)
or from the runs.json this writes beside them.

    python scripts/mismatch_screen_table.py results/small/mismatch-screen [--json runs.json]
    python scripts/mismatch_screen_table.py docs/results/small-mismatch/runs.json

Per run: validation accuracy at the last step and at step 0, training reward over the last 10 steps,
k3 KL and routing agreement over all steps, seconds a step. Per method: mean +- sample sd over seeds;
against GMPO, the per-seed difference (paired by seed) with a 95% t-interval, "inconclusive" when it
includes 0."""

from __future__ import annotations

import argparse
import json
import math
import statistics as st
from pathlib import Path

from rspo.run_record import MISMATCH_KL, REWARD, ROUTING_AGREEMENT, STEP_S, Steps, val_score

METHODS = [("gmpo", "GMPO"), ("rspo", "RSPO (GMPO+RS)"), ("tis", "GMPO+TIS"), ("r3", "R3"), ("rstis", "RSPO+TIS")]
T975 = {2: 4.303, 3: 3.182, 4: 2.776}  # two-sided 95% t quantiles by degrees of freedom


def run_summary(folder: Path) -> dict:
    steps = Steps.parse(folder / "metrics.jsonl")
    val = steps.at(val_score())
    last = max(val)
    return {
        "val": val[last],
        "val0": val[0],
        "last_step": last,
        "reward": st.mean(steps.values(REWARD, after=last - 10)),
        "k3_kl": st.mean(steps.values(MISMATCH_KL)),
        "routing_agreement": st.mean(steps.values(ROUTING_AGREEMENT)),
        "step_s": st.mean(steps.values(STEP_S)),
    }


def mean_sd(xs: list[float], fmt: str = "%.3f") -> str:
    if len(xs) < 2:
        return fmt % xs[0] if xs else "-"
    return f"{fmt % st.mean(xs)} +- {fmt % st.stdev(xs)}"


def tables(runs: dict[str, dict]) -> str:
    seeds = sorted({int(name.rsplit("-s", 1)[1]) for name in runs})
    by = {m: [runs[f"{m}-s{s}"] for s in seeds if f"{m}-s{s}" in runs] for m, _ in METHODS}
    out = [
        "| method | n | val acc. (last step) | train reward (last 10 steps) | k3 KL | routing agreement | s/step |",
        "|---|---|---|---|---|---|---|",
    ]
    for m, label in METHODS:
        d = by[m]
        out.append(
            f"| {label} | {len(d)} | {mean_sd([x['val'] for x in d])} | {mean_sd([x['reward'] for x in d])} | "
            f"{mean_sd([x['k3_kl'] for x in d], '%.1e')} | {mean_sd([x['routing_agreement'] for x in d], '%.4f')} | "
            f"{mean_sd([x['step_s'] for x in d], '%.1f')} |"
        )
    out += [
        "",
        "| against GMPO (paired by seed) | val acc. difference [95% CI] | | train reward difference [95% CI] | |",
        "|---|---|---|---|---|",
    ]
    for m, label in METHODS[1:]:
        pairs = [(runs[f"{m}-s{s}"], runs[f"gmpo-s{s}"]) for s in seeds if f"{m}-s{s}" in runs and f"gmpo-s{s}" in runs]
        cells = []
        for key in ("val", "reward"):
            diffs = [a[key] - b[key] for a, b in pairs]
            if len(diffs) < 3:
                cells += [f"n = {len(diffs)}", "-"]
                continue
            mu, h = st.mean(diffs), T975[len(diffs) - 1] * st.stdev(diffs) / math.sqrt(len(diffs))
            verdict = "inconclusive" if mu - h <= 0 <= mu + h else ("higher" if mu > 0 else "lower")
            cells += [f"{mu:+.3f} [{mu - h:+.3f}, {mu + h:+.3f}]", verdict]
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    base = [runs[f"gmpo-s{s}"]["val0"] for s in seeds if f"gmpo-s{s}" in runs]
    per_seed = ", ".join(f"{v:.3f}" for v in base)
    out += ["", f"Validation accuracy at step 0 (the base model, same engine), per seed: {per_seed}"]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", type=Path, help="a screen's folder, or a runs.json")
    ap.add_argument("--json", type=Path, default=None, help="write the per-run summaries here")
    args = ap.parse_args()
    if args.source.suffix == ".json":
        runs = json.loads(args.source.read_text())
    else:
        runs = {p.name: run_summary(p) for p in sorted(args.source.iterdir()) if (p / "done").exists()}
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1, sort_keys=True) + "\n")
    print(tables(runs))


if __name__ == "__main__":
    main()
