"""The Countdown evaluation's resolution before and after a change of its size: each checkpoint's
held-out accuracy with its sampling SD over problems, and each pair's paired-difference SD
(McNemar: the evaluation noise the claims table floors its intervals at), on two evaluation sets
of the same checkpoints. Reads `rspo evaluate countdown` outputs; the measures are the report's own
(rspo.report.measures.pooled_accuracy, rspo.report.inference.mcnemar_sd).

    python scripts/eval_resolution.py --label before=/tmp/eval800 --label after=results/small/eval \\
        --checkpoint base --checkpoint grpo-s0 --checkpoint gmpo-s0 [--out table.md]

Each ``--label NAME=DIR`` is a folder holding ``<checkpoint>/countdown.json`` for every checkpoint.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

from rspo.report.inference import mcnemar_sd
from rspo.report.measures import pooled_accuracy


def rows(labels: dict[str, Path], checkpoints: list[str]) -> list[str]:
    out = [
        "| evaluation | problems | checkpoint or pair | accuracy or difference (points) | SD (points) |",
        "|---|---|---|---|---|",
    ]
    for label, folder in labels.items():
        measured = {}
        for ck in checkpoints:
            path = folder / ck / "countdown.json"
            splits = list(json.loads(path.read_text())["splits"])
            measured[ck] = pooled_accuracy(path, splits)
        n = len(next(iter(measured.values())).samples)
        for ck, m in measured.items():
            out.append(f"| {label} | {n} | {ck} | {m.value:.2f} | {m.noise:.2f} |")
        for a, b in itertools.combinations(checkpoints, 2):
            diff = measured[b].value - measured[a].value
            sd = mcnemar_sd(measured[b].samples, measured[a].samples)
            out.append(f"| {label} | {n} | {b} - {a} | {diff:+.2f} | {sd:.2f} |")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--label", action="append", required=True, help="NAME=DIR: an evaluation set's outputs")
    ap.add_argument("--checkpoint", action="append", required=True, help="a checkpoint's folder name under DIR")
    ap.add_argument("--out", help="write the table here as well")
    args = ap.parse_args()
    labels = {}
    for item in args.label:
        name, sep, folder = item.partition("=")
        if not sep or not name or not folder:
            ap.error(f"--label {item!r}: expected NAME=DIR")
        labels[name] = Path(folder)
    text = "\n".join(rows(labels, args.checkpoint)) + "\n"
    print(text, end="")
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
