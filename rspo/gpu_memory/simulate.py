"""The trainer's own training step on fake tensors: what one GPU of a preset's train job holds in
each phase, measured by torch's memory tracker without allocating it (the check of
rspo.gpu_memory.plan; ``python -m rspo plan-memory --simulate``).

What runs is ``rspo.train.trainer.Trainer`` itself, rank 0 of W ranks: two training steps (rollout,
release, old pass, updates with their optimizer steps, sync, KV wake), a checkpoint save, then a
second trainer on the same folder that resumes from it before its engine starts. What is replaced,
and by what:

- the device: tensors of the model, its gradients, the optimizer's state, the activations and
  everything computed from them are fake (``FakeTensorMode``: shapes, dtypes and devices without
  storage); what the trainer keeps on the host (the rollout's token ids and masks, row indices,
  rewards, what ``host_allocation`` marks: the old-router cache, a checkpoint's trainer state)
  stays real, so the trainer's own bookkeeping
  (packing rows into micro-batches, grouping prompts) computes real values. ``SimMode`` decides per
  operation: an operation on fake tensors, or a floating-point factory, runs fake; one on real
  tensors only runs for real; a scalar read from a fake tensor (a metric, a finiteness check) gets
  1 (True for a flag); a boolean index on the host is turned into the positions it selects;
- the process group: torch's fake backend for W ranks (collectives allocate their outputs and move
  nothing) and ``SimDist``, whose object gathers return W copies of this rank's object (every rank
  of a simulation is the same);
- the model: built from its config.json with random weights (``random_weights``), the tokenizer this
  package builds (only the model's vocabulary size matters);
- the engine: ``rspo.rollout.standin`` with the plan's sizes (weights P x c / N, KV cache the rest of
  its share), which allocates and frees fake buffers at the calls vLLM's sleep mode would get;
  its rollouts have prompts of data.max_prompt_tokens and responses of max_new_tokens, every token
  trained on;
- the task: records and a reward that carry no meaning (the memory does not depend on them);
- the steps: two mini-batches of as few prompts as keep each rank's micro-batches as full as the
  preset's (a token budget packs one row per forward when rows are as long as it); the per-phase
  peaks do not depend on how many such micro-batches a step has.

Measured per phase (``SimMemory``): torch's memory tracker's peak of fake (device) tensors between
the phase's start and end, in the second step, the save and the resume. The first step is left out:
the first gradient clipping and the first optimizer step of a process show up to 4 x the gradients'
size in transient fake tensors (7 GiB per 1.9B parameters over 8 ranks) that the same operations
never show again in that process, the resume's optimizer step from an empty state included, so they
are the fake-tensor machinery's first call, not the step's (with real tensors, FSDP2 on one gloo
rank, the first AdamW step's peak equals every later one's: 606.7 vs 606.8 MiB, measured; a GPU's
first step is measured by rspo preflight).

Not simulated: what lives outside torch's tensors (CUDA context, NCCL, vLLM's graphs and buffers:
the plan's runtime lines), kernel workspaces, the allocator's fragmentation, and the device copies
of host tensors (token ids, masks, cache slices: megabytes). One process per simulation (the fake
process group is process-wide): ``run_preset`` starts one for each task of a preset. Torchrun
presets only (W > 1): one process runs transformers' eager experts under autocast
(rspo.train.precision), whose shapes follow the routing, which fake tensors cannot.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from rspo.distributed import Dist
from rspo.phase_memory import GIB, PhaseMemory, host_context

REGRESSIONS = ("keep-grads", "resume-after-engine")  # the two faults the fixes removed, for the tests


# ------------------------------------------------------------------------------ fake device, real host


def _is_fake(t) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        t = t._local_tensor
    return isinstance(t, FakeTensor)


def _sim_mode_class():
    from torch.distributed.tensor import DTensor
    from torch.utils import _pytree as pytree
    from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

    aten = torch.ops.aten
    index_ops = {aten.index.Tensor, aten.index_put_.default, aten.index_put.default, aten._index_put_impl_.default}
    scalar_ops = {aten._local_scalar_dense.default, aten.is_nonzero.default}

    class SimMode(TorchDispatchMode):
        """Fake device, real host (see the module docstring). Sits above a FakeTensorMode."""

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if any(issubclass(t, DTensor) for t in types):
                return NotImplemented  # DTensor desugars into local ops, which come back here
            tensors = [a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
            fake = [t for t in tensors if _is_fake(t)]
            if fake and func in scalar_ops:  # a value of a fake tensor: a metric or a check
                t = fake[0]
                if func is aten.is_nonzero.default or t.dtype == torch.bool:
                    value = getattr(t, NOMINAL, None)
                    return True if value is None else value
                return 1.0 if t.is_floating_point() else 1
            if fake:
                if func in index_ops and any(_host_mask(i) for i in args[1]):
                    args = (args[0], _positions(args[1], _disable_current_modes), *args[2:])
                out = func(*args, **kwargs)
                if isinstance(out, torch.Tensor) and out.dtype == torch.bool:
                    _nominal(func, tensors, out)
                return out
            if tensors or not _float_factory(func, kwargs):
                with _disable_current_modes():
                    return func(*args, **kwargs)
            return func(*args, **kwargs)  # a device allocation: fake

    return SimMode


def _check_mode_class():
    from torch.overrides import TorchFunctionMode

    checks = {torch.isfinite: True, torch.Tensor.isfinite: True, torch.isnan: False, torch.Tensor.isnan: False}
    checks.update({torch.isinf: False, torch.Tensor.isinf: False})

    class CheckMode(TorchFunctionMode):
        """Marks the finiteness checks' results before they decompose into comparisons (_nominal)."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func in checks and isinstance(out, torch.Tensor) and _is_fake(out):
                setattr(out, NOMINAL, checks[func])
            return out

    return CheckMode


