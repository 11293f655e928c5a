"""Log-probs of the sampled tokens without the whole logits tensor.

Log-probs without the logits (``model.logits_chunk_tokens``): transformers' forward computes the
logits of every position at once (b x T x V in the compute dtype, then fp32 copies for the
log-softmax and the entropy: about 594 KiB per token in fp32 at Qwen3's 151,936-token vocabulary).
``lm_head_returns_hidden`` makes the LM head hand back its input (the final hidden states) and
remember the weight it was called with; ``response_logprobs_chunked`` then computes the log-probs
of the sampled tokens and the entropy ``chunk`` positions at a time, each chunk under
``torch.utils.checkpoint`` so its logits are recomputed in backward instead of kept. Values equal
``rspo.models.response_logprobs`` up to float rounding (log-sum-exp form instead of
``log_softmax``). Under FSDP2 the LM head belongs to the root unit, whose parameters stay gathered
from its forward to its backward; its gradient is reduced at the end of backward as usual (tested
against the unchunked path on 2 gloo ranks).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


@contextlib.contextmanager
def lm_head_returns_hidden(model: torch.nn.Module) -> Iterator[SimpleNamespace]:
    """Inside the block, the model's LM head returns its input (the final hidden states, in the
    output's ``logits`` field) and records the weight it was called with (``.weight``)."""
    head = model.get_output_embeddings()
    if getattr(head, "bias", None) is not None:
        raise ValueError("model.logits_chunk_tokens: an LM head with a bias is not supported")
    seen = SimpleNamespace(weight=None)

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        seen.weight = head.weight
        return hidden

    head.forward = forward
    try:
        yield seen
    finally:
        del head.forward


def _score_chunk(hidden, weight, targets, temperature: float, with_entropy: bool):
    logits = F.linear(hidden, weight).float()  # (n, V)
    if temperature != 1.0:
        logits = logits / temperature
    lse = torch.logsumexp(logits, dim=-1)  # (n,)
    logp = logits.gather(-1, targets[:, None]).squeeze(-1) - lse
    if not with_entropy:
        return logp, None
    ent = lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)  # -sum p log p
    return logp, ent


def response_logprobs_chunked(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    input_ids: torch.Tensor,
    prompt_width: int,
    with_entropy: bool,
    temperature: float,
    chunk: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``rspo.models.response_logprobs`` from the final hidden states, ``chunk`` positions at a
    time (each recomputed in backward).  (B, P+R, H) -> (B, R) [, (B, R)]"""
    h = hidden[:, prompt_width - 1 : -1]  # (B, R, H): positions that predict the response tokens
    B, R, H = h.shape
    targets = input_ids[:, prompt_width:].reshape(-1)
    flat = h.reshape(B * R, H)
    logps, ents = [], []
    for i in range(0, B * R, chunk):
        args = (flat[i : i + chunk], weight, targets[i : i + chunk], temperature, with_entropy)
        grad = torch.is_grad_enabled()
        lp, ent = checkpoint(_score_chunk, *args, use_reentrant=False) if grad else _score_chunk(*args)
        logps.append(lp)
        ents.append(ent)
    logp = torch.cat(logps).view(B, R)
    return logp, (torch.cat(ents).view(B, R) if with_entropy else None)
