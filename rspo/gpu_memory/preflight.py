"""`python -m rspo preflight --preset P`: what a cluster user runs on one node before submitting a
preset's jobs: the real training step of the preset, measured.

    python -m rspo preflight --preset configs/paper_large_math.yaml            # on one GPU node
    python -m rspo preflight --preset configs/smoke.yaml --set rollout.backend=vllm --layers 2

It trains the preset's first run of a task for two steps with the real layer shapes, token budget,
batch sizes, engine settings and tensor-parallel size, but with fewer decoder layers (``--layers``,
default 2) and random weights (no download: the model is built from its config.json). The first
step runs in one process (engine start, rollout, old pass, updates, optimizer steps, sync, KV wake,
checkpoint save); a second process resumes from that checkpoint, as a resubmitted job would (the
resume, a new engine, the second step). A preset that trains under torchrun runs both under
torchrun with its processes. The engine is vLLM where it is installed; elsewhere a stand-in engine
that really allocates (and frees on sleep) the share the plan gives vLLM (rspo.rollout.standin), so
the training side can be measured on any GPU machine with torch alone: the output says which.

Each phase's memory is measured as the trainer measures it every step (rspo.phase_memory: on
a GPU torch's peaks plus the driver's view, on a CPU the resident memory) and timed. The per-layer
terms are then scaled to the model's full depth with the plan's formulas (measured at the cut depth +
the plan's difference between the full and the cut model), and printed beside the plan of the full
model. The step's time is scaled by full depth / cut depth (the forwards, the decoding and the sync
grow with the layers; the engine start is left out): a first estimate of a step and of the run
(schedule.total_steps steps; the train rule's job limit and resubmissions: rspo.train.time_limit).
With the stand-in engine, which decodes nothing, the step's rollout is the floor of
rspo.gpu_memory.rollout_time instead (decoding at the GPU's memory bandwidth, full-length
responses; ``rollout_s_floor``), added to the measured training part (``train_s_estimate``).
Parity gate: the steps also measure how far the engine's policy is from the trainer's on the
engine's own samples (``rollout_corr/k3_kl``, the k3 estimate of KL(engine || trainer), and, where
the engine reports its routing, ``rollout_corr/routing_agreement``: rspo.losses.mismatch_metrics).
A mean k3 KL above ``PARITY_KL`` (prime-rl's gate before it trains a new MoE architecture: engine
and trainer KL mismatch below 0.015, its contributor docs; measured there over 20 steps, here over
the preflight's two) means the engine does not run the model the trainer trains (a weight-sync or
a kernel fault, a wrong dtype): the command refuses with a non-zero exit and the numbers.
Deviation from prime-rl's check, and its limit: the preflight's weights are random (no download),
so the policy is close to uniform and only a fault that changes it grossly shows. Measured on the
smoke model through vLLM's CPU build: the engine as built, k3 KL under 1e-3; every weight the
engine loads times (1 + 0.3 N(0, 1)), 0.0015 (passes); times (1 + 3 N(0, 1)), 0.98 (refused). A
subtle mismatch on trained weights is what the runs' own ``rollout_corr/*`` metrics track.

Exit status of ``rspo preflight``: 0 when the step ran (the memory verdict is printed either way),
1 when a stage failed, 2 for a missing input or a malformed preset, 3 when the parity gate refused.

The last line is JSON: ``{"preset", "device", "engine", "layers", "fits", "measured": {phase: GiB},
"planned": {phase: GiB}, "margin_gib", "train_s_estimate", "rollout_s_floor", "step_s_estimate",
"run_h_estimate", "parity": {"k3_kl", "routing_agreement", "threshold", "checked", "ok"},
"update_mfu": {"update_tflops", "update_mfu"} or null}``. The update's model-FLOPs utilisation is
the second step's update at the cut depth (rspo.gpu_memory.flops: model FLOPs of the tokens its
updates processed over its time, against the GPU's dense bf16 peak).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from rspo.backend_capabilities import capabilities
from rspo.run_record import MISMATCH_KL, ROUTING_AGREEMENT

GIB = 2**30
STAGES = ("first", "resume")
PARITY_KL = 0.015
"""The largest mean engine-trainer k3 KL the gate lets through (module docstring)."""
PARITY_KEYS = (MISMATCH_KL, ROUTING_AGREEMENT)


def parity(stage_metrics: list[dict[str, float]]) -> dict[str, Any]:
    """The gate over the steps' metrics: mean k3 KL, the smallest routing agreement (None where the
    engine reported none), the threshold and whether it passes (no k3 KL measured: nothing to refuse)."""
    kl = [m[MISMATCH_KL] for m in stage_metrics if MISMATCH_KL in m]
    agree = [m[ROUTING_AGREEMENT] for m in stage_metrics if ROUTING_AGREEMENT in m]
    mean_kl = sum(kl) / len(kl) if kl else None
    return {
        "k3_kl": mean_kl,
        "routing_agreement": min(agree) if agree else None,
        "threshold": PARITY_KL,
        "checked": mean_kl is not None,
        "ok": mean_kl is None or mean_kl <= PARITY_KL,
    }


def _measured(memory) -> dict[str, float]:
    """{phase: GiB} of what the trainer's PhaseMemory measured (peak on a GPU, resident on a CPU)."""
    out = {}
    for rows in (memory.first or {}, memory.current):
        for ph, row in rows.items():
            value = row.get("peak_gib", row.get("rss_gib"))
            if value is not None:
                out[ph] = max(out.get(ph, 0.0), value)
    return out


