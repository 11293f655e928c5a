"""FP8 rollout weights for the hf backend (``rollout.dtype: fp8``; beyond the paper, docs/mismatch.md).

Several RL stacks sample with an FP8 engine and train in bf16/fp32 (vLLM's ``quantization="fp8"``;
verl's and slime's FP8 rollouts), the largest train-inference mismatch a user meets, and the one the
rollout corrections (TIS, MIS) were written for. This is that engine on the hf backend: while it
decodes, every weight matrix of the decoder layers is rounded to FP8 E4M3 with one scale per tensor
(per expert for the fused expert weights), amax / 448 as vLLM's dynamic FP8 weight quantization
computes it, and the arithmetic runs under bf16 autocast. As in vLLM's FP8 MoE models, the routers
(``rspo.router.moe_gates``), the shared expert's gate, the embeddings, the norms and the LM head stay
as they are. The trainer's weights are put back, bit for bit, when the decoding ends.

Deviation from a real FP8 engine: the weights are rounded and then computed in bf16 (a weight-only
"W8A16" engine, as vLLM's Marlin FP8 path on GPUs without FP8 units); Hopper's W8A8 path also rounds
the activations to FP8. On a GPU, use the vLLM backend with its own quantization instead: this
setting is refused there (not wired: no FP8 engine can be tested on this project's CPUs).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from rspo.router import moe_gates

E4M3_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max


def round_to_fp8(w: torch.Tensor) -> torch.Tensor:
    """``w`` rounded to FP8 E4M3 with a per-tensor scale (per leading index for a 3-D expert stack),
    returned in ``w``'s dtype."""
    dims = tuple(range(1, w.dim())) if w.dim() == 3 else tuple(range(w.dim()))
    amax = w.detach().abs().amax(dim=dims, keepdim=True).float().clamp(min=1e-12)
    scale = amax / E4M3_MAX
    return ((w.float() / scale).to(torch.float8_e4m3fn).float() * scale).to(w.dtype)


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


@contextlib.contextmanager
def fp8_weights(model: torch.nn.Module) -> Iterator[None]:
    """The model's decoder weights rounded to FP8 inside the block (see the module docstring); the
    original tensors are put back after it, whatever happens inside."""
    params = dict(model.named_parameters())
    kept: dict[str, torch.Tensor] = {}
    try:
        with torch.no_grad():
            for name in quantized_names(model):
                p = params[name]
                kept[name] = p.data
                p.data = round_to_fp8(p.data)
        yield
    finally:
        for name, data in kept.items():
            params[name].data = data
