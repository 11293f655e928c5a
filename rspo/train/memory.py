"""Activation memory of the old pass and the updates: gradient checkpointing, token-bounded
micro-batches, log-probs without the whole logits tensor, and where the old-router cache lives.

Gradient checkpointing (``enable_activation_checkpointing``): transformers' per-decoder-layer
checkpointing in its non-reentrant form (``use_reentrant=False``, transformers' own default in 5.x,
set explicitly here). The router capture (``rspo.router.capture_router_logits``) computes its
logits inside the checkpointed layer and needs them to keep their autograd graph, which reentrant
checkpointing would cut; the capture and routing hooks stay in place through ``backward()`` so the
recomputation runs the same ops (``rspo.train.forward``).

Token-bounded micro-batches (``pack_micro_batches``, ``schedule.max_tokens_per_micro_batch``): the
rows of a rank's share of a mini-batch, longest first, are packed greedily so that a forward holds
at most that many tokens, counted as the forward sees them (rows x the widest row's width, padding
included). A row longer than the budget gets a micro-batch of its own. Gradients accumulate over
the micro-batches and each micro-batch's loss is scaled by its share of the mini-batch's non-empty
responses (rspo.train.trainer): GRPO (mean over responses of token means), GSPO and GMPO
(sequence terms, mean over responses) are all means over responses, so the accumulated gradient is
the whole mini-batch's for any split. Not split-invariant: the load-balancing aux loss (a product
of two means over the pooled tokens), as with ``micro_batch_size``. Under torchrun every rank must
run as many forwards as the others (each is a collective under FSDP2): ranks with fewer micro-batches
run empty ones (a forward whose loss is multiplied by 0).

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

The old-router cache (``RowCache``): the compact cache (rspo.router.OldRouterCache, 3 bytes per
token, layer and k) for the rows this rank reads, on the CPU (in host buffers pinned once next to a
GPU and reused every step: ``HostBuffers``); each
micro-batch's slice moves to the device when it is used. Under torchrun with one PPO epoch a rank
reads only the rows it updates, which are the rows its old pass computed, so it holds 1/world of
the step's rows and nothing is exchanged; with more epochs every rank needs every row, and the
cache is summed over the ranks one layer at a time.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from rspo.method import OBJECTIVES
from rspo.phase_memory import host_allocation
from rspo.router import OldRouterCache


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Non-reentrant checkpointing of every decoder layer (transformers' layer wrappers)."""
    kwargs = {"use_reentrant": False}
    enable = getattr(model, "activation_checkpointing_enable", None)  # transformers >= 5.23
    if enable is not None:
        enable(activation_checkpointing_kwargs=kwargs)
    else:  # transformers 5.19 - 5.22
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


# ------------------------------------------------------------------------------ micro-batches


def row_tokens(attention_mask: torch.Tensor, response_mask: torch.Tensor, prompt_width: int) -> torch.Tensor:
    """Tokens of each row as a forward sees them: from its first prompt token to its last
    response token.  (B, P + R), (B, R) -> (B,)"""
    P = prompt_width
    first = attention_mask[:, :P].float().argmax(dim=1)  # first non-padding prompt column
    return (P - first) + response_mask.sum(dim=1).long()


def pack_micro_batches(rows: torch.Tensor, lengths: torch.Tensor, budget: int, max_rows: int = 0) -> list[torch.Tensor]:
    """Rows packed longest first so that rows x the longest row's tokens <= ``budget`` (and at
    most ``max_rows`` rows when > 0). ``lengths``: the tokens of every row of the batch (row_tokens)."""
    order = sorted(rows.tolist(), key=lambda r: (-int(lengths[r]), r))
    out: list[list[int]] = []
    for r in order:
        if out:
            cur = out[-1]
            width = int(lengths[cur[0]])  # longest first: the first row is the widest
            if (len(cur) + 1) * width <= budget and (not max_rows or len(cur) < max_rows):
                cur.append(r)
                continue
        out.append([r])
    return [torch.tensor(sorted(mb), dtype=rows.dtype) for mb in out]


# Metrics that are means over response tokens (rspo.losses); the others are means over responses.
TOKEN_METRICS = frozenset({"actor/ppo_kl", "actor/pg_clipfrac", "router/shift_ratio_mean", "router/shift_clipfrac"})


def weighted_mean(values: list[tuple[float, int, int]], by_tokens: bool = False) -> float:
    """The mini-batch's value from its micro-batches' (value, valid responses, valid tokens):
    token means weighted by tokens, response means by responses, so the logged number does not
    depend on how the rows were split (over micro-batches or ranks). One value is returned as it is."""
    if len(values) == 1:
        return values[0][0]
    w = [(t if by_tokens else r) for _, r, t in values]
    if sum(w) == 0:
        return sum(v for v, _, _ in values) / len(values)
    return sum(v * x for (v, _, _), x in zip(values, w)) / sum(w)