def run_stage(stage: str, args) -> None:
    """One process of the preflight (or each rank of it): the first step and a save, or the resume and
    the second step; writes what it measured to <out>/<stage>.rank<r>.json."""
    from rspo.gpu_memory.simulate import model_folder, sim_task, task_inputs
    from rspo.train.policy import Policy
    from rspo.train.trainer import Trainer, process_group

    out = Path(args.out)
    cfg, config, _ = task_inputs(args.preset, args.task, args.hub_dir, args.layers, args.overrides)
    task, records = sim_task(out)
    folder = out / "model"
    if stage == "first":
        model_folder(config, folder)
    cfg = replace(
        cfg,
        model=replace(cfg.model, path=str(folder)),
        data=replace(cfg.data, task="countdown", train_path=str(records), val_paths={}),
        schedule=replace(cfg.schedule, total_steps=2, val_every=0, ckpt_every=0),
    )
    engine = None
    standin = _needs_standin(cfg.rollout.backend)
    if standin:
        engine = _standin_factory(cfg, config)
    policy = Policy(cfg, process_group(cfg), random_weights=True)
    trainer = Trainer(cfg, out / "run", task=task, quiet=True, policy=policy, engine=engine)
    metrics = trainer.train_step()
    if stage == "first":
        trainer.save_checkpoint()
    report = {
        "stage": stage,
        "device": trainer.device.type,
        "engine": "stand-in (vLLM is not installed here)" if standin else cfg.rollout.backend,
        "measured": _measured(trainer.memory),
        "seconds": trainer.memory.last_seconds,
        "parity": {k: metrics[k] for k in PARITY_KEYS if k in metrics},
        # what this rank's updates processed, for the update's model-FLOPs utilisation
        "update_tokens": metrics.get("perf/update_tokens_per_s", 0.0) * metrics.get("perf/update_s", 0.0),
        "update_rows": cfg.schedule.prompts_per_step
        * cfg.rollout.group_size
        * cfg.schedule.ppo_epochs
        / max(1, trainer.dist.world_size),
        "update_s": metrics.get("perf/update_s", 0.0),
    }
    (out / f"{stage}.rank{trainer.dist.rank}.json").write_text(json.dumps(report))
    trainer.dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # an in-process engine is not torn down in order; nothing is left to write


def _needs_standin(backend: str) -> bool:
    """An engine whose package is not installed here (vLLM on a machine without it): the stand-in."""
    import importlib.util

    package = capabilities(backend).package
    return package is not None and importlib.util.find_spec(package) is None


def _standin_factory(cfg, config):
    """A backend factory for the stand-in engine with the plan's share (weights of the cut model)."""
    import torch

    from rspo.gpu_memory.shape import dtype_bytes
    from rspo.gpu_memory.simulate import meta_model
    from rspo.rollout.standin import StandInBackend, StandInEngine

    c = dtype_bytes(cfg.model.dtype)
    weights = c * sum(p.numel() for p in meta_model(config).parameters()) // cfg.rollout.tensor_parallel_size

    def factory(policy, tokenizer):
        dev = policy.device
        total = torch.cuda.get_device_properties(dev).total_memory if dev.type == "cuda" else 0
        share = int(cfg.rollout.vllm_gpu_memory_utilization * total)
        return StandInBackend(
            tokenizer,
            StandInEngine(weights, max(0, share - weights), dev),
            prompt_tokens=cfg.data.max_prompt_tokens,
            response_tokens=cfg.rollout.max_new_tokens,
            dtype=getattr(torch, cfg.model.dtype),
            sleep=cfg.rollout.vllm_sleep,
            model=policy.model,
        )

    return factory


def launch_stage(stage: str, args, world: int, argv: list[str]) -> None:
    cmd = [sys.executable]
    if world > 1:
        cmd += ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world)]
    cmd += ["-m", "rspo", "preflight"]
    r = subprocess.run([*cmd, *argv, "--stage", stage, "--out", args.out], text=True)
    if r.returncode != 0:
        raise RuntimeError(f"rspo preflight: the {stage} stage failed (exit {r.returncode}); its log is above")


