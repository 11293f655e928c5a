"""Gradient checkpointing of the old pass and the updates.

Gradient checkpointing (``enable_activation_checkpointing``): transformers' per-decoder-layer
checkpointing in its non-reentrant form (``use_reentrant=False``, transformers' own default in 5.x,
set explicitly here). The router capture (``rspo.router.capture_router_logits``) computes its
logits inside the checkpointed layer and needs them to keep their autograd graph, which reentrant
checkpointing would cut; the capture and routing hooks stay in place through ``backward()`` so the
recomputation runs the same ops (``rspo.train.forward``).

The other parts of a step's activation memory have their own modules: token-bounded micro-batches
(rspo.train.micro_batches), log-probs without the whole logits tensor (rspo.train.chunked_logprobs)
and the old-router cache's rows (rspo.train.row_cache).
"""

from __future__ import annotations

import torch


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Non-reentrant checkpointing of every decoder layer (transformers' layer wrappers)."""
    kwargs = {"use_reentrant": False}
    enable = getattr(model, "activation_checkpointing_enable", None)  # transformers >= 5.23
    if enable is not None:
        enable(activation_checkpointing_kwargs=kwargs)
    else:  # transformers 5.19 - 5.22
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