NOMINAL = "_rspo_nominal"  # the value every element of a fake boolean tensor stands for (finite data)
_ALWAYS = {"isfinite": True, "isnan": False, "isinf": False, "isposinf": False, "isneginf": False}


def _nominal(func, inputs: list[torch.Tensor], out: torch.Tensor) -> None:
    """The flag a fake boolean tensor carries, so that checks read as they do on finite data:
    ``isfinite`` is true, ``isnan`` / ``isinf`` false, negation, and, or and reductions follow; a
    check whose value is unknown reads true."""
    name = func.__name__.split(".")[0].lstrip("_")
    flags = [getattr(t, NOMINAL, None) for t in inputs if t.dtype == torch.bool]
    if name in _ALWAYS:
        value = _ALWAYS[name]
    elif name in ("logical_not", "bitwise_not") and flags and flags[0] is not None:
        value = not flags[0]
    elif name in ("bitwise_and", "logical_and", "mul"):
        value = False if False in flags else (True if flags and all(flags) else None)
    elif name in ("bitwise_or", "logical_or", "add"):
        value = True if True in flags else (False if flags and all(f is False for f in flags) else None)
    elif len(flags) == 1:  # views, copies, indexing, any / all
        value = flags[0]
    else:
        value = None
    if value is not None:
        setattr(out, NOMINAL, value)


def _host_mask(i) -> bool:
    return isinstance(i, torch.Tensor) and not _is_fake(i) and i.dtype == torch.bool


def _positions(indices, real):
    """A boolean host mask among an index op's indices -> the positions it selects (real)."""
    out = []
    for i in indices:
        if _host_mask(i):
            with real():
                out.extend(i.nonzero(as_tuple=True))
        else:
            out.append(i)
    return out


def _float_factory(func, kwargs) -> bool:
    dtype = kwargs.get("dtype")
    if dtype is not None:
        return dtype.is_floating_point
    name = func.__name__.split(".")[0]
    return name in ("empty", "zeros", "ones", "full", "rand", "randn", "empty_strided", "scalar_tensor")


class SimDist(Dist):
    """A process-group view for rank 0 of a simulation: object gathers return W copies of this rank's
    object (the fake backend moves no data, and every rank of a simulation is the same)."""

    def all_gather_object(self, obj: Any) -> list[Any]:
        return [obj] * self.world_size

    def barrier(self) -> None:
        pass


class _NoModules:
    """Stands in for MemTracker's ModTracker: no module hooks (see SimMemory.start)."""

    is_bw = False
    parents = frozenset({"Global"})

    def register_user_hooks(self, *hooks) -> None:
        pass

    def clear_user_hooks(self) -> None:
        pass

    def get_known_fqn(self, module):
        return None

    def __enter__(self):
        return self

    def __exit__(self, *args) -> None:
        pass


