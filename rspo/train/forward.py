"""The policy forward of the old pass and the updates: log-probs of the response tokens, their
entropy, and the router logits / experts of every position, with each prompt computed once per
group of responses.

Rows of the batch layout are LEFT-padded prompts of width P followed by RIGHT-padded responses;
the G responses of a prompt share the prompt tokens. A causal model's hidden states at prompt
positions do not depend on the response, so ``policy_forward`` runs the prompt once per group
(``use_cache=True``), repeats its KV cache for the group's rows (a differentiable gather: in the
backward pass the G rows' gradients flowing into the prompt add up, as they do when the prompt
is computed G times) and runs the responses on top of it. The result is the single full forward's
(up to float rounding from the different batch shapes); on Countdown it skips about a third of
the tokens an update would otherwise process (prompts ~10 tokens, responses ~17). The old pass
and the update forward go through the same code on the same rows, so the on-policy update still
reproduces the old pass bit for bit.

``ForwardSettings.share_prompts=False`` is the plain single forward. The trainer uses it with gradient
checkpointing (which drops the KV cache the shared prompt needs), where the backward recomputes
each layer: the routing hooks and the router capture both stay in place through the caller's
``backward()`` (``rspo.router.routing_control`` takes one cache per forward; the capture stops
recording after the forward but still runs its ops, so the recomputation saves what the forward
saved).

Window: columns [lo, hi) of the layout (``window``) hold every token of the rows; the padding
columns outside are not forwarded (masked padding and causal attention make the trimmed forward
compute the same values).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch.profiler import record_function

from rspo.models import position_ids_from_mask, response_logprobs
from rspo.router import OldRouterCache, RoutingMode, capture_router_logits, routing_control
from rspo.train.chunked_logprobs import lm_head_returns_hidden, response_logprobs_chunked


@dataclass
class PolicyOutputs:
    logp: torch.Tensor
    """(b, r) log-probs of the response tokens under softmax(logits / temperature)."""
    entropy: torch.Tensor | None
    """(b, r) entropy of that distribution, if asked for."""
    router_logits: list[torch.Tensor] | None
    """Per MoE layer, (b * w, E) router logits of every position of the window (w = hi - lo),
    rows in (row, position) order, with their graph; None without ``capture``."""
    router_indices: list[torch.Tensor] | None
    """Per MoE layer, (b * w, K) experts the forward used at those positions."""


def window(attention_mask: torch.Tensor, response_mask: torch.Tensor, prompt_width: int) -> tuple[int, int]:
    """Columns [lo, hi) that hold a token of these rows: from the first prompt column that is not
    padding in every row to the end of the longest response.  (b, P + R), (b, R) -> (lo, hi)"""
    P = prompt_width
    cols = attention_mask[:, :P].any(dim=0)  # (P,)
    lo = int(cols.float().argmax()) if bool(cols.any()) else P - 1
    return lo, P + max(1, int(response_mask.sum(dim=1).max()))


@dataclass(frozen=True)
class Rows:
    """The rows a forward reads, in the batch layout (rspo.rollout: left-padded prompts of width P,
    then right-padded responses)."""

    input_ids: torch.Tensor
    """(b, P + R) token ids."""
    attention_mask: torch.Tensor
    """(b, P + R)."""
    response_mask: torch.Tensor
    """(b, R) the response tokens (up to and including the stop token)."""
    prompt_width: int
    """P."""
    groups: torch.Tensor
    """(b,) the prompt each row answers: rows with equal ids have equal prompt tokens."""
    cache: OldRouterCache | None = None
    """The old router cache of these rows over the full layout width (replay modes only)."""


@dataclass(frozen=True)
class ForwardSettings:
    """How a run forwards its rows, the same for every forward of the run."""

    temperature: float = 1.0
    """Log-probs and entropy of softmax(logits / temperature): the distribution that was sampled."""
    share_prompts: bool = True
    """Each group's prompt once (False: the plain forward, with gradient checkpointing)."""
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    """The context of the model calls (rspo.train.precision: bf16 compute over fp32 weights in one
    process)."""
    logits_chunk: int = 0
    """> 0: log-probs and entropy from the final hidden states that many positions at a time, never
    the whole logits tensor (rspo.train.chunked_logprobs)."""


@contextlib.contextmanager
def policy_forward(
    model,
    rows: Rows,
    settings: ForwardSettings = ForwardSettings(),
    *,
    with_entropy: bool = False,
    capture: bool = False,
    routing: RoutingMode = RoutingMode.NONE,
) -> Iterator[tuple[PolicyOutputs, tuple[int, int]]]:
    """Forward the b ``rows``; a context manager that yields (outputs on the window's response part,
    (lo, hi)). Call ``backward()`` inside the block: with ``share_prompts=False`` the routing hooks
    stay in place for a gradient-checkpointing recomputation. Outputs cover the response columns
    P..hi of the window: logp and entropy are (b, hi - P); ``capture``: the router logits and
    experts of every position; ``routing``: the routing mode of this forward (replay modes read
    ``rows.cache``)."""
    P, temperature = rows.prompt_width, settings.temperature
    lo, hi = window(rows.attention_mask, rows.response_mask, P)
    replay = routing in (RoutingMode.LOGIT_REPLAY, RoutingMode.INDEX_REPLAY, RoutingMode.ROLLOUT_REPLAY)
    win = Window(
        rows.input_ids[:, lo:hi],
        rows.attention_mask[:, lo:hi],
        P,
        lo,
        hi,
        rows.groups,
        rows.cache[:, lo:hi] if replay else None,
    )

    def scores(out_logits, targets, start, head):
        """(log-probs, entropy) of ``targets`` from the logits, or from the hidden states in chunks."""
        if head is None:
            return response_logprobs(out_logits, targets, start, with_entropy, temperature)
        with settings.autocast():
            return response_logprobs_chunked(
                out_logits, head.weight, targets, start, with_entropy, temperature, settings.logits_chunk
            )

    with lm_head_returns_hidden(model) if settings.logits_chunk else contextlib.nullcontext() as head:
        run = _shared_prompt_forward if settings.share_prompts else _rows_forward
        yield from run(
            model,
            win,
            capture,
            routing,
            settings.autocast,
            lambda out_logits, targets, start: scores(out_logits, targets, start, head),
        )


