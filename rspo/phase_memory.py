"""The phases of a training step in the order the trainer runs them, and their memory measured
while it runs.

``PHASES`` names each moment whose memory can differ (the plan, rspo.gpu_memory.plan, and the
simulation, rspo.gpu_memory.simulate, use the same names):

- ``resume``: a resumed run loads its checkpoint (torch's DCP allocates the optimizer state by one
  zero-gradient step, so parameters, gradients and Adam's moments coexist), before any engine exists;
- ``engine_start``: the rollout engine is built (vLLM: weights, profile run, CUDA graphs, KV cache);
- ``rollout``: the step's responses are sampled and scored; then the engine sleeps
  (rollout.vllm_sleep: weights and KV cache freed), which the next phase starts from;
- ``old_pass``: the no-grad forward that records old log-probs and the router cache;
- ``update``: the micro-batches' forwards and backwards of each mini-batch;
- ``optimizer_step``: gradient clipping and the AdamW step of each mini-batch (gradients released
  after the step's last one);
- ``sync``: the engine's weights wake and the training model's layers stream into them;
- ``kv_wake``: the engine's KV cache wakes;
- ``checkpoint_save``: the sharded checkpoint is written;
- ``evaluation``: an evaluation job's engine (planned only: its own job).

``PhaseMemory`` is what the trainer holds: ``with memory.phase(name):`` around each phase keeps the
largest value measured in that phase over the current step; ``step_metrics()`` returns them as
``memory/<phase>/<what>_gib`` and starts the next step. What is measured:

- on a GPU (``CudaMemory``): torch's peak allocated and reserved bytes over the phase
  (``max_memory_allocated`` / ``max_memory_reserved`` after ``reset_peak_memory_stats`` at its
  start), the driver's used memory at its end (``mem_get_info``: total - free, which includes what
  NCCL, vLLM's memory pool and the CUDA context hold outside torch's allocator), and the phase's
  estimated device peak, ``peak_gib``, the number to compare with the plan's total: the larger of
  driver used at its start + (peak reserved - reserved at its start) and driver used at its end +
  (peak reserved - the larger of the reservations at its start and end), the driver's view plus the
  transient peak above what was reserved. Bytes torch gave back inside the phase are not added to
  the end's view: vLLM's ``wake_up`` empties torch's cache before it maps its own memory, so the
  sync's gathered layers (about 2.3 GiB per rank of paper_large_math) left before the KV cache came
  (the earlier reading, driver at the end + (peak reserved - reserved at the end), counted them
  twice at kv_wake, sync and engine_start). Not peak reserved + (driver used - reserved): under vLLM's level-2
  sleep the engine's tensors and their reservation stay in torch's counters while their pages are
  unmapped (about 23.8 GiB per rank of paper_large_math), so that reading counted a sleeping engine
  as awake and cried "over plan" in every phase between rollout and sync;
- on the CPU (``HostMemory``): the process's resident memory at the end of the phase (``rss_gib``),
  so that the same code path runs in the CPU tests;
- in the simulation: the memory tracker's peak over the phase (rspo.gpu_memory.simulate).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where it is used: the memory plan reads PHASES without it
    import torch

log = logging.getLogger(__name__)

GIB = 2**30
PHASES: tuple[str, ...] = (
    "resume",
    "engine_start",
    "rollout",
    "old_pass",
    "update",
    "optimizer_step",
    "sync",
    "kv_wake",
    "checkpoint_save",
    "evaluation",
)
OVER_PLAN = 0.05  # a measured phase above its plan by more than this share is named in a warning
_HOST_CONTEXT: list = []  # a simulation's way to run host work for real (rspo.gpu_memory.simulate)


@contextlib.contextmanager
def host_allocation() -> Iterator[None]:
    """Marks work on host memory next to the device (the old-router cache's buffers, the trainer
    state of a checkpoint). A no-op when the step runs; the simulation (rspo.gpu_memory.simulate),
    whose device tensors are fake, runs what is marked here on real host tensors."""
    with _HOST_CONTEXT[-1]() if _HOST_CONTEXT else contextlib.nullcontext():
        yield


@contextlib.contextmanager
def host_context(make) -> Iterator[None]:
    """Within the block, ``host_allocation`` enters ``make()`` (the simulation's real-tensor context)."""
    _HOST_CONTEXT.append(make)
    try:
        yield
    finally:
        _HOST_CONTEXT.pop()


def return_cached_blocks(device: torch.device) -> None:
    """Give torch's cached, unused GPU blocks back to the driver: the trainer once a step's gradients
    are gone (the update's activations), before the engine wakes; the stand-in engine where vLLM's
    allocator does (sleep, wake). vLLM's sleep-mode pool maps memory of its own (cuMemCreate through
    its CuMemAllocator) and cannot use blocks torch keeps cached; vLLM 0.32's
    ``CuMemAllocator.wake_up`` empties torch's cache itself, and doing it in the trainer keeps the
    order the trainer's, whatever the engine (on an H100, paper_small cut to 2 layers, the driver
    still saw the update's 48.5 GiB in the sync and the KV wake without it, 5 GiB over their plan)."""
    if device.type == "cuda":
        import torch

        torch.cuda.empty_cache()


class PhaseMemory:
    """Measures nothing (the base of the measuring kinds; also what ``memory=None`` would mean)."""

    def __init__(self) -> None:
        self.current: dict[str, dict[str, float]] = {}
        self.first: dict[str, dict[str, float]] | None = None  # the first step's values (printed once)
        self.seconds: dict[str, float] = {}  # wall time of each phase in the current step (summed)
        self.last_seconds: dict[str, float] = {}  # ... in the step before

    def start(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Called once the model and the optimizer exist, before the resume and the engine."""

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r}; phases: {PHASES}")
        self._enter(name)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0
            self._record(name, self._exit(name))

    def _enter(self, name: str) -> None:
        pass

    def _exit(self, name: str) -> dict[str, float]:
        return {}

    def _record(self, name: str, values: dict[str, float]) -> None:
        row = self.current.setdefault(name, {})
        for k, v in values.items():
            row[k] = max(row.get(k, float("-inf")), v)

    def step_metrics(self) -> dict[str, float]:
        """``memory/<phase>/<what>_gib`` of the phases run since the last call; then a fresh step."""
        out = {f"memory/{ph}/{k}": v for ph, row in self.current.items() for k, v in row.items()}
        if self.first is None and self.current:
            self.first = {ph: dict(row) for ph, row in self.current.items()}
        self.current = {}  # resume and engine_start (before the first step) are reported with step 1
        self.last_seconds, self.seconds = self.seconds, {}
        return out

    def table(self, values: dict[str, dict[str, float]], planned: dict[str, float] | None = None) -> str:
        """The phases' values (GiB), in step order, beside the plan's totals when given."""
        keys = sorted({k for row in values.values() for k in row})
        head = ["phase", *keys] + (["planned_gib", "measured/planned"] if planned else [])
        lines = ["  ".join(f"{h:>16s}" for h in head)]
        for ph in PHASES:
            if ph not in values:
                continue
            row = values[ph]
            cells = [f"{ph:>16s}"] + [f"{row[k]:16.2f}" if k in row else f"{'-':>16s}" for k in keys]
            if planned:
                plan = planned.get(ph)
                got = row.get("peak_gib")
                cells.append(f"{plan:16.2f}" if plan is not None else f"{'-':>16s}")
                ratio = f"{got / plan:.3f}" if plan and got is not None else "-"
                cells.append(f"{ratio:>16s}")
            lines.append("  ".join(cells))
        return "\n".join(lines)

    def over_plan(self, values: dict[str, dict[str, float]], planned: dict[str, float]) -> list[str]:
        """The phases whose measured peak exceeds the plan by more than OVER_PLAN (one line each)."""
        out = []
        for ph in PHASES:
            got, plan = values.get(ph, {}).get("peak_gib"), planned.get(ph)
            if got is not None and plan and got > plan * (1 + OVER_PLAN):
                out.append(f"phase {ph}: measured {got:.2f} GiB, planned {plan:.2f} GiB (+{got / plan - 1:.0%})")
        return out


class CudaMemory(PhaseMemory):
    """A GPU's memory per phase: torch's peaks and the driver's view (see the module docstring)."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device

    def _enter(self, name: str) -> None:
        import torch

        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        free, total = torch.cuda.mem_get_info(self.device)
        self._start = (total - free, torch.cuda.memory_reserved(self.device))

    def _exit(self, name: str) -> dict[str, float]:
        import torch

        torch.cuda.synchronize(self.device)
        free, total = torch.cuda.mem_get_info(self.device)
        reserved_now = torch.cuda.memory_reserved(self.device)
        peak_reserved = torch.cuda.max_memory_reserved(self.device)
        driver = total - free  # what is mapped now, torch's or not (context, NCCL, an awake engine)
        driver_start, reserved_start = self._start
        # the transient above the start, with what lay outside torch then; and the end's view plus the
        # transient above both the start's and the end's reservation: bytes torch released inside the
        # phase (vLLM's wake empties torch's cache before it maps) never coexisted with what was
        # mapped after them, so they are not added to the end's view
        from_start = driver_start + max(0, peak_reserved - reserved_start)
        at_end = driver + max(0, peak_reserved - max(reserved_start, reserved_now))
        return {
            "allocated_gib": torch.cuda.max_memory_allocated(self.device) / GIB,
            "reserved_gib": peak_reserved / GIB,
            "driver_used_gib": driver / GIB,
            "peak_gib": max(from_start, at_end) / GIB,
        }


class HostMemory(PhaseMemory):
    """The process's resident memory at the end of each phase (CPU runs)."""

    def __init__(self) -> None:
        super().__init__()
        import psutil

        self.process = psutil.Process()

    def _exit(self, name: str) -> dict[str, float]:
        return {"rss_gib": self.process.memory_info().rss / GIB}


def measure_for(device: torch.device) -> PhaseMemory:
    """The measuring kind for the trainer's device."""
    return CudaMemory(device) if device.type == "cuda" else HostMemory()