class SimMemory(PhaseMemory):
    """Each phase's peak of fake (device) tensors, from torch's FSDP2 memory tracker."""

    def __init__(self) -> None:
        super().__init__()
        self.tracker = None
        self.peaks: dict[str, float] = {}

    def forget_warm_up(self) -> None:
        """Drop the peaks of the first step (the fake machinery's warm-up), the engine's start kept."""
        self.peaks = {ph: v for ph, v in self.peaks.items() if ph == "engine_start"}

    def start(self, model, optimizer) -> None:
        from torch.distributed._tools.mem_tracker import MemTracker

        class DeviceTracker(MemTracker):
            """Counts fake tensors only (the device's; the real ones are host memory) and keeps the
            device's peak alone: no per-module statistics. Its module tracker (``ModTracker``) hooks
            every module's inputs to see the backward start, and those hooks kept each checkpointed
            layer's input alive across steps (8 x 36 MiB a step at 2 layers, measured; with no tracker
            none stays), so it is replaced by one that sees no module."""

            def __init__(self) -> None:
                super().__init__()
                self._mod_tracker = _NoModules()

            def _track(self, reftype, t):
                if _is_fake(t):
                    super()._track(reftype, t)

            def reset_peak(self) -> None:  # the phase's own peak (private fields of MemTracker)
                self._peak_mem = {dev: snap["Total"] for dev, snap in self._curr_mem_snap.items()}

        self.tracker = DeviceTracker()
        self.tracker.track_external(model, optimizer)
        self.tracker.__enter__()

    def stop(self) -> None:
        if self.tracker is not None:
            self.tracker.__exit__(None, None, None)
            self.tracker = None

    def _enter(self, name: str) -> None:
        if self.tracker is not None:
            self.tracker.reset_peak()

    def _exit(self, name: str) -> dict[str, float]:
        if self.tracker is None:
            return {}
        peak = max(self.tracker._peak_mem.values(), default=0) / GIB
        if os.environ.get("RSPO_SIM_DEBUG"):  # the peak's categories (parameters, gradients, ...)
            snap = {str(k): v for d in self.tracker._peak_mem_snap.values() for k, v in d.items() if v}
            print(f"[simulate] {name}: {peak:.2f} GiB " + ", ".join(f"{k} {v / GIB:.2f}" for k, v in snap.items()))
        self.peaks[name] = max(self.peaks.get(name, 0.0), peak)
        return {"peak_gib": peak}


# ------------------------------------------------------------------------------ the stand-ins


def sim_task(folder: Path):
    from rspo.jsonl import iter_jsonl
    from rspo.tasks import Task

    def read_jsonl(p: str) -> list[dict[str, Any]]:
        return [record for _, record in iter_jsonl(p)]

    path = folder / "records.jsonl"
    path.write_text("".join(json.dumps({"id": i}) + "\n" for i in range(64)))

    def score_batch(completions, records, workers):
        return [(float(i % 2), "simulated") for i in range(len(completions))]

    return Task("simulated", read_jsonl, lambda r: f"record {r['id']}", score_batch), path


def model_folder(config, folder: Path) -> Path:
    """config.json and this package's tokenizer: what a Trainer with random weights reads."""
    from rspo.tokenizer import build_tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    if not getattr(config, "architectures", None):  # vLLM picks its model class from this field
        config.architectures = [type(meta_model(config)).__name__]
    config.save_pretrained(folder)
    build_tokenizer().save_pretrained(folder)
    return folder


def sim_config(cfg, world: int, model_path: Path, train_path: Path, quick: bool = False):
    """The run config a simulation trains: the preset's, with the model folder, the records, two
    mini-batches of as few prompts as keep each rank's forwards as full as the preset's, no
    validation, no checkpoints of its own (the simulation saves one itself). ``quick`` (the fault
    checks, which read the phases after the updates): one mini-batch, each rank's rows in one forward."""
    sc, ro = cfg.schedule, cfg.rollout
    G = ro.group_size
    row = cfg.data.max_prompt_tokens + ro.max_new_tokens
    budget = sc.max_tokens_per_micro_batch
    if quick:  # each rank's share of the prompts must be whole: W prompts at least
        per_mb = next(m for m in range(1, world + 1) if m % world == 0 and (m * G) % world == 0)
        steps, mbs, budget = 1, 1, per_mb * G // world * row
    elif budget:  # one full-length row per forward at most: a rank needs one row
        # (each rank's share of the step's prompts and of a mini-batch's rows must be whole)
        per_mb = next(m for m in range(1, 2 * world + 1) if (m * G) % world == 0 and (2 * m) % world == 0)
        steps, mbs = 2, 2
    else:  # the forward holds the micro-batch's rows: keep the mini-batch
        per_mb, steps, mbs = sc.mini_batch_prompts, 2, 2
    return replace(
        cfg,
        model=replace(cfg.model, path=str(model_path), threads=1, device="cpu"),  # the fake device
        data=replace(cfg.data, task="countdown", train_path=str(train_path), val_paths={}),
        schedule=replace(
            sc,
            prompts_per_step=mbs * per_mb,
            mini_batch_prompts=per_mb,
            max_tokens_per_micro_batch=budget,
            total_steps=steps,
            val_every=0,
            ckpt_every=0,
        ),
    )


