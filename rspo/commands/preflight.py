"""`python -m rspo preflight --preset P`: a preset's real training step on one node, cut to a few
layers, measured per phase beside the plan (`rspo.gpu_memory.preflight`, whose docstring says how).
It runs where the preset trains: on a GPU node for a `model.device: cuda` preset (without a GPU it
names `rspo plan-memory`, which plans the same phases on any machine).
With ``--stage`` (internal) it runs one stage in this process or rank: the library launches the two
stages through this command."""

from __future__ import annotations

import argparse
import json
import sys

from rspo.commands import add_overrides
from rspo.config import ConfigError, load_preset
from rspo.gpu_memory import preflight
from rspo.gpu_memory.plan import GPUS, PlanError


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="rspo preflight", description=preflight.__doc__.split("\n\n")[0])
    ap.add_argument("--preset", required=True, help="configs/<p>.yaml or a preset name")
    ap.add_argument("--task", default=None, help="the preset's task to measure (default: its first)")
    ap.add_argument("--layers", type=int, default=2, help="decoder layers of the model measured (default 2)")
    add_overrides(ap, "rl override, as rspo train --set")
    ap.add_argument(
        "--hub-dir", default="results/hub", help="where fetched hub models are (their config.json; default results/hub)"
    )
    ap.add_argument(
        "--gpu-gib",
        type=float,
        default=GPUS["h100-80gb"],
        help="the GPU memory (GiB, as CUDA reports it) of the plan printed beside the measurement when the "
        "step runs on the CPU (a preset with model.device: cpu); on a GPU node the GPU itself is planned for "
        "(default an H100 80GB)",
    )
    ap.add_argument("--out", default=None, help="a scratch folder (default: a temporary one)")
    ap.add_argument("--stage", choices=preflight.STAGES, default=None, help=argparse.SUPPRESS)
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    from rspo.plan import Plan

    try:
        plan = Plan(load_preset(args.preset))
    except (ConfigError, FileNotFoundError) as e:
        print(f"rspo preflight: {e}", file=sys.stderr)
        return 2
    args.task = args.task or next(iter(plan.tasks))
    if args.stage:  # one stage, in this process (or this rank)
        preflight.run_stage(args.stage, args)
        return 0
    try:  # what the stages read, checked here so that a missing model or GPU is one line, not a rank's traceback
        from rspo.gpu_memory.simulate import task_inputs

        cfg, _, _ = task_inputs(args.preset, args.task, args.hub_dir, args.layers, args.overrides)
    except (ConfigError, PlanError, FileNotFoundError) as e:
        print(f"rspo preflight: {e}", file=sys.stderr)
        return 2
    if cfg.model.device == "cuda":
        from rspo.gpu_memory.driver import gpu_check

        usable, line = gpu_check()
        if not usable:
            print(
                f"rspo preflight: the preset trains on GPUs (model.device: cuda) and {line}. preflight runs the "
                f"real step on a GPU node; without one (a login node, a laptop), `python -m rspo plan-memory "
                f"--preset {args.preset} --gpu h100-80gb` plans every phase's memory on the CPU",
                file=sys.stderr,
            )
            return 2
        print(f"rspo preflight: {line}", flush=True)
    world = max(1, int(plan.resources("train")["processes"]))
    i = argv.index("--out") if "--out" in argv else len(argv)
    passed = argv[:i] + argv[i + 2 :]  # the stages get their own --out
    try:
        result = preflight.run_stages(args, world, passed)
    except RuntimeError as e:
        print(str(e), file=sys.stderr)
        return 1
    print(
        f"rspo preflight: {result['preset']} on {result['device']} ({result['engine']}), model cut to "
        f"{result['layers']} of {result['full_layers']} layers; GiB per phase, measured and scaled to the "
        f"full depth, beside the plan:"
    )
    for ph, got in result["measured"].items():
        plan_v = result["planned"].get(ph)
        print(f"  {ph:16s} measured {got:8.2f}   planned {plan_v if plan_v is not None else '-':>8}")
    verdict = "fits" if result["fits"] else "does NOT fit"
    print(
        f"  step {result['step_s_estimate']} s (estimated at full depth"
        + (
            f": training {result['train_s_estimate']} s measured and scaled + rollout at least "
            f"{result['rollout_s_floor']} s, the stand-in decoding nothing"
            if result.get("rollout_s_floor") is not None
            else ""
        )
        + f"), run {result['run_h_estimate']} h; "
        f"{verdict} ({result['margin_gib']} GiB to spare of {result['limit_gib']})"
    )
    if result.get("update_mfu"):
        m = result["update_mfu"]
        print(
            f"  update at {result['layers']} layers: {m['update_tflops']:.3g} TFLOP/s of model FLOPs per GPU, "
            f"MFU {m['update_mfu']:.1%} of the dense bf16 peak"
        )
    gate = result["parity"]
    if not gate["checked"]:
        print(
            "  parity: NOT CHECKED: "
            + (
                "the stand-in engine decodes nothing and has no log-probs (vLLM is not installed here); install "
                "the GPU stack (pip install -e '.[gpu]') and run this preflight again to compare the engine with "
                "the trainer"
                if result["engine"].startswith("stand-in")
                else f"the {result['engine']} engine reported no log-probs; the engine was not compared with the "
                "trainer"
            )
        )
    else:
        agree = gate["routing_agreement"]
        print(
            f"  parity: engine-trainer k3 KL {gate['k3_kl']:.3g} (gate {gate['threshold']}), routing agreement "
            + ("not reported by this engine" if agree is None else f"{agree:.4f}")
            + ("; passes" if gate["ok"] else "; REFUSED")
        )
    print(json.dumps(result))
    if not gate["ok"]:
        print(
            f"rspo preflight: the engine does not run the model the trainer trains: k3 KL {gate['k3_kl']:.3g} "
            f"> {gate['threshold']} (check the weight sync, the engine's dtype and kernels before any GPU hour)",
            file=sys.stderr,
        )
        return 3
    return 0
