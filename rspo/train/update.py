"""The updates of one rollout step: what a reader compares with the paper line by line.

``StepTensors`` (rspo.train.policy) holds what every update of a step reads (the rollout batch, its
advantages, the old pass's log-probs, entropy and router cache). ``update_step`` is the loop, top to bottom: for each
epoch and mini-batch, its micro-batches (forward under the routing mode, loss, backward), the
gradient clip and the optimizer step. ``micro_batch_loss`` turns one update forward of some rows
into their loss and metrics: gamma from the old router cache and the current router logits (Eq. 7),
the policy loss of the algorithm with RS inside its clip and any rollout correction outside it
(rspo.losses.compute_policy_loss), the router diagnostics for runs without RS, the entropy bonus and
the load-balancing term. The policy (rspo.train.policy) holds the model, the optimizer and the
micro-batches, and runs the old pass before this loop; the loop reads it and changes it only
through its methods (``zero_grad``, ``clip_gradients``, ``apply_update``, ``skip_update``).

The on-policy first mini-batch of a step (``Policy.onpolicy_shortcut``) is a value of the same
path (``record``): its update forward records the old log-probs, entropy and router cache of its
rows before the loss, since theta == theta_old there.

No deviation from the paper here; the choices are rspo.losses' and rspo.train.trainer's.
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch.profiler import record_function

from rspo.config import AlgorithmConfig
from rspo.losses import (
    NonFiniteLogProbError,
    compute_policy_loss,
    correction_metrics,
    rollout_correction,
    router_shift_log_weight,
    router_shift_metrics,
    seq_mean_token_mean,
)
from rspo.models import load_balancing_loss, response_slice
from rspo.phase_memory import return_cached_blocks
from rspo.router import router_shift_ratio
from rspo.train.micro_batches import merge_micro_metrics
from rspo.train.policy import Policy, StepTensors

__all__ = ["micro_batch_loss", "update_mini_batch", "update_step"]


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
    old = st.old_logp[rows, :r]
    log_gamma = weight = None
    if algo.router_shift:  # sg(max(gamma, gamma_min)), Eq. 9, enters the log-ratio inside the clip (Eq. 11)
        log_gamma = router_shift_log_weight(gamma, mask.bool(), algo.gamma_min, algo.stop_gradient, out.logp.dtype)
    if algo.rollout_correction != "none":  # omega, outside the clip (beyond the paper; rspo.losses)
        engine = batch.engine_logp[rows, :r].to(out.logp.device) if batch.engine_logp is not None else None
        weight = rollout_correction(
            algo.rollout_correction, old, engine, mask, algo.rollout_correction_low, algo.rollout_correction_high
        ).to(out.logp.dtype)
    clip = (algo.clip_low, algo.clip_high)
    loss, m = compute_policy_loss(
        algo.algo, out.logp, old, st.adv[rows], mask, log_gamma=log_gamma, weight=weight, clip=clip
    )
    if gamma is not None:  # the router diagnostics of every run, RS or not
        m.update(router_shift_metrics(gamma, mask, algo.gamma_min))
    if weight is not None:
        m.update(correction_metrics(weight, mask))
    if algo.entropy_coef > 0:  # a mean over responses like the policy loss, so micro-batching is exact
        loss = loss - algo.entropy_coef * seq_mean_token_mean(out.entropy, mask.bool())
    if algo.router_aux_loss_coef > 0:
        aux = load_balancing_loss(out.router_logits, top_k, batch.attention_mask[rows, lo:hi])
        loss = loss + algo.router_aux_loss_coef * aux
        m["actor/router_aux_loss"] = float(aux.detach())
    return loss, m


def _agree(dist, error: str | None, elsewhere: str) -> None:
    """Every rank takes the same branch (backward is a collective under FSDP): raise the non-finite
    error on all ranks when any rank has one (``elsewhere``: the message of the ranks without it)."""
    if dist.any(error is not None):
        raise NonFiniteLogProbError(error or elsewhere)


def update_step(p: Policy, st: StepTensors, step: int):
    """The step's ppo_epochs x mini-batch updates of policy ``p`` (rspo.train.policy.Policy).
    -> (metrics averaged over updates, the first (on-policy) mini-batch's metrics, skipped updates)"""
    sums: dict[str, list[float]] = defaultdict(list)
    first_mb: dict[str, float] = {}
    skipped = 0
    p.router_lr.at_step(step)
    p.model.train()
    for epoch in range(p.cfg.schedule.ppo_epochs):
        mbs = st.mini_batches if epoch == 0 else p.mini_batches(step, epoch)
        for j, mb in enumerate(mbs):
            m = update_mini_batch(p, st, mb, step=step, record=p.onpolicy_shortcut and epoch == 0 and j == 0)
            if m is None:
                skipped += 1
                continue
            means = merge_micro_metrics(m, p.cfg.algorithm.algo)
            for k, v in means.items():
                sums[k].append(v)
            if epoch == 0 and j == 0:
                first_mb = means
    # the gradients go before anything of the engine wakes (rspo.rollout.colocate): at the paper's
    # sizes they are 4 bytes per parameter / ranks, as much as the fp32 weights themselves
    p.zero_grad()
    return_cached_blocks(p.device)  # and the activations' cached blocks with them
    p.model.eval()
    return {k: sum(v) / len(v) for k, v in sums.items()}, first_mb, skipped


def update_mini_batch(
    p: Policy, st: StepTensors, mb: torch.Tensor, *, step: int, record: bool
) -> dict[str, list] | None:
    """One optimizer update of policy ``p`` at ``step`` on mini-batch ``mb``: each of this rank's micro-batches
    forward, loss and backward (the gradients accumulate), then the clip and the step. -> its metrics
    (every rank's micro-batch values as (value, responses, tokens)), or None when the update was
    skipped for non-finite values.

    ``record`` (the on-policy first mini-batch, whose old pass was skipped): the forward's own
    detached log-probs, entropy and router cache are recorded as the old values of these rows before
    the loss. A micro-batch of None stands in for one that another rank has and this one lacks: a
    forward and backward whose loss counts zero responses (backward is a collective under FSDP).
    The backward runs inside the forward's routing control, so a gradient-checkpointing
    recomputation routes the same way."""
    a, dist = p.cfg.algorithm, p.dist
    p.zero_grad()
    mask = st.batch.response_mask
    n_valid_mb = max(1, int(mask[mb].bool().any(dim=1).sum()))  # over the GLOBAL mini-batch
    metrics: dict[str, list[tuple[float, int, int]]] = defaultdict(list)
    try:
        with p.memory.phase("update"):
            for rows in p.micro_batches(mb, st.row_tokens):
                empty = rows is None  # another rank has more micro-batches: one row, counted as none
                rows = p.local_rows(mb)[:1] if empty else rows
                rec = record and not empty
                with p.forward(
                    st.batch,
                    rows,
                    with_entropy=a.entropy_coef > 0 or rec,
                    capture=a.router_aux_loss_coef > 0 or st.cache is not None,
                    update=True,
                    cache=None if rec else st.cache,
                ) as (out, (lo, hi)):
                    r = hi - st.batch.prompt_width
                    if rec:
                        st.old_logp[rows, :r] = out.logp.detach()
                        st.entropy[rows, :r] = out.entropy.detach()
                        if st.cache is not None:
                            p.record_cache(st.cache, rows, out, lo, hi, st.batch.input_ids.shape[1])
                    err = None
                    try:
                        with record_function("update.loss"):
                            loss, m = micro_batch_loss(a, p.spec.top_k, st, rows, out, lo, hi)
                    except NonFiniteLogProbError as e:
                        err, loss, m = str(e), None, {}
                    _agree(dist, err, "non-finite log-probs on another rank")
                    rmask = mask[rows, :r]
                    n_valid = 0 if empty else int(rmask.bool().any(dim=1).sum())  # an empty one adds nothing
                    # share of the global mini-batch; x world size because FSDP averages gradients over ranks
                    scaled = loss * (n_valid * dist.world_size / n_valid_mb)
                    bad = None if bool(torch.isfinite(scaled)) else f"loss is {scaled.item()}"
                    _agree(dist, bad, "non-finite loss on another rank")
                    with record_function("update.backward"):
                        scaled.backward()
                if not empty:
                    w = (int(mask[rows].bool().any(dim=1).sum()), int(mask[rows].sum()))
                    for k, v in m.items():
                        metrics[k].append((v, *w))
                # the micro-batch's forward (its outputs hold each layer's hidden states, those the
                # graph kept) must not outlive its backward: bound to these names, the last one's
                # stayed on the device through the clip and the optimizer step, 1 B per layer
                # parameter of the shard (found by the simulation: rspo.gpu_memory.simulate)
                del out, loss, scaled
        with record_function("update.optimizer"):
            grad_norm = p.clip_gradients()
        if not torch.isfinite(grad_norm):  # one global norm: every rank takes this branch alike
            raise NonFiniteLogProbError(f"gradient norm is {grad_norm.item()}")
    except NonFiniteLogProbError as e:
        p.skip_update(step, e)
        return None
    with record_function("update.optimizer"):
        p.apply_update()
    if dist.enabled:  # the micro-batch values of every rank, in rank order
        merged: dict[str, list[tuple[float, int, int]]] = defaultdict(list)
        for part in dist.all_gather_object(dict(metrics)):
            for k, v in part.items():
                merged[k] += v
        metrics = merged
    metrics["actor/grad_norm"].append((float(grad_norm), 1, 1))
    return metrics