@dataclass(frozen=True)
class Window:
    """The rows' columns [lo, hi) of the layout (``window``), and what the forward needs of them."""

    ids: torch.Tensor
    """(b, w) token ids, w = hi - lo."""
    attn: torch.Tensor
    """(b, w) attention mask."""
    P: int
    """The layout's prompt width: columns [lo, P) of the window are prompt, [P, hi) response."""
    lo: int
    hi: int
    groups: torch.Tensor
    """(b,) the prompt each row answers."""
    cache: OldRouterCache | None
    """The old router cache of the window's columns (replay modes), else None."""


Scores = Callable[[torch.Tensor, torch.Tensor, int], tuple[torch.Tensor, torch.Tensor | None]]


def _rows_forward(
    model, w: Window, capture: bool, routing: RoutingMode, autocast, scores: Scores
) -> Iterator[tuple[PolicyOutputs, tuple[int, int]]]:
    """The plain single forward of the rows (``share_prompts=False``)."""
    # routing and capture hooks both span the caller's backward(): a gradient-checkpointing
    # recomputation must route the same way and run the capture's own ops again (rspo.router)
    with routing_control(model, routing, w.cache):
        with capture_router_logits(model, raw=True) if capture else contextlib.nullcontext() as cap:
            with autocast(), record_function("forward.model"):
                out = model(
                    input_ids=w.ids, attention_mask=w.attn, position_ids=position_ids_from_mask(w.attn), use_cache=False
                )
            if capture:
                cap.stop()  # the recomputation is not recorded
            with record_function("forward.logprobs"):
                logp, ent = scores(out.logits, w.ids, w.P - w.lo)
            outputs = PolicyOutputs(logp, ent, cap.logits if capture else None, cap.indices if capture else None)
            yield outputs, (w.lo, w.hi)


def _shared_prompt_forward(
    model, w: Window, capture: bool, routing: RoutingMode, autocast, scores: Scores
) -> Iterator[tuple[PolicyOutputs, tuple[int, int]]]:
    """Each group's prompt once, its KV cache repeated for the group's rows, the responses on top
    (the module docstring)."""
    from transformers import DynamicCache

    ids, attn, groups = w.ids, w.attn, w.groups
    b, p = ids.shape[0], w.P - w.lo
    uniq, inverse = torch.unique(groups, sorted=False, return_inverse=True)  # inverse: (b,) row -> group slot
    first = torch.empty(len(uniq), dtype=torch.long, device=ids.device)
    first[inverse.flip(0)] = torch.arange(b - 1, -1, -1, device=ids.device)  # each group's first row
    p_ids, p_attn = ids[first, :p], attn[first, :p]  # (u, p)
    with contextlib.ExitStack() as stack:
        cap = stack.enter_context(capture_router_logits(model, raw=True)) if capture else None
        kv = DynamicCache(config=model.config)
        with (
            routing_control(model, routing, w.cache[first, :p] if w.cache is not None else None),
            autocast(),
            record_function("forward.model"),
        ):
            out_p = model(
                input_ids=p_ids,
                attention_mask=p_attn,
                position_ids=position_ids_from_mask(p_attn),
                past_key_values=kv,
                use_cache=True,
                logits_to_keep=1,
            )
        kv = out_p.past_key_values
        kv.batch_select_indices(inverse)  # (u, ...) -> (b, ...): a differentiable gather
        pos = position_ids_from_mask(attn)[:, p:]
        with (
            routing_control(model, routing, w.cache[:, p:] if w.cache is not None else None),
            autocast(),
            record_function("forward.model"),
        ):
            out_r = model(
                input_ids=ids[:, p:], attention_mask=attn, position_ids=pos, past_key_values=kv, use_cache=True
            )
    # the prompt's last position predicts the first response token, response positions the others
    logits = torch.cat([out_p.logits[inverse], out_r.logits], dim=1)  # (b, 1 + r, V) (or hidden states)
    with record_function("forward.logprobs"):
        logp, ent = scores(logits, ids[:, p - 1 :], 1)  # (b, r)
    router_logits = router_indices = None
    if capture:

        def rows(prompt_part: torch.Tensor, resp_part: torch.Tensor) -> torch.Tensor:
            d = prompt_part.shape[-1]
            full = torch.cat([prompt_part.view(len(uniq), p, d)[inverse], resp_part.view(b, w.hi - w.P, d)], dim=1)
            return full.reshape(b * (w.hi - w.lo), d)  # (b * w, d)

        if cap.num_calls != 2:
            raise RuntimeError(f"expected one router call per layer and forward, got {cap.num_calls}")
        router_logits = [rows(*calls) for calls in cap.logits_per_call]
        router_indices = [rows(*calls) for calls in cap.indices_per_call]
    yield PolicyOutputs(logp, ent, router_logits, router_indices), (w.lo, w.hi)
