"""A vLLM engine that shares the node's GPUs with training: tensor parallel across the training
ranks, and asleep while the actor updates.

Tensor parallelism (``rollout.tensor_parallel_size`` N, torchrun only): every rank builds its
engine with vLLM's ``external_launcher`` executor and ``tensor_parallel_size=N``; vLLM lays the
torch world out as external data parallel x tensor parallel, so ranks [gN, (g+1)N) hold one engine
between them, each a 1/N shard of every layer (the weights of Qwen3-30B-A3B: 57 GiB / 8 = 7.1 GiB a
GPU, where one engine per GPU needs all 57). The N ranks of a group must submit the same requests
at the same time (the engine's forward is a collective among them). ``generate_share`` does that:
each rank knows every prompt of the step (they are drawn from the seed), so the ranks of a group
submit the union of their shares, in rank order, with the seeds of the global rows they stand for,
and each keeps its own rows. Nothing is exchanged; the samples are those tensor parallel size 1
gives (the same seeded requests; equal on vLLM's CPU build with TP 2, tests/test_rollout_vllm.py),
up to the float rounding of the tensor-parallel reductions at an exact near-tie. Weight sync is
unchanged: every rank streams the full (gathered) tensors layer by layer and each engine's loader
keeps its shard.

Residency (``rollout.vllm_sleep``, GPUs): what the engine holds at each moment of a training step,
in the order the trainer runs them (the memory plan, rspo.gpu_memory.plan, has the same phases):

1. rollout: weights and KV cache awake;
2. release (``EngineSleep.release``): vLLM's sleep mode at level 2 discards both (every step
   reloads the weights anyway) while the old pass, the updates and the optimizer steps run. The
   trainer releases the gradients (``set_to_none``) after the step's last optimizer step, before
   anything of the engine wakes (rspo.train.trainer);
3. sync (``wake_weights``, then the reload): ``wake_up(tags=["weights"])`` maps the weights'
   memory back alone, and the training model streams its layers into it, one gathered layer at a
   time;
4. KV wake (``wake_kv``): ``wake_up(tags=["kv_cache"])`` maps the KV cache back once the weights
   are in (verl and TRL's colocate mode wake in the same two stages); the next rollout follows.

Allocator setting (``engine_allocator``): training runs with ``expandable_segments:True``
(rspo.distributed.GPU_ENVIRONMENT, against fragmentation when rollout and training alternate), but
vLLM 0.32 captures its CUDA graphs into a sleep-mode MemPool (``sleep_mode_offload_cudagraph``)
without turning expandable segments off, and torch's caching allocator refuses a MemPool while they
are on ("MemPool doesn't currently support expandable_segments", pytorch#147851). So everything the
engine allocates itself (its construction, which loads and captures; its sleep; each wake) runs with
them off, and training gets them back after (verl and other RL projects do the same).

A wake with no tags would map weights and KV cache at once while the sync still holds a gathered
layer. The engine must be built with ``enable_sleep_mode=True`` (vLLM's CUDA memory pool); vLLM
keeps its CUDA graphs through sleep unless ``sleep_mode_offload_cudagraph`` (set with sleep:
rspo.rollout.vllm.engine_kwargs). vLLM's CPU build refuses sleep mode ("not supported on current
platform"), so there these calls are no-ops with one log line; the stand-in engine
(rspo.rollout.standin) answers the same ``sleep`` / ``wake_up(tags)`` calls with real or fake
allocations, so the order is exercised (and its memory measured) on any machine.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

import torch

from rspo.distributed import Dist
from rspo.rollout.base import RolloutBatch, Sampling

log = logging.getLogger(__name__)

SLEEP_LEVEL = 2  # discard weights and KV cache (level 1 would keep the weights in host memory)
WAKE_TAGS = ("weights", "kv_cache")  # vLLM's tags of wake_up, in the order a sync wakes them


def allocator_settings() -> str:
    """The caching allocator's settings string now (``PYTORCH_CUDA_ALLOC_CONF`` as torch parsed it, or
    as last set). torch 2.13's own getter; the environment where a torch has none."""
    get = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
    now = get() if get is not None else ""
    return now or os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF", "")


def set_allocator_settings(settings: str) -> None:
    """Write the whole settings string through torch 2.13's accelerator API
    (``torch.cuda.memory._set_allocator_settings`` is deprecated there and calls it)."""
    put = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
    if put is None:  # an older torch
        put = torch.cuda.memory._set_allocator_settings
    put(settings)


