"""Test oracles for rspo.router: the plain fp32 router-shift ratio straight from the paper's
equations, and a one-call old-policy pass that builds the router cache. The library's own paths
(``router_shift_ratio`` on the compact cache, the trainer's old pass) are checked against them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rspo.router import OldRouterCache, capture_router_logits, router_spec


def forward_with_router_cache(
    model: nn.Module,
    *,
    logp_dtype: torch.dtype = torch.float16,
    keep_logits: bool = False,
    **model_inputs: Any,
) -> tuple[Any, OldRouterCache]:
    """The old-policy pass: a no-grad ``model(**model_inputs)`` with router capture.

    Returns (model outputs, OldRouterCache) where the cache holds the experts the forward used and
    their fp32 log-probs stored in ``logp_dtype`` (plus the fp32 logits if ``keep_logits``). The
    batch shape (B, T) is read from ``input_ids`` or ``inputs_embeds``.
    """
    ref = model_inputs.get("input_ids")
    if ref is None:
        ref = model_inputs.get("inputs_embeds")
    if ref is None or ref.dim() < 2:
        raise ValueError("forward_with_router_cache needs input_ids (B, T) or inputs_embeds (B, T, H)")
    B, T = int(ref.shape[0]), int(ref.shape[1])
    spec = router_spec(model)
    with torch.no_grad(), capture_router_logits(model, detach=True) as cap:
        outputs = model(**model_inputs)
    if cap.num_calls != 1:
        raise RuntimeError(f"expected one router call per layer in the old forward, got {cap.num_calls}")
    cache = OldRouterCache.from_logits(
        cap.logits, spec.top_k, (B, T), indices_list=cap.indices, logp_dtype=logp_dtype, keep_logits=keep_logits
    )
    return outputs, cache


def shift_ratio(old_logits: Sequence[Tensor], new_logits: Sequence[Tensor], top_k: int) -> Tensor:
    """gamma (N,) of Eq. (7, router_shift_ratio), straight from the equations in fp32.

    old_logits, new_logits: one (N, E) tensor per MoE layer. e_old = the top_k experts of
    softmax(old). No rounding: this is the reference the cached path is checked against.
    Differentiable w.r.t. new_logits.
    """
    if len(old_logits) == 0 or len(old_logits) != len(new_logits):
        raise ValueError(f"need the same nonzero number of layers, got {len(old_logits)} old and {len(new_logits)} new")
    ds = []
    for l, (lo, ln) in enumerate(zip(old_logits, new_logits)):
        if lo.dim() != 2 or lo.shape != ln.shape:
            raise ValueError(
                f"layer {l}: old and new logits must both be (N, E); got {tuple(lo.shape)} and {tuple(ln.shape)}"
            )
        if not 1 <= top_k <= lo.shape[-1]:
            raise ValueError(f"top_k={top_k} must be in [1, {lo.shape[-1]}]")
        lp_old = F.log_softmax(lo.float(), dim=-1)  # (N, E)
        lp_new = F.log_softmax(ln.float(), dim=-1)  # (N, E)
        e_old = torch.topk(lp_old.exp(), top_k, dim=-1).indices  # (N, K)
        ds.append((lp_new.gather(-1, e_old) - lp_old.gather(-1, e_old)).abs().mean(-1))  # (N,) d[l]
    delta = torch.stack(ds).mean(0)  # (N,)  Delta
    return torch.exp(-delta)  # (N,)  gamma