def simulate(cfg, config, world: int, gpu_gib: float, regression: str | None = None) -> dict[str, float]:
    """Peak GiB of fake (device) tensors per phase on rank 0 of ``world`` ranks. ``cfg``: the preset's
    TrainConfig of the task, ``config``: the model's transformers config; ``regression`` (tests):
    keep-grads (the gradients stay through the sync and the KV wake: one quick step) or
    resume-after-engine (the checkpoint is read beside an awake engine: no step), the two faults the
    trainer no longer has; their phases (kv_wake, resume) are the ones to read."""
    import torch.distributed as tdist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from rspo.gpu_memory.shape import dtype_bytes
    from rspo.rollout.standin import StandInBackend, StandInEngine
    from rspo.rollout.vllm import checkpoint_weights
    from rspo.train.trainer import Trainer

    if world < 2:
        raise ValueError("the simulation runs torchrun presets (W > 1); see the module docstring")
    if cfg.model.cpu_offload:
        raise ValueError("model.cpu_offload: the state lives in host memory, which the simulation does not model")
    if regression not in (None, *REGRESSIONS):
        raise ValueError(f"regression: one of {REGRESSIONS}, got {regression!r}")
    if not tdist.is_initialized():
        tdist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    dist = SimDist(rank=0, world_size=world, local_rank=0, local_world_size=world)
    with tempfile.TemporaryDirectory(prefix="rspo-sim-") as tmp:
        root = Path(tmp)
        task, records = sim_task(root)
        run_cfg = sim_config(cfg, world, model_folder(config, root / "model"), records, quick=bool(regression))
        steps = {None: 2, "keep-grads": 1, "resume-after-engine": 0}[regression]
        c = dtype_bytes(cfg.model.dtype)
        N = cfg.rollout.tensor_parallel_size
        weights = c * sum(p.numel() for p in meta_model(config).parameters()) // N
        share = int(cfg.rollout.vllm_gpu_memory_utilization * gpu_gib * GIB)

        def engine(policy, tokenizer):
            return StandInBackend(
                tokenizer,
                StandInEngine(weights, max(0, share - weights), policy.device),
                prompt_tokens=cfg.data.max_prompt_tokens,
                response_tokens=cfg.rollout.max_new_tokens,
                dtype=getattr(torch, cfg.model.dtype),
                sleep=cfg.rollout.vllm_sleep,
                batch_device=torch.device("cpu"),  # fake device tensors have no values to read
                model=policy.model,
            )

        peaks: dict[str, float] = {}
        fake = FakeTensorMode(allow_non_fake_inputs=True)
        from torch.utils._python_dispatch import _disable_current_modes

        with fake, _sim_mode_class()(), _check_mode_class()(), host_context(_disable_current_modes):
            for attempt in ("train", "resume"):
                memory = SimMemory()
                if attempt == "resume" and regression == "resume-after-engine":  # the old order
                    trainer = _trainer(Trainer, run_cfg, root / "elsewhere", task, dist, engine, memory)
                    with memory.phase("resume"):
                        trainer.load_checkpoint(trainer.folder.latest_checkpoint() or _latest(root / "run"))
                else:
                    trainer = _trainer(Trainer, run_cfg, root / "run", task, dist, engine, memory)
                if attempt == "train":
                    if regression == "keep-grads":
                        trainer.policy.optimizer.zero_grad = lambda set_to_none=True: None  # never released
                    for k in range(steps):
                        trainer.train_step()
                        if k == 0 and steps > 1:  # the first step warms the fake machinery up (module docstring)
                            memory.forget_warm_up()
                    trainer.save_checkpoint()
                    # the final checkpoint's device side, after the last step: the layer gathers that
                    # write_hf_checkpoint streams to the host (its files are host work: not simulated)
                    with memory.phase("checkpoint_save"):
                        for _ in checkpoint_weights(trainer.model, getattr(torch, cfg.model.dtype)):
                            pass
                memory.stop()
                for k, v in memory.peaks.items():
                    peaks[k] = max(peaks.get(k, 0.0), v)
                del trainer
                gc.collect()
    return peaks


def _trainer(Trainer, cfg, out: Path, task, dist, engine, memory):
    from rspo.train.policy import Policy

    policy = Policy(cfg, dist, memory=memory, random_weights=True)
    return Trainer(cfg, out, task=task, quiet=True, policy=policy, engine=engine)