def with_expandable(settings: str, on: bool) -> str:
    """``settings`` with ``expandable_segments`` set to ``on`` and every other option kept as written
    (torch re-parses the whole string at each write, so an option left out of it is reset)."""
    items = [kv.strip() for kv in settings.split(",") if kv.strip()]
    rest = [kv for kv in items if kv.split(":", 1)[0].strip() != "expandable_segments"]
    return ",".join([*rest, f"expandable_segments:{on}"])


def _expandable(settings: str) -> bool:
    """Whether ``settings`` turns expandable segments on (the last mention wins, as torch parses it)."""
    pairs = [kv.partition(":") for kv in settings.replace(" ", "").lower().split(",")]
    on = [value == "true" for key, _, value in pairs if key == "expandable_segments"]
    return bool(on) and on[-1]


@contextlib.contextmanager
def engine_allocator() -> Iterator[None]:
    """Expandable segments off while the engine allocates (see the module docstring), and the job's
    exact settings string back after (its other options, ``max_split_size_mb`` say, kept throughout);
    nothing without CUDA or where they are off already."""
    before = allocator_settings() if torch.cuda.is_available() else ""
    if not _expandable(before):
        yield
        return
    set_allocator_settings(with_expandable(before, False))
    try:
        yield
    finally:
        set_allocator_settings(before)


def check_tensor_parallel(tp: int, dist: Dist, backend: str) -> None:
    """A tensor-parallel engine spans whole groups of ranks on one node."""
    if tp == 1:
        return
    if backend != "vllm":
        raise ValueError(f"rollout.tensor_parallel_size={tp}: only the vllm backend shards its engine")
    if not dist.enabled or dist.world_size % tp or dist.local_world_size % tp:
        raise ValueError(
            f"rollout.tensor_parallel_size={tp} needs torchrun with a multiple of {tp} processes on each node "
            f"(got {dist.world_size} processes, {dist.local_world_size} on this node): the engine is sharded "
            "over the training ranks (vLLM's external_launcher)"
        )


def generate_share(
    backend,
    prompts: list[str],
    n: int,
    dist: Dist,
    tp: int,
    sampling: Sampling,
    *,
    record_routing: bool = False,
    record_old: bool = False,
):
    """This rank's contiguous share (len(prompts) / world) of ``n`` responses per prompt. With
    ``tp`` > 1 the ranks of a tensor-parallel group submit the group's prompts together and each
    keeps its own rows (see the module docstring). Row seeds are the global rows'."""
    lo, hi = dist.shard_bounds(len(prompts))
    per = hi - lo
    # record_old only when asked: a backend written before it (a stand-in, a user's own) keeps working
    extra = {"record_old": True} if record_old else {}
    if tp == 1:
        return backend.generate(prompts[lo:hi], n, sampling, row_offset=lo * n, record_routing=record_routing, **extra)
    g0 = (dist.rank // tp) * tp * per
    group = prompts[g0 : g0 + tp * per]
    batch: RolloutBatch = backend.generate(
        group, n, sampling, row_offset=g0 * n, record_routing=record_routing, **extra
    )
    k = dist.rank % tp
    return batch.select(torch.arange(k * per * n, (k + 1) * per * n))


class EngineSleep:
    """Puts an engine to sleep between its rollouts and the next weight sync, and wakes it in two
    stages (see the module docstring). ``engine``: a ``vllm.LLM`` or a stand-in with the same
    ``sleep(level)`` and ``wake_up(tags)``."""

    def __init__(self, engine, enabled: bool, on_cpu: bool) -> None:
        self.engine = engine
        self.enabled = enabled and not on_cpu
        self.asleep: set[str] = set()  # of WAKE_TAGS
        if enabled and on_cpu:
            log.warning("rollout.vllm_sleep: vLLM's CPU build has no sleep mode; the engine stays awake")

    def release(self) -> None:
        """Free the engine's weights and KV cache (after a rollout, before the old pass)."""
        if self.enabled and not self.asleep:
            with engine_allocator():
                self.engine.sleep(level=SLEEP_LEVEL)
            self.asleep = set(WAKE_TAGS)

    def wake_weights(self) -> None:
        """Map the weights' memory back (before the sync reloads them), the KV cache still asleep."""
        self._wake("weights")

    def wake_kv(self) -> None:
        """Map the KV cache back (after the sync; before the next rollout)."""
        self._wake("kv_cache")

    def wake(self) -> None:
        """Everything, in the two stages (before a generation that did not follow a sync)."""
        self.wake_weights()
        self.wake_kv()

    def _wake(self, tag: str) -> None:
        if tag in self.asleep:
            with engine_allocator():
                self.engine.wake_up(tags=[tag])
            self.asleep.discard(tag)
