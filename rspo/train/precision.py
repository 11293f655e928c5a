"""Mixed precision of the trainer: fp32 master weights and optimizer states, forward and backward
in the preset's dtype (``rl.model.dtype``), the engine and ``final/`` in that dtype too.

Why: AdamW on bf16 parameters rounds small updates away. bf16 keeps 8 significant bits, so a
weight of magnitude |w| only moves when an update exceeds about |w| * 2^-8; an Adam step is about
lr in size, and at the paper presets' lr of 1e-6 almost none do (measured on a random Qwen3-MoE:
1.9% of the bf16 weights changed in three steps, 96.5% in fp32). The standard RL stacks (verl's
FSDP workers, TRL through accelerate) keep fp32 master weights and compute in bf16; so do we.

How:
- The parameters and Adam's moments are fp32 (``MASTER_DTYPE``); checkpoints keep that fp32 state
  (rspo.train.checkpoint), so a resume is exact.
- One process: every forward (rollouts of the hf backend, the old pass, the updates, validation)
  runs under ``torch.autocast(device, compute dtype)`` when the compute dtype is not fp32: matmuls
  in bf16 against the fp32 parameters, gradients accumulated in fp32.
- torchrun: FSDP2's ``MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=fp32)`` on every
  decoder layer and the root: each layer's all-gather casts the fp32 shards to the compute dtype,
  gradients are reduce-scattered in fp32 into the fp32 shards; no autocast.
- Loading under torchrun (``load_and_shard``): every rank reads the checkpoint in its own dtype
  on the CPU (bf16 for the paper's model: 57 GiB per rank on the host), then each decoder layer is
  upcast to fp32 and sharded in turn, so no rank ever holds a whole fp32 copy; the plan
  (rspo.gpu_memory.plan) counts this host memory.
- The vLLM engine receives the weights in the compute dtype (``checkpoint_weights(dtype=...)``:
  each shard cast before the gather), and ``final/`` is written in it.

One process and transformers' experts: its default ``grouped_mm`` experts implementation is not
autocast-aware (it casts its input to the weights' dtype), so over fp32 master weights it would run
an fp32 grouped GEMM, which the kernels refuse ("Expected inputs of BF16 type": seen in the kernel's
shape check on fake tensors; under FSDP2 the gathered weights are bf16 and the problem does not
arise). ``one_process_mixed`` switches such a model to transformers' eager per-expert loop, whose
``F.linear`` calls autocast casts to bf16.

Deviations: autocast (one process) keeps some ops in fp32 (softmax, norms, losses) where FSDP2's
policy runs a whole layer in bf16, so a bf16 run in one process and under torchrun agree only up
to bf16 rounding (fp32 runs agree as before). ``model.cpu_offload`` (FSDP2 ``CPUOffloadPolicy``:
parameters, gradients and Adam's moments on the host, the optimizer step on the CPU) needs
torchrun and a GPU: it is refused elsewhere.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from rspo.distributed import Dist, shard_model

MASTER_DTYPE = torch.float32


@dataclass(frozen=True)
class Precision:
    """Compute dtype, and whether FSDP2's policy (torchrun) or autocast (one process) applies it."""

    compute: torch.dtype
    """Dtype of the forwards and backwards (``rl.model.dtype``)."""
    device_type: str
    """cpu | cuda: the device of the forwards."""
    sharded: bool
    """FSDP2 (torchrun): the mixed-precision policy casts; no autocast."""

    @classmethod
    def of(cls, dtype: str, device: torch.device, dist: Dist) -> Precision:
        return cls(getattr(torch, dtype), device.type, dist.enabled)

    @property
    def mixed(self) -> bool:
        return self.compute != MASTER_DTYPE

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """The forwards of one process in the compute dtype (a no-op in fp32 and under FSDP2)."""
        if self.mixed and not self.sharded:
            with torch.autocast(self.device_type, dtype=self.compute):
                yield
        else:
            yield

    def fsdp_policy(self):
        """FSDP2's mixed-precision policy: gather in the compute dtype, reduce gradients in fp32."""
        from torch.distributed.fsdp import MixedPrecisionPolicy

        if not self.mixed:
            return MixedPrecisionPolicy()
        return MixedPrecisionPolicy(param_dtype=self.compute, reduce_dtype=MASTER_DTYPE)


def one_process_mixed(model: torch.nn.Module, precision: Precision) -> None:
    """One process under autocast: experts through transformers' eager loop (see the docstring)."""
    if precision.mixed and not precision.sharded and hasattr(model, "set_experts_implementation"):
        if getattr(model.config, "_experts_implementation", None) not in (None, "eager"):
            model.set_experts_implementation("eager")


def load_and_shard(
    path: str,
    precision: Precision,
    dist: Dist,
    device: torch.device,
    *,
    cpu_offload: bool = False,
    prepare: Callable[[torch.nn.Module], None] | None = None,
    random_weights: bool = False,
):
    """The training model with fp32 master weights: in one process loaded in fp32 on ``device``;
    under torchrun read in the checkpoint's dtype on the CPU, then upcast and sharded layer by layer
    (rspo.distributed.shard_model). ``prepare(model)`` runs before sharding (checkpointing flags).
    ``random_weights``: built from the folder's config.json with random weights instead of read
    (rspo preflight and the memory simulation: the shapes without a download)."""
    from rspo.models import load_model

    if random_weights:
        load_model = _random_model

    if cpu_offload and not (dist.enabled and device.type == "cuda"):
        raise ValueError(
            "model.cpu_offload: FSDP2's CPU offload needs torchrun on GPUs (resources.train.processes > 1, "
            "device cuda); without it the parameters already live where the model runs"
        )
    if not dist.enabled:
        model = load_model(path, dtype="float32", device=str(device))
        one_process_mixed(model, precision)
        if prepare is not None:
            prepare(model)
        return model
    model = load_model(path, dtype="auto", device="cpu")  # the checkpoint's own dtype: no fp32 copy yet
    if prepare is not None:
        prepare(model)
    shard_model(
        model, dist, device, master_dtype=MASTER_DTYPE, mp_policy=precision.fsdp_policy(), cpu_offload=cpu_offload
    )
    return model


def _random_model(path: str, dtype: str = "float32", device: str = "cpu"):
    """A model of the folder's config.json with random weights (``dtype`` "auto": the config's)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path)
    if dtype == "auto":
        dtype = str(getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or "float32")
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype.replace("torch.", "")))