def _latest(run: Path) -> Path:
    return max((run / "checkpoints").glob("step_*"))


def meta_model(config):
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


# ------------------------------------------------------------------------------ a preset, one process per task


def run_preset(preset_path: str, gpu_gib: float, hub_dir: str, layers: int = 0, regression: str | None = None):
    """{task: {phase: simulated GiB}} for a torchrun preset, one fresh process per task."""
    from rspo.config import load_preset
    from rspo.plan import Plan

    plan = Plan(load_preset(preset_path))
    out = {}
    for task in dict.fromkeys(run.task for run in plan.runs.values()):
        cmd = [sys.executable, "-m", "rspo.gpu_memory.simulate", "--preset", str(preset_path), "--task", task]
        cmd += ["--gpu-gib", str(gpu_gib), "--hub-dir", hub_dir, "--layers", str(layers)]
        if regression:
            cmd += ["--regression", regression]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"simulation of task {task} failed:\n{r.stderr[-4000:]}")
        out[task] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


def task_inputs(preset_path: str, task: str, hub_dir: str, layers: int = 0, overrides=()):
    """(TrainConfig, transformers config, world size) of a preset's task (with ``overrides``, as
    ``rspo train --set``); ``layers`` > 0: the model cut to that many decoder layers (the per-layer
    terms scale)."""
    from rspo.config import load_preset
    from rspo.gpu_memory.shape import model_config
    from rspo.grid import train_config
    from rspo.plan import Plan

    preset = load_preset(preset_path)
    plan = Plan(preset)
    run = next(r for r in plan.runs.values() if r.task == task)
    cfg = train_config(plan.spec, run, list(overrides))
    _, config, _ = model_config(plan.hub_model(task) or cfg.model.path, plan.spec, task, hub_dir)
    if layers:
        config.num_hidden_layers = layers
        for key in ("mlp_only_layers", "layer_types"):
            if isinstance(getattr(config, key, None), list):
                setattr(config, key, [x for x in getattr(config, key) if not isinstance(x, int) or x < layers][:layers])
    world = max(1, int(plan.resources("train")["processes"]))
    return cfg, config, world


def simulated_beside_plan(preset_path: str, gpu_gib: float, hub_dir: str, layers: int = 0) -> dict[str, dict]:
    """{"simulated": {phase: GiB}, "planned_tensors": {phase: GiB}}: the trainer's step on fake
    tensors and the plan's tensor terms of the same model (cut to ``layers`` when > 0), max over tasks."""
    from rspo.config import load_preset
    from rspo.gpu_memory.plan import plan_run, preset_setup
    from rspo.gpu_memory.shape import dtype_bytes, shape_from_config

    preset = load_preset(preset_path)
    sims = run_preset(preset_path, gpu_gib, hub_dir, layers)
    sim: dict[str, float] = {}
    planned: dict[str, float] = {}
    for task, peaks in sims.items():
        cfg, config, _ = task_inputs(preset_path, task, hub_dir, layers)
        shape = shape_from_config(f"{task} model", config, dtype_bytes(str(getattr(config, "dtype", "bfloat16"))))
        plan = plan_run(cfg, shape, preset_setup(preset, gpu_gib), task)
        for ph in plan.phases:
            if ph.name in peaks:
                sim[ph.name] = round(max(sim.get(ph.name, 0.0), peaks[ph.name]), 2)
                planned[ph.name] = round(max(planned.get(ph.name, 0.0), ph.tensors / GIB), 2)
    return {"simulated": sim, "planned_tensors": planned}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rspo.gpu_memory.simulate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", required=True, help="configs/<p>.yaml")
    ap.add_argument("--task", required=True, help="the preset's task whose step is simulated")
    ap.add_argument("--gpu-gib", type=float, required=True, help="the GPU's memory (GiB) the plan is made for")
    ap.add_argument("--hub-dir", default="results/hub", help="where fetched hub models are")
    ap.add_argument("--layers", type=int, default=0, help="cut the model to this many decoder layers (0: all)")
    ap.add_argument(
        "--regression", choices=REGRESSIONS, default=None, help="a known fault put back, to show the simulation sees it"
    )
    args = ap.parse_args(argv)
    cfg, config, world = task_inputs(args.preset, args.task, args.hub_dir, args.layers)
    with contextlib.redirect_stdout(sys.stderr):  # the trainer's prints; stdout carries the JSON line
        peaks = simulate(cfg, config, world, args.gpu_gib, args.regression)
    print(json.dumps({k: round(v, 3) for k, v in peaks.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