def gpu_named(device_name: str, gpu_gib: float) -> str:
    """The GPU of rspo.gpu_memory.plan.GPUS a preflight runs on (by CUDA's device name) or plans for
    (on a CPU: the entry of that size); "" for any other."""
    from rspo.gpu_memory.plan import GPUS

    if device_name:
        return next((name for name in GPUS if name.split("-")[0] in device_name.lower()), "")
    return next((name for name, gib in GPUS.items() if math.isclose(gib, gpu_gib)), "")


def report(args, world: int) -> dict[str, Any]:
    """Both stages' measurements, scaled to the full depth, beside the full model's plan."""
    import psutil

    from rspo.config import load_preset
    from rspo.gpu_memory.flops import update_mfu
    from rspo.gpu_memory.plan import plan_run, preset_setup
    from rspo.gpu_memory.rollout_time import rollout_time
    from rspo.gpu_memory.shape import dtype_bytes, shape_from_config
    from rspo.gpu_memory.simulate import task_inputs
    from rspo.preset import Preset

    out = Path(args.out)
    stages = [json.loads((out / f"{stage}.rank0.json").read_text()) for stage in STAGES]
    device, engine = stages[0]["device"], stages[0]["engine"]
    measured_cut: dict[str, float] = {}
    for st in stages:
        for ph, v in st["measured"].items():
            measured_cut[ph] = max(measured_cut.get(ph, 0.0), v)
    import torch

    props = torch.cuda.get_device_properties(0) if device == "cuda" else None
    gpu_gib = props.total_memory / GIB if props else args.gpu_gib
    device_name = props.name if props else ""
    limit = gpu_gib if device == "cuda" else psutil.virtual_memory().total / GIB
    setup = preset_setup(load_preset(args.preset), gpu_gib)

    def plan(layers: int):
        cfg, config, _ = task_inputs(args.preset, args.task, args.hub_dir, layers, args.overrides)
        shape = shape_from_config("model", config, dtype_bytes(str(getattr(config, "dtype", None) or "float32")))
        run_plan = plan_run(cfg, shape, setup, args.task)
        return {ph.name: ph.total / GIB for ph in run_plan.phases}, cfg, config, run_plan

    full, cfg, config, full_plan = plan(0)
    cut, _, cut_config, _ = plan(args.layers)
    measured = {ph: round(v + full.get(ph, 0.0) - cut.get(ph, 0.0), 2) for ph, v in measured_cut.items()}
    full_layers = int(config.num_hidden_layers)
    scale = full_layers / max(1, args.layers)
    train_s = sum(v for ph, v in stages[1]["seconds"].items() if ph != "engine_start") * scale
    # the stand-in decodes nothing: its rollout is the floor at the GPU's memory bandwidth instead
    floor = rollout_time(full_plan, gpu_named(device_name, gpu_gib)) if engine.startswith("stand-in") else None
    rollout_s = floor.seconds if floor is not None and math.isfinite(floor.seconds) else None
    step_s = train_s + (rollout_s or 0.0)
    peak = max(measured.values())
    mfu = None
    if device == "cuda" and stages[1].get("update_tokens"):  # the second step's: its kernels warm
        st = stages[1]
        cut_shape = shape_from_config("cut", cut_config, 2)
        mfu = update_mfu(
            cut_shape, st["update_tokens"], st["update_rows"], st["update_s"], gpu_named(device_name, gpu_gib)
        )
    return {
        "preset": Preset.load(args.preset).name,
        "device": device,
        "engine": engine,
        "layers": args.layers,
        "full_layers": full_layers,
        "fits": peak <= limit,
        "limit_gib": round(limit, 2),
        "measured": measured,
        "measured_at_cut_depth": {k: round(v, 2) for k, v in measured_cut.items()},
        "planned": {k: round(v, 2) for k, v in full.items() if k in measured},
        "margin_gib": round(limit - peak, 2),
        "train_s_estimate": round(train_s, 1),
        "rollout_s_floor": None if rollout_s is None else round(rollout_s, 1),
        "step_s_estimate": round(step_s, 1),
        "run_h_estimate": round(step_s * cfg.schedule.total_steps / 3600, 1),
        "world_size": world,
        "parity": parity([st.get("parity", {}) for st in stages]),
        # the second step's update at the cut depth: model FLOPs per second and their share of the
        # GPU's dense bf16 peak (rspo.gpu_memory.flops); None on a CPU or an unknown GPU
        "update_mfu": mfu,
    }


def run_stages(args, world: int, argv: list[str]) -> dict[str, Any]:
    """Both stages, each in a process of its own (under torchrun with ``world`` processes when
    the preset trains that way), launched as `python -m rspo preflight ARGV --stage S`; -> the
    report. ``argv`` is the command's own arguments without ``--out``."""
    from rspo.distributed import gpu_environment

    gpu_environment()
    with tempfile.TemporaryDirectory(prefix="rspo-preflight-") as tmp:
        args.out = args.out or tmp
        Path(args.out).mkdir(parents=True, exist_ok=True)
        for stage in STAGES:
            launch_stage(stage, args, world, argv)
        return report(args, world)
