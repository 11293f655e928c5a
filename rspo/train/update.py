"""One micro-batch's loss in the trainer's update: what a reader compares with the paper line by line.

``StepTensors`` holds what every update of a step reads (the rollout batch, its advantages, the old
pass's log-probs, entropy and router cache); ``micro_batch_loss`` turns one update forward of some
rows into their loss and metrics: gamma from the old router cache and the current router logits
(Eq. 7), the policy loss of the algorithm with RS inside its clip and any rollout correction outside
it (rspo.losses.compute_policy_loss), the router diagnostics for runs without RS, the entropy bonus
and the load-balancing term. The trainer (rspo.train.trainer) owns the loop around it: micro-batches,
the scaling to the global mini-batch, backward, clipping and the optimizer step.

No deviation from the paper here; the choices are rspo.losses' and rspo.train.trainer's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rspo.config import AlgorithmConfig
from rspo.losses import compute_policy_loss, router_shift_stats, router_shift_sums, seq_mean_token_mean
from rspo.models import load_balancing_loss, response_slice
from rspo.rollout import RolloutBatch
from rspo.router import router_shift_ratio
from rspo.train.memory import RowCache

__all__ = ["StepTensors", "micro_batch_loss"]


@dataclass
class StepTensors:
    """The tensors of one rollout step that its updates read.

    ``old_logp`` and ``entropy`` are (B, R) over the response columns, ``cache`` the old router cache
    of the rows this rank reads (None when no run setting needs it). The on-policy first mini-batch,
    when the trainer skips its old pass, fills its rows of all three in its own update
    (``Trainer._update_micro`` with ``record``)."""

    batch: RolloutBatch
    adv: torch.Tensor
    old_logp: torch.Tensor
    entropy: torch.Tensor
    cache: RowCache | None


def micro_batch_loss(
    algo: AlgorithmConfig, top_k: int, st: StepTensors, rows: torch.Tensor, out, lo: int, hi: int
) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss of ``rows`` from their update forward ``out`` (rspo.train.forward.policy_forward over
    the columns ``lo:hi``) and its metrics. Raises rspo.losses.NonFiniteLogProbError as the policy
    loss does; the trainer turns that into a skipped update on every rank."""
    batch = st.batch
    P = batch.prompt_width
    r = hi - P
    mask = batch.response_mask[rows, :r]
    gamma = None
    if st.cache is not None:
        # gamma over every position of the window, then the positions that predict response tokens
        keep_graph = algo.router_shift and not algo.stop_gradient  # only the no-stop-gradient ablation
        with torch.set_grad_enabled(keep_graph):
            gamma_full = router_shift_ratio(st.cache[rows, lo:hi], out.router_logits)  # (b, hi - lo)
        gamma = response_slice(gamma_full, P - lo)  # (b, r)
    engine = batch.engine_logp
    loss, m = compute_policy_loss(
        algo.algo,
        out.logp,
        st.old_logp[rows, :r],
        st.adv[rows],
        mask,
        gamma=gamma if algo.router_shift else None,
        gamma_min=algo.gamma_min,
        stop_gradient=algo.stop_gradient,
        clip_low=algo.clip_low,
        clip_high=algo.clip_high,
        engine_log_prob=None if engine is None else engine[rows, :r].to(out.logp.device),
        correction=algo.rollout_correction,
        correction_low=algo.rollout_correction_low,
        correction_high=algo.rollout_correction_high,
    )
    if gamma is not None and not algo.router_shift:  # diagnostics for every run, as in the loss
        m.update(router_shift_stats(router_shift_sums(gamma, mask.bool(), algo.gamma_min)))
    if algo.entropy_coef > 0:  # a mean over responses like the policy loss, so micro-batching is exact
        loss = loss - algo.entropy_coef * seq_mean_token_mean(out.entropy, mask.bool())
    if algo.router_aux_loss_coef > 0:
        aux = load_balancing_loss(out.router_logits, top_k, batch.attention_mask[rows, lo:hi])
        loss = loss + algo.router_aux_loss_coef * aux
        m["actor/router_aux_loss"] = float(aux.detach())
    return loss, m
