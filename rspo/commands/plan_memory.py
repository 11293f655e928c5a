"""`python -m rspo plan-memory`: what one GPU (and one node's host memory) holds in each phase of a
preset's training step, term by term with its formula, checked against a GPU's memory before any
GPU hour is spent (rspo.gpu_memory.plan; the simulation: rspo.gpu_memory.simulate).

    python -m rspo plan-memory --preset configs/paper_large_math.yaml --gpu h100-80gb
    python -m rspo plan-memory --preset configs/paper_small.yaml --gpu-gib 40
    python -m rspo plan-memory --preset configs/paper_large_math.yaml --simulate [--layers 4]
    python -m rspo plan-memory --preset configs/paper_large_math.yaml --gpu-gib 40 --set model.cpu_offload=true

It prints its verdict first, in words: whether the preset fits, its peak phase and by how much it
is over or under, when it does not fit each setting not already at its limit planned alone and
ranked by the GiB it saves, saying when only CPU offload or more GPUs can help and what fits
(rspo.gpu_memory.advice), and the host memory per node against ``resources.train.mem_mb``. ``--set``
tries a setting and ``--gpus`` a GPU count without editing the preset. Then, per task of the preset
and per phase (resume, engine start, rollout, old pass, update,
optimizer step, sync, KV wake, checkpoint save, evaluation), each term in GiB with its formula,
then the floor of each run's rollout time on a named GPU (rspo.gpu_memory.rollout_time: decoding at
the memory-bandwidth roof, full-length responses), then one JSON line: ``{"preset", "gpu", "fits",
"peak_gib", "peak_phase", "peak_task", "limit_gib", "phases": {phase: GiB}, "host_peak_gib", ...,
"rollout_s_floor": {task: s}, "advice", "budget"}``, the budget line before it: what the
preset's runs cost (rspo.gpu_memory.budget: jobs x GPUs x hours, GPU-hours, disk, host memory per
node). ``--simulate`` also runs the trainer's own step on
fake tensors (rspo.gpu_memory.simulate; torchrun presets) and prints each phase's simulated peak
beside the plan's tensor terms; the JSON line then carries ``"simulated": {phase: GiB}`` and
``"planned_tensors": {phase: GiB}`` (the same phases; with ``--layers`` both are of the model cut to
that many decoder layers, which takes seconds instead of minutes). The workflow runs the plan before
submitting any job of a preset with ``device: cuda`` (workflow/rules/common.smk).

Exit status: 0 when the preset fits, 1 when it does not (the JSON line is printed either way), 2 for
a malformed preset or an unknown GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from rspo.commands import add_overrides
from rspo.config import ConfigError
from rspo.gpu_memory.advice import rank
from rspo.gpu_memory.budget import budget, budget_line
from rspo.gpu_memory.plan import GPUS, PlanError, plan_preset
from rspo.gpu_memory.rollout_time import rollout_time
from rspo.gpu_memory.verdict import render, summary, verdict
from rspo.preset import Preset

AGREEMENT = 0.05  # --simulate: a phase whose plan and simulation differ by more is named


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="rspo plan-memory", description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", required=True, help="configs/<preset>.yaml")
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--gpu", default="h100-80gb", help=f"one of {', '.join(GPUS)} (default h100-80gb)")
    group.add_argument("--gpu-gib", type=float, default=None, help="any other GPU: its memory in GiB")
    ap.add_argument("--hub-dir", default="results/hub", help="where fetched hub models are (their config.json)")
    ap.add_argument("--json-only", action="store_true", help="print the JSON line alone")
    ap.add_argument(
        "--simulate",
        action="store_true",
        help="also run the trainer's own step on fake tensors (rspo.gpu_memory.simulate; torchrun presets)",
    )
    ap.add_argument("--layers", type=int, default=0, help="--simulate: cut the model to this many decoder layers")
    add_overrides(ap, "try a setting without editing the preset: an rl override, as rspo train --set")
    ap.add_argument(
        "--gpus", type=int, default=0, help="the train job's GPUs (data-parallel ranks) instead of the preset's"
    )
    args = ap.parse_args(argv)
    if args.gpu_gib is not None:
        gpu, gib = f"{args.gpu_gib:g}gib", args.gpu_gib
    elif args.gpu in GPUS:
        gpu, gib = args.gpu, GPUS[args.gpu]
    else:
        print(
            f"rspo plan-memory: unknown GPU {args.gpu!r}; choose one of {', '.join(GPUS)} or give --gpu-gib",
            file=sys.stderr,
        )
        return 2

    try:
        plans = plan_preset(args.preset, gib, args.hub_dir, overrides=args.overrides, gpus=args.gpus)
        s = summary(Preset.load(args.preset).name, gpu, plans)
        if not s["fits"]:  # what would fit: each setting not at its limit, ranked by GiB saved
            s["advice"] = rank(args.preset, gib, args.hub_dir, args.overrides, args.gpus, plans)
    except (PlanError, ConfigError, FileNotFoundError) as e:
        print(f"rspo plan-memory: {e}", file=sys.stderr)
        return 2
    s["budget"] = budget(args.preset, plans, args.gpus, gpu if gpu in GPUS else "")
    rollouts = [(p, rollout_time(p, gpu)) for p in plans]
    s["rollout_s_floor"] = {}
    for p, r in rollouts:
        if r is not None and math.isfinite(r.seconds):
            s["rollout_s_floor"][p.task] = max(s["rollout_s_floor"].get(p.task, 0.0), round(r.seconds, 1))
    if not args.json_only:
        print(verdict(s))
        print(render(plans))
        said = set()
        for p, r in rollouts:  # runs whose rollout is the same are said once, under the first's name
            if r is not None and (p.task, r) not in said:
                said.add((p.task, r))
                print(f"task {p.task} (run {p.run}) {r.line()}")
    if args.simulate:
        if max(p.setup.world for p in plans) < 2:
            print("simulate: this preset trains in one process; run `rspo preflight` on a GPU instead", file=sys.stderr)
        else:
            from rspo.gpu_memory.simulate import simulated_beside_plan

            s.update(simulated_beside_plan(args.preset, gib, args.hub_dir, args.layers))
            cut = f" (model cut to {args.layers} layers)" if args.layers else ""
            print(f"simulate{cut}: phase, plan's tensor terms, the trainer's step on fake tensors (GiB)")
            for ph, got in s["simulated"].items():
                plan = s["planned_tensors"][ph]
                off = (got - plan) / plan if plan else 0.0
                flag = "" if abs(off) <= AGREEMENT else f"  <- differs by {off:+.1%}"
                print(f"  {ph:16s} {plan:8.2f} {got:8.2f} {off:+7.1%}{flag}")
    if not args.json_only:
        print(budget_line(s["budget"]))
        print(verdict(s))  # again under the terms, where a terminal leaves the reader
    print(json.dumps(s))
    return 0 if s["fits"] else 1
