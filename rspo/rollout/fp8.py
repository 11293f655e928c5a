"""FP8 rollouts for the hf backend (``rollout.dtype: fp8``; beyond the paper, docs/mismatch.md).

Several RL stacks sample with an FP8 engine and train in bf16/fp32 (vLLM's ``quantization="fp8"``;
verl's and slime's FP8 rollouts), the largest train-inference mismatch a user meets, and the one the
rollout corrections (TIS, MIS) were written for. This is that engine on the hf backend, as it runs
on a Hopper GPU (W8A8): while it decodes,
- every weight matrix of the decoder layers is rounded to FP8 E4M3 with one scale per tensor (per
  expert for the fused expert stacks), amax / 448 as vLLM's dynamic FP8 weight quantization computes it;
- the input of every matrix product with one of those weights is rounded to E4M3 too, with one
  dynamic scale per row (per token), as the FP8 GEMM's activation quantization does;
- the arithmetic itself runs under bf16 autocast (the GEMM's bf16 output).
As in vLLM's FP8 MoE models, the routers (``rspo.router.moe_gates``), the shared expert's gate, the
embeddings, the norms and the LM head stay as they are, and their inputs too. The trainer's weights
are put back, bit for bit, when the decoding ends.

How: the weights are swapped for their rounded copies; a ``TorchFunctionMode`` rounds the input of
each ``F.linear`` whose weight lies in one of them (a slice of an expert stack included), and the
model's experts run transformers' eager per-expert loop while it decodes (its grouped-GEMM paths do
not go through ``F.linear``). Deviations from a real FP8 engine: the rounded values are multiplied in
bf16, not by FP8 tensor cores (the rounding is the same, the accumulation order is not); vLLM picks
per-tensor or per-token activation scales by kernel, here always per token. On a GPU use the vLLM
backend with its own quantization: this setting is refused there (not wired: no FP8 engine can be
tested on this project's CPUs).

Measured (docs/mismatch.md): the engine-vs-trainer k3 KL of the small study's base model in its first
4 steps, 2.3e-3 mean (bf16 autocast: 1.3e-4; the weights alone in FP8: 8.3e-4). Against a real FP8
GEMM (``torch._scaled_mm`` on an H200's tensor cores, same E4M3 values and scales; test_fp8): the
engine's product differs by 0.31% (relative norm), FP8's own rounding changes it by 3.6%.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from rspo.router import moe_gates

E4M3_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max


def _round(x: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """``x`` rounded to FP8 E4M3 with one scale (amax over ``dims`` / 448) per slice, in its dtype."""
    amax = x.detach().abs().amax(dim=dims, keepdim=True).float().clamp(min=1e-12)
    scale = amax / E4M3_MAX
    return ((x.float() / scale).to(torch.float8_e4m3fn).float() * scale).to(x.dtype)


def round_to_fp8(w: torch.Tensor) -> torch.Tensor:
    """A weight rounded with a per-tensor scale (per leading index for a 3-D expert stack)."""
    return _round(w, tuple(range(1, w.dim())) if w.dim() == 3 else tuple(range(w.dim())))


def round_rows_to_fp8(x: torch.Tensor) -> torch.Tensor:
    """An input rounded with one scale per row (the last dimension's amax / 448)."""
    return _round(x, (-1,))


def quantized_names(model: torch.nn.Module) -> list[str]:
    """The parameters an FP8 engine holds in FP8: matrices (and expert stacks) of the decoder layers,
    not the routers, the shared expert's gate, the embeddings, the norms or the LM head."""
    router_params = {id(p) for gate in moe_gates(model) for p in gate.parameters()}
    out = []
    for name, p in model.named_parameters():
        if ".layers." not in f".{name}" or p.dim() < 2 or p.numel() == 0:
            continue
        if id(p) in router_params or "shared_expert_gate" in name:
            continue
        out.append(name)
    return out


class _RoundInputs(TorchFunctionMode):
    """Rounds the input of each ``F.linear`` whose weight lies in one of the byte ranges given."""

    def __init__(self, ranges: list[tuple[int, int]]) -> None:
        super().__init__()
        self.ranges = ranges

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear and len(args) >= 2 and args[0].numel():
            ptr = args[1].data_ptr()
            if any(lo <= ptr < hi for lo, hi in self.ranges):
                args = (round_rows_to_fp8(args[0]), *args[1:])
        return func(*args, **kwargs)


@contextlib.contextmanager
def fp8_weights(model: torch.nn.Module) -> Iterator[None]:
    """The model as an FP8 (W8A8) engine inside the block (see the module docstring); the original
    weights and experts implementation are put back after it, whatever happens inside."""
    params = dict(model.named_parameters())
    kept: dict[str, torch.Tensor] = {}
    experts = getattr(model.config, "_experts_implementation", None)
    switch = hasattr(model, "set_experts_implementation") and experts not in (None, "eager")
    try:
        if switch:
            model.set_experts_implementation("eager")
        with torch.no_grad():
            for name in quantized_names(model):
                p = params[name]
                kept[name] = p.data
                p.data = round_to_fp8(p.data)
        ranges = [(p.data_ptr(), p.data_ptr() + p.numel() * p.element_size()) for p in (params[n] for n in kept)]
        with _RoundInputs(ranges):
            yield
    finally:
        for name, data in kept.items():
            params[name].data = data
        if switch:
            model.set_experts_implementation(experts)
