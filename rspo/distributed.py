"""Multi-process data parallel: process group, FSDP2 sharding, and the collectives the trainer uses.

Launch with torchrun (one process per GPU, or per core group on CPU)::

    torchrun --standalone --nproc-per-node 2 -m rspo train --preset ... --out ...

``Dist.from_env()`` reads torchrun's RANK / WORLD_SIZE / LOCAL_RANK; ``init_distributed`` starts
the process group (gloo on CPU, NCCL on CUDA, both with CPU offload) once. Without torchrun everything here is the
identity (world size 1) and no process group is created, so the single-process path runs the
same code.

Sharding: ``shard_model`` applies FSDP2 ``fully_shard`` to every decoder layer and then to the
root, on a 1-D device mesh over all ranks. Parameters become DTensors sharded on dim 0; each
layer's forward all-gathers its parameters and frees them afterwards; gradients are
reduce-scattered after backward and AVERAGED over ranks (FSDP's default; a divide factor of 1
would need PREMUL_SUM, which gloo lacks). The trainer scales each micro-batch loss by its share
of the GLOBAL mini-batch times the world size, so the average is the single-process gradient.

Every collective below must be called by all ranks in the same order; the trainer guarantees it
by giving every rank the same number of prompts, micro-batches and generated tokens per step.

Failing together (``fail_together``): an exception on one rank (a reward worker that crashed, an
empty mask, a corrupt shard) would leave the other ranks waiting in their next collective until
the process group's timeout, if the failing process did not exit (a thread that is still running
keeps a Python process alive after its main thread raised). Under torchrun the failing rank
therefore writes one line naming itself, the step and the error, records the error where
torchrun's summary finds it (its "Root Cause" then shows the message), and leaves at once
(``os._exit(1)``); torchrun then stops the other ranks within seconds. Each of them says so too,
whichever comes first: its next collective breaks ("a collective failed"), or torchrun's SIGTERM
arrives while it computes ("terminated"; under load torchrun can be the faster, and a rank stopped
that way said nothing before).
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as tdist


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @classmethod
    def from_env(cls) -> Dist:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world < 1:
            raise ValueError(f"WORLD_SIZE must be >= 1, got {world}")
        local = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
        return cls(int(os.environ.get("RANK", "0")), world, int(os.environ.get("LOCAL_RANK", "0")), local)

    local_world_size: int = 1
    """Processes of this job on this node (torchrun's LOCAL_WORLD_SIZE)."""

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def node_share(self, budget: int) -> int:
        """This rank's share of a per-node budget (reward worker processes: the node's CPUs are
        shared by its ranks, so 8 ranks x 16 workers would oversubscribe them), at least 1."""
        return max(1, budget // self.local_world_size)

    def shard_bounds(self, n: int) -> tuple[int, int]:
        """[lo, hi) of this rank's contiguous share of n items; n must divide by the world size."""
        if n % self.world_size:
            raise ValueError(f"{n} items cannot be split evenly over {self.world_size} ranks")
        per = n // self.world_size
        return self.rank * per, (self.rank + 1) * per

    # ---- collectives (identity for a single process) -------------------------------------

    def all_gather_object(self, obj: Any) -> list[Any]:
        """[obj of rank 0, obj of rank 1, ...] on every rank."""
        if not self.enabled:
            return [obj]
        out: list[Any] = [None] * self.world_size
        tdist.all_gather_object(out, obj)
        return out

    def any(self, flag: bool) -> bool:
        """True on every rank if ``flag`` is True on any rank."""
        if not self.enabled:
            return bool(flag)
        t = torch.tensor([1.0 if flag else 0.0], device=_collective_device())
        tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
        return bool(t.item() > 0)

    def all_reduce_sum_(self, t: torch.Tensor) -> torch.Tensor:
        """In-place sum over ranks (returns ``t``)."""
        if self.enabled:
            if t.device != _collective_device():
                t.copy_(self.all_reduce_sum_(t.to(_collective_device())))
            else:
                tdist.all_reduce(t, op=tdist.ReduceOp.SUM)
        return t

    def barrier(self) -> None:
        if self.enabled:
            tdist.barrier()


def _collective_device() -> torch.device:
    if tdist.is_initialized() and "nccl" in str(tdist.get_backend()):  # "nccl" or "cuda:nccl,cpu:gloo"
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def process_group_backend(device: torch.device, cpu_offload: bool = False) -> str:
    """The process group's backend: gloo on CPU ranks, NCCL on CUDA ranks, and both when any state
    lives on the host next to a GPU (``model.cpu_offload``: FSDP2's CPUOffloadPolicy keeps the shards
    as CPU DTensors, so the engine's first sync gathers CPU tensors and the gradient clipping reduces
    CPU norms; with NCCL alone they fail with "No backend type associated with device type cpu").
    torchtitan makes the same choice ("cuda:nccl,cpu:gloo" with CPU offload)."""
    if device.type != "cuda":
        return "gloo"
    return "cuda:nccl,cpu:gloo" if cpu_offload else "nccl"


def init_distributed(device: torch.device, timeout_min: float = 30, cpu_offload: bool = False) -> Dist:
    """Start the process group when launched by torchrun (no-op otherwise) -> Dist.

    ``device`` is the device the model will live on: CUDA ranks use NCCL and their LOCAL_RANK
    GPU, CPU ranks use gloo (``process_group_backend``; with ``cpu_offload`` both). ``timeout_min``:
    how long a collective waits for the other ranks before the job fails
    (rl.model.collective_timeout_min; NCCL's own default is 10 minutes).
    """
    from datetime import timedelta

    d = Dist.from_env()
    if not d.enabled:
        return d
    if not tdist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(d.local_rank)
        backend = process_group_backend(device, cpu_offload)
        tdist.init_process_group(backend, timeout=timedelta(minutes=timeout_min))
    if tdist.get_world_size() != d.world_size or tdist.get_rank() != d.rank:
        raise RuntimeError(
            f"process group (rank {tdist.get_rank()} of {tdist.get_world_size()}) disagrees "
            f"with the environment (RANK={d.rank}, WORLD_SIZE={d.world_size})"
        )
    return d


def rank_device(device: torch.device, d: Dist) -> torch.device:
    """CUDA ranks each use their LOCAL_RANK GPU; CPU stays CPU."""
    if device.type == "cuda" and d.enabled:
        return torch.device("cuda", d.local_rank)
    return device


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: no model.layers to shard (expected a decoder-only LM)")
    return list(layers)


def shard_model(
    model: torch.nn.Module,
    d: Dist,
    device: torch.device,
    *,
    master_dtype: torch.dtype | None = None,
    mp_policy=None,
    cpu_offload: bool = False,
) -> torch.nn.Module:
    """FSDP2 ``fully_shard`` per decoder layer, then the root; gradients averaged over ranks.

    ``master_dtype``: each layer is cast to it just before it is sharded (then the rest), so a
    model read in bf16 becomes fp32 master shards without a whole fp32 copy on any rank.
    ``mp_policy``: FSDP2's MixedPrecisionPolicy (rspo.train.precision). ``cpu_offload``: FSDP2's
    CPUOffloadPolicy (shards, gradients and the optimizer step on the host)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    mesh = init_device_mesh(device.type, (d.world_size,))
    kwargs = {
        "mesh": mesh,
        "mp_policy": mp_policy or MixedPrecisionPolicy(),
        "offload_policy": CPUOffloadPolicy() if cpu_offload else OffloadPolicy(),
    }
    # zero-element parameters (e.g. Qwen2-MoE's shared expert at shared_expert_intermediate_size=0)
    # carry no gradient and cannot be chunked: FSDP leaves them replicated
    empty = {p for p in model.parameters() if p.numel() == 0} or None
    param_dtype = getattr(mp_policy, "param_dtype", None)
    for p in empty or ():  # left out of FSDP, so not cast by its policy: empty, they take the compute dtype
        if param_dtype is not None and p.is_floating_point():
            p.data = p.data.to(param_dtype)
    for layer in decoder_layers(model):
        if master_dtype is not None:
            for p in layer.parameters():
                if p.numel() and p.is_floating_point():
                    p.data = p.data.to(master_dtype)
        fully_shard(layer, ignored_params=empty, **kwargs)
    if master_dtype is not None:  # what is left: embeddings, final norm, LM head (not sharded yet)
        for p in model.parameters():
            if not _is_dtensor(p) and p.numel() and p.is_floating_point() and p.dtype != master_dtype:
                p.data = p.data.to(master_dtype)
    fully_shard(model, ignored_params=empty, **kwargs)
    return model


def _is_dtensor(t: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's global value (collective: all ranks must call it); a plain tensor unchanged."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def full_state_dicts(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None
) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None]:
    """Unsharded model (and optimizer) state on CPU, keyed by parameter name (collective).

    The same format for a single process and for FSDP2, so a checkpoint written with any world
    size resumes with any other. Rank 0 holds the tensors; other ranks get empty dicts.
    """
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    msd = get_model_state_dict(model, options=opts)
    osd = get_optimizer_state_dict(model, optimizer, options=opts) if optimizer is not None else None
    return msd, osd


def load_full_state_dicts(
    model: torch.nn.Module,
    model_sd: dict[str, torch.Tensor],
    optimizer: torch.optim.Optimizer | None = None,
    optim_sd: dict[str, Any] | None = None,
) -> None:
    """Inverse of ``full_state_dicts``: every rank passes the full dicts and keeps its shard."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    opts = StateDictOptions(full_state_dict=True)
    result = set_model_state_dict(model, model_sd, options=StateDictOptions(full_state_dict=True, strict=False))
    missing, unexpected = result.missing_keys, result.unexpected_keys
    if missing or unexpected:
        raise KeyError(f"missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]}")
    if optimizer is not None and optim_sd is not None:
        set_optimizer_state_dict(model, optimizer, optim_sd, options=opts)


def _peer_failure(e: BaseException) -> bool:
    """Whether an error is a collective broken by another rank's exit (gloo's closed or reset
    connection, an NCCL backend error) rather than this rank's own failure."""
    if isinstance(e, getattr(tdist, "DistError", ())):
        return True
    text = str(e)
    return isinstance(e, RuntimeError) and (
        "gloo/transport" in text or "Connection closed by peer" in text or "Connection reset by peer" in text
    )


class Terminated(BaseException):
    """SIGTERM arrived in a torchrun rank inside ``fail_together`` (torchrun stopping the ranks). A
    BaseException, as KeyboardInterrupt: no ``except Exception`` on the way (a tracking call's
    retries) holds it up."""


@contextlib.contextmanager
def fail_together(
    d: Dist, label: str, where: Callable[[], str] = lambda: "", peer_grace_s: float = 10.0
) -> Iterator[None]:
    """Under torchrun, an exception in the block ends this rank at once, named in the log (see
    the module docstring); in one process the exception propagates as usual.

    A rank whose collective broke because another rank exited says so and waits up to
    ``peer_grace_s`` for torchrun to stop it, without recording an error: torchrun's summary then
    names the rank that failed first as the root cause. A rank that torchrun terminates (SIGTERM)
    says so and exits at once, also without recording an error."""
    import signal

    previous = signal.getsignal(signal.SIGTERM)
    if previous is None:  # set outside Python: what stands is the default
        previous = signal.SIG_DFL
    if d.enabled:

        def on_sigterm(signum, frame):
            raise Terminated("SIGTERM")

        signal.signal(signal.SIGTERM, on_sigterm)
    head = f"[{label}] rank {d.rank} of {d.world_size}"
    try:
        yield
    except Terminated:
        at = where()
        print(
            f"{head} stopped{' ' + at if at else ''}: terminated (SIGTERM: torchrun stops every rank when one "
            "fails, see its line; or the job was cancelled)",
            file=sys.stderr,
            flush=True,
        )
        os._exit(1)
    except Exception as e:
        if not d.enabled:
            raise
        at = where()
        if _peer_failure(e):
            signal.signal(signal.SIGTERM, previous)  # torchrun's SIGTERM now ends the wait below
            print(
                f"{head} stopped{' ' + at if at else ''}: a collective failed ({type(e).__name__}): "
                "another rank failed first, see its line",
                file=sys.stderr,
                flush=True,
            )
            import time

            time.sleep(peer_grace_s)
            os._exit(1)
        traceback.print_exc()
        print(f"{head} failed{' ' + at if at else ''}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        with contextlib.suppress(Exception):  # torchrun's error file: the summary shows this error
            from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

            ErrorHandler().record_exception(e)
        sys.stdout.flush()
        os._exit(1)
    finally:
        if d.enabled:
            signal.signal(signal.SIGTERM, previous)


GPU_ENVIRONMENT = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "NCCL_NVLS_ENABLE": "0"}
"""The GPU jobs' allocator and NCCL settings: rollout and training alternate on one GPU (the engine's
own allocations run with expandable segments off: rspo.rollout.colocate.engine_allocator); NVLink
SHARP buffers cost GPU memory per communicator."""


def gpu_environment(env=None) -> dict[str, str]:
    """Set the GPU jobs' allocator and NCCL settings where they are not set (before CUDA starts);
    -> what was set."""
    import os

    env = os.environ if env is None else env
    added = {k: v for k, v in GPU_ENVIRONMENT.items() if k not in env}
    env.update(added)
    return added
