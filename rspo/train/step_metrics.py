"""The metrics row of one rollout step (metric names: docs/metrics.md), from what the step
computed: the rewards and the batch, the old pass's entropy and router cache, the updates' own
averages, the phases' wall times and the train-inference mismatch (rspo.losses.mismatch_metrics,
with the share of routing decisions the old pass shares with the engine when it reported them).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rspo.distributed import Dist
from rspo.losses import masked_mean, mismatch_metrics
from rspo.router import routing_agreement
from rspo.run_record import GAMMA, PPO_KL, REWARD, ROUTING_AGREEMENT, STEP_S
from rspo.train.group_stats import group_stats, response_entropy
from rspo.train.policy import StepTensors

__all__ = ["StepTimes", "mismatch", "onpolicy_metrics", "step_metrics"]


@dataclass(frozen=True)
class StepTimes:
    """Wall seconds of a step's phases: ``rollout_s`` the generation alone, ``reward_s`` the rest of
    the rollout phase (verifier, gather, advantages), ``sync_s`` the engine's weights and KV cache."""

    rollout_s: float
    reward_s: float
    old_pass_s: float
    update_s: float
    sync_s: float


def step_metrics(
    st: StepTensors,
    rewards: torch.Tensor,
    times: StepTimes,
    *,
    group_size: int,
    ppo_epochs: int,
    skipped: int,
    lr: float,
    special_stop_frac: float,
) -> dict[str, float]:
    """The step's rewards, responses, entropy, schedule and throughput (``perf/``)."""
    batch = st.batch
    mask = batch.response_mask
    n_tokens = float(mask.sum())
    upd_s = max(times.update_s, 1e-9)
    out = {
        REWARD: float(rewards.mean()),
        "critic/score/max": float(rewards.max()),
        "critic/score/min": float(rewards.min()),
        **group_stats(rewards, batch.response_ids, mask, group_size),
        "actor/entropy": float(masked_mean(st.entropy, mask.bool())),
        "actor/response_entropy": response_entropy(st.entropy, mask),
        "response_length/mean": float(mask.sum(1).mean()),
        "response/special_stop_frac": special_stop_frac,
        "actor/skipped_updates": float(skipped),
        "actor/lr": lr,
        "perf/rollout_s": times.rollout_s,
        "perf/reward_s": times.reward_s,
        "perf/old_pass_s": times.old_pass_s,
        "perf/update_s": times.update_s,
        "perf/sync_s": times.sync_s,  # weights into the rollout engine (vllm; ~0 for hf)
        STEP_S: times.rollout_s + times.reward_s + times.old_pass_s + times.update_s,
        "perf/rollout_tokens_per_s": n_tokens / max(times.rollout_s, 1e-9),
        "perf/tokens_per_s": n_tokens * ppo_epochs / upd_s,
        # every non-padding token the updates process (prompt + response), as a training loop counts
        "perf/update_tokens_per_s": float(batch.attention_mask.sum()) * ppo_epochs / upd_s,
    }
    if st.cache is not None:
        out["router/cache_bytes"] = float(st.cache.nbytes)
        out["router/cache_bytes_per_entry"] = float(st.cache.bytes_per_entry)
    return out


def onpolicy_metrics(first_mb: dict[str, float]) -> dict[str, float]:
    """The first (on-policy) mini-batch's shift ratio and KL: 1 and 0 by construction."""
    if not first_mb:
        return {}
    return {
        "router/onpolicy_shift_ratio_mean": first_mb.get(GAMMA, float("nan")),
        "actor/onpolicy_ppo_kl": first_mb.get(PPO_KL, float("nan")),
    }


def mismatch(st: StepTensors, dist: Dist, ppo_epochs: int) -> dict[str, float]:
    """The train-inference mismatch of the step (rspo.losses.mismatch_metrics) and, when the engine
    reported its routing, the share of (position, MoE layer) whose experts the old pass chose too."""
    batch, old_logp, cache = st.batch, st.old_logp, st.cache
    if batch.engine_logp is None:
        return {}
    mask = batch.response_mask.bool()
    out = mismatch_metrics(old_logp, batch.engine_logp.to(old_logp.device), mask)
    if batch.routed_experts is not None and cache is not None:
        rows = (cache.slot >= 0).nonzero().squeeze(1)  # the rows this rank's cache holds
        attn = batch.attention_mask.cpu()[rows].bool()
        last = attn.long().cumsum(1) == attn.sum(1, keepdim=True)  # each row's last token: never forwarded
        agree, total = routing_agreement(batch.routed_experts[:, rows], cache[rows].indices, attn & ~last)
        if dist.enabled and not (ppo_epochs > 1):  # each rank holds its own rows
            counts = torch.tensor([agree, total], dtype=torch.float64)
            dist.all_reduce_sum_(counts)
            agree, total = float(counts[0]), float(counts[1])
        out[ROUTING_AGREEMENT] = agree / max(total, 1)
    return out
