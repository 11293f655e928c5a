"""Token-bounded micro-batches of an update and the merge of their metrics.

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

Each micro-batch's metrics are (value, responses, tokens); ``merge_micro_metrics`` weights token means
by tokens and response means by responses, so the logged number does not depend on the split.
"""

from __future__ import annotations

import torch

from rspo.method import OBJECTIVES
from rspo.run_record import GAMMA, GAMMA_UNDER, PG_CLIPFRAC, PPO_KL


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
TOKEN_METRICS = frozenset({PPO_KL, PG_CLIPFRAC, GAMMA, GAMMA_UNDER})


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
        k: weighted_mean(v, k in TOKEN_METRICS and not (k == PG_CLIPFRAC and by_sequence)) for k, v in metrics.items()
    }
