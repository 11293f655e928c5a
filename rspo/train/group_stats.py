"""RLVR diagnostics of a step's rollout groups: how much signal the groups carry.

A group is the G responses to one prompt. GRPO-style advantages are (r - mean) / std within a
group, so a group whose G rewards are all equal (zero variance) gets zero advantages and teaches
nothing; the share of such groups is TRL's ``frac_reward_zero_std``. Split by cause: all correct
(the policy has nothing left to learn on that prompt) or all wrong (it never found an answer).
Distinct responses per group and the per-response entropy say how much the sampled policy explores.

| key | meaning |
|---|---|
| ``groups/zero_std_frac`` | share of groups whose G rewards are all equal |
| ``groups/all_correct_frac`` | share of groups in which every reward is >= 1 (full reward) |
| ``groups/all_wrong_frac`` | share of groups in which every reward is <= 0 |
| ``groups/distinct_responses`` | mean number of distinct responses (token sequences) per group, 1..G |
| ``actor/response_entropy`` | mean over responses of the response's mean per-token entropy |

With binary rewards (Countdown, math) zero_std = all_correct + all_wrong; with partial rewards
(code: share of tests passed) a group can also be constant in between. ``actor/entropy`` (verl's
name) is the mean over all response tokens, so long responses weigh more there than here.
"""

from __future__ import annotations

import torch


def group_stats(rewards: torch.Tensor, response_ids: torch.Tensor, response_mask: torch.Tensor, group_size: int):
    """The group diagnostics of one step. rewards (B,), response_ids / response_mask (B, R),
    rows [i*G, (i+1)*G) answer prompt i. -> dict of floats (keys in the module docstring)."""
    B = rewards.numel()
    if group_size < 1 or B % group_size:
        raise ValueError(f"group_size {group_size} does not divide the {B} rewards")
    r = rewards.detach().float().cpu().view(-1, group_size)  # (B/G, G)
    constant = r.max(dim=1).values == r.min(dim=1).values
    all_correct = (r >= 1).all(dim=1)
    all_wrong = (r <= 0).all(dim=1)
    ids = response_ids.detach().cpu()
    lengths = response_mask.detach().cpu().sum(dim=1).long()
    rows = [tuple(ids[i, : int(lengths[i])].tolist()) for i in range(B)]
    distinct = [len(set(rows[g * group_size : (g + 1) * group_size])) for g in range(B // group_size)]
    return {
        "groups/zero_std_frac": float(constant.float().mean()),
        "groups/all_correct_frac": float(all_correct.float().mean()),
        "groups/all_wrong_frac": float(all_wrong.float().mean()),
        "groups/distinct_responses": sum(distinct) / len(distinct),
    }


def response_entropy(entropy: torch.Tensor, response_mask: torch.Tensor) -> float:
    """Mean over responses of each response's mean per-token entropy. (B, R), (B, R) -> float."""
    m = response_mask.float()
    per = (entropy * m).sum(dim=1) / m.sum(dim=1).clamp(min=1)  # (B,)
    has = m.sum(dim=1) > 0
    return float(per[has].mean()) if bool(has.any()) else 0.0