def merge_micro_metrics(metrics: dict[str, list[tuple[float, int, int]]], algo: str) -> dict[str, float]:
    """One update's metrics from its micro-batches' (a loss whose clip fraction counts responses,
    GSPO's, has it merged as a mean over responses: rspo.method.Objective.clip_unit)."""
    by_sequence = OBJECTIVES[algo].clip_unit == "sequence"
    return {
        k: weighted_mean(v, k in TOKEN_METRICS and not (k == "actor/pg_clipfrac" and by_sequence))
        for k, v in metrics.items()
    }


# ------------------------------------------------------------------------------ chunked log-probs


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


# ------------------------------------------------------------------------------ old-router cache


class HostBuffers:
    """Host buffers allocated once and reused by every step's old-router cache.

    Next to a GPU they are pinned (page-locked), so the cache's slices copy to the device without a
    staging copy. Pinning locks the pages (about 1.3 GB per rank and step at the paper's sizes), so
    the buffers are pinned once: the first request of a name reserves ``headroom`` times its size
    (the trainer passes the longest row the run can have over this step's), and a buffer is
    allocated again only when a request exceeds it. ``zeros(name, shape, dtype)`` returns a zeroed
    view of the buffer called ``name``."""

    def __init__(self, pin: bool) -> None:
        self.pin = pin
        self.flat: dict[str, torch.Tensor] = {}
        self.allocations = 0  # how many buffers were allocated, hence pinned (tests read it)

    def zeros(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, headroom: float = 1.0) -> torch.Tensor:
        n = math.prod(shape)
        buf = self.flat.get(name)
        if buf is None or buf.numel() < n or buf.dtype != dtype:
            with host_allocation():
                buf = torch.empty(max(n, int(n * headroom)), dtype=dtype, pin_memory=self.pin)
            self.flat[name] = buf
            self.allocations += 1
        view = buf[:n].view(shape)
        view.zero_()
        return view

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.flat.values())


@dataclass
class RowCache:
    """An OldRouterCache of some rows of the step batch, indexed by the batch's own row numbers.

    ``slot[row]`` is the cache row of batch row ``row`` (-1: not held here). ``cache[rows]``,
    ``cache[rows, cols]``, ``assign(rows, part)`` take batch rows, as OldRouterCache's own do."""

    cache: OldRouterCache
    slot: torch.Tensor

    @classmethod
    def zeros(
        cls,
        rows: torch.Tensor,
        batch_rows: int,
        width: int,
        num_layers: int,
        top_k: int,
        num_experts: int,
        *,
        keep_logits: bool,
        buffers: HostBuffers | None = None,
        max_width: int = 0,
    ) -> RowCache:
        """Zeros for ``rows`` of a step batch of ``batch_rows`` x ``width``; in ``buffers`` (reused,
        pinned next to a GPU; sized for rows of ``max_width`` the first time) when given, else new
        CPU tensors."""
        slot = torch.full((batch_rows,), -1, dtype=torch.long)
        slot[rows] = torch.arange(len(rows))
        cache = OldRouterCache.zeros(
            num_layers,
            (len(rows), width),
            top_k,
            num_experts,
            keep_logits=keep_logits,
            device="cpu",
            alloc=None if buffers is None else partial(buffers.zeros, headroom=max(1.0, max_width / width)),
        )
        return cls(cache, slot)

    def _slots(self, rows: torch.Tensor) -> torch.Tensor:
        s = self.slot[rows.cpu()]
        if bool((s < 0).any()):
            raise IndexError("the old-router cache does not hold these rows on this rank")
        return s

    def __getitem__(self, key) -> OldRouterCache:
        if isinstance(key, tuple):
            rows, cols = key
            return self.cache[self._slots(rows), cols]
        return self.cache[self._slots(key)]

    def assign(self, rows: torch.Tensor, part: OldRouterCache) -> None:
        self.cache.assign(self._slots(rows), part)

    @property
    def nbytes(self) -> int:
        return self.cache.nbytes

    @property
    def bytes_per_entry(self) -> float:
        return self.cache.bytes_per_entry

    def all_reduce(self, dist) -> None:
        """Sum over the ranks (each row was written by one rank, zeros elsewhere), a layer at a
        time, so a GPU collective moves one layer's slice, not the whole cache."""
        for t in (self.cache.indices, self.cache.logp, self.cache.logits):
            if t is not None:
                for layer in range(t.shape[0]):
                    dist.all_reduce_sum_(t[layer])
