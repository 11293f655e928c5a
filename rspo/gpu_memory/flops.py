"""Model FLOPs of the update and its model-FLOPs utilisation (MFU), for ``rspo preflight``.

A training token costs 6 FLOPs per active matrix parameter (forward 2, backward 4; Kaplan et al.
2020, as PaLM's MFU counts them) plus the attention's own products, 12 x layers x (heads x head_dim)
x the positions it attends to (forward 4: QK^T and AV; backward 8), on average (L + 1) / 2 for a
causal row of L tokens. The active matrix parameters of an MoE layer are its attention, its router,
``top_k`` of its experts and its shared expert; the embedding is a lookup (no FLOPs), the LM head a
product (vocab x hidden). Gradient checkpointing's recomputed forward is not counted (model FLOPs,
not hardware FLOPs), nor the old pass (its own phase), norms, activations and the loss.

The peak is the datasheet's dense bf16 rate without sparsity (``PEAK_BF16``), as MFU is usually
quoted; scripts/moe_block_check.py measures a large bf16 matrix product on the GPU at hand, the
practical ceiling (docs/cluster.md has what a lent H200 gave).
"""

from __future__ import annotations

from rspo.gpu_memory.shape import ModelShape

__all__ = ["PEAK_BF16", "active_matrix_params", "training_flops_per_token", "update_mfu"]

PEAK_BF16: dict[str, float] = {  # dense bf16 FLOP/s, datasheet (SXM parts)
    "h100-80gb": 989.4e12,
    "h200-141gb": 989.4e12,
    "a100-80gb": 312e12,
}


def active_matrix_params(shape: ModelShape) -> int:
    """Matrix parameters one token passes through: the decoder layers' with only ``top_k`` of each
    MoE layer's experts, plus the LM head (the embedding is not a product; the layers' norms, a few
    thousand weights, are counted with them)."""
    in_layers = shape.params - shape.root_params
    idle_experts = shape.moe_layers * (shape.experts - shape.top_k) * 3 * shape.hidden * shape.moe_inter
    return in_layers - idle_experts + shape.vocab * shape.hidden


def training_flops_per_token(shape: ModelShape, mean_row_tokens: float) -> float:
    """Forward + backward model FLOPs of one token in rows of ``mean_row_tokens`` tokens."""
    attended = (mean_row_tokens + 1) / 2
    return 6.0 * active_matrix_params(shape) + 12.0 * shape.layers * shape.heads * shape.head_dim * attended


def update_mfu(shape: ModelShape, tokens: float, rows: float, seconds: float, gpu: str) -> dict[str, float] | None:
    """The update phase's achieved TFLOP/s and MFU per GPU (``tokens`` over ``rows`` in ``seconds`` on one
    GPU), or None on an unknown GPU or an empty phase."""
    if gpu not in PEAK_BF16 or seconds <= 0 or tokens <= 0 or rows <= 0:
        return None
    flops = training_flops_per_token(shape, tokens / rows) * tokens
    achieved = flops / seconds
    return {"update_tflops": float(f"{achieved / 1e12:.4g}"), "update_mfu": float(f"{achieved / PEAK_BF16[gpu]:.4g}")}
