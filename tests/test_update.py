"""rspo.train.update.micro_batch_loss, the loss of one update micro-batch: gamma reaches the policy
loss at the positions that predict the response tokens (checked against the fp32 reference of Eq. 7
in tests/router_reference.py, not against the library's own path), a run without RS logs the
diagnostics of that same gamma and trains on the loss without it, and the entropy bonus and the
load-balancing term enter with their coefficients. The trainer-level equalities (micro-batching,
two ranks, the on-policy shortcut) are in test_memory.py, test_distributed.py and test_train.py."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch
from router_reference import shift_ratio

from rspo.config import AlgorithmConfig
from rspo.losses import compute_policy_loss, router_shift_log_weight, router_shift_metrics, seq_mean_token_mean
from rspo.models import load_balancing_loss
from rspo.rollout import RolloutBatch
from rspo.router import OldRouterCache
from rspo.train.policy import StepTensors
from rspo.train.update import micro_batch_loss

B, P, R, E, K, L = 3, 4, 5, 6, 2, 2
T = P + R
LO = 1  # the window the forward kept: columns 0..LO-1 were all padding


def step(seed: int = 0):
    """A step of B rows: old router logits of every position, a window [LO, T) whose current router
    logits moved, current and old log-probs, one response shorter than the others."""
    g = torch.Generator().manual_seed(seed)
    old_logits = [torch.randn(B * T, E, generator=g) for _ in range(L)]
    new_logits = [
        (o.view(B, T, E)[:, LO:] + 0.5 * torch.randn(B, T - LO, E, generator=g)).reshape(-1, E).requires_grad_()
        for o in old_logits
    ]
    response_mask = torch.ones(B, R)
    response_mask[1, 3:] = 0
    attention_mask = torch.cat([torch.ones(B, P), response_mask], dim=1)
    attention_mask[:, :LO] = 0
    batch = RolloutBatch(
        input_ids=torch.zeros(B, T, dtype=torch.long),
        attention_mask=attention_mask,
        prompt_width=P,
        response_mask=response_mask,
        responses=[""] * B,
    )
    cache = OldRouterCache.from_logits(old_logits, K, (B, T), logp_dtype=torch.float32)
    old_logp = -torch.rand(B, R, generator=g) - 0.5
    logp = (old_logp + 0.2 * torch.randn(B, R, generator=g)).requires_grad_()
    adv, tokens = torch.tensor([1.0, -0.5, 0.7]), attention_mask.sum(dim=1)
    st = StepTensors(batch, adv, old_logp, torch.zeros(B, R), cache, [torch.arange(B)], tokens)
    out = SimpleNamespace(logp=logp, entropy=torch.rand(B, R, generator=g), router_logits=new_logits)
    return st, out, old_logits, new_logits


def reference_gamma(old_logits, new_logits) -> torch.Tensor:
    """(B, R): gamma of the position that predicts each response token (position P - 1 + j for token
    j), straight from Eq. (7) in fp32 over the window's positions."""
    old_w = [o.view(B, T, E)[:, LO:].reshape(-1, E) for o in old_logits]
    gamma = shift_ratio(old_w, [n.detach() for n in new_logits], K).view(B, T - LO)
    return gamma[:, P - 1 - LO : P - 1 - LO + R]


@pytest.mark.parametrize("algo", ["grpo", "gspo", "gmpo"])
def test_gamma_reaches_the_loss_at_the_positions_that_predict_the_response(algo):
    st, out, old_logits, new_logits = step()
    cfg = AlgorithmConfig(algo=algo, router_shift=True, gamma_min=0.5)
    loss, m = micro_batch_loss(cfg, K, st, torch.arange(B), out, LO, T)
    gamma = reference_gamma(old_logits, new_logits)
    assert gamma.min() < 0.9  # the routers moved: a misplaced gamma changes the loss
    mask = st.batch.response_mask
    want, _ = compute_policy_loss(
        algo, out.logp, st.old_logp, st.adv, mask, log_gamma=router_shift_log_weight(gamma, mask.bool(), 0.5)
    )
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-6)
    want_m = router_shift_metrics(gamma, mask, 0.5)
    assert m["router/shift_ratio_mean"] == pytest.approx(want_m["router/shift_ratio_mean"], rel=1e-5)
    # gamma taken one position late (the positions of the response tokens themselves) is another loss
    late = shift_ratio(
        [o.view(B, T, E)[:, LO:].reshape(-1, E) for o in old_logits], [n.detach() for n in new_logits], K
    ).view(B, T - LO)[:, P - LO : P - LO + R]
    wrong, _ = compute_policy_loss(
        algo, out.logp, st.old_logp, st.adv, mask, log_gamma=router_shift_log_weight(late, mask.bool(), 0.5)
    )
    assert not torch.allclose(wrong, want, rtol=1e-4, atol=1e-6)


def test_a_run_without_rs_logs_the_same_gammas_diagnostics_and_trains_without_it():
    st, out, old_logits, new_logits = step(1)
    rs, m_rs = micro_batch_loss(AlgorithmConfig(algo="gmpo", router_shift=True), K, st, torch.arange(B), out, LO, T)
    plain, m = micro_batch_loss(AlgorithmConfig(algo="gmpo"), K, st, torch.arange(B), out, LO, T)
    want, _ = compute_policy_loss("gmpo", out.logp, st.old_logp, st.adv, st.batch.response_mask)
    torch.testing.assert_close(plain, want)
    for key in ("router/shift_ratio_mean", "router/shift_clipfrac"):
        assert m[key] == pytest.approx(m_rs[key], rel=1e-6)
    assert not torch.allclose(rs, plain)


def test_the_entropy_bonus_and_the_load_balancing_term_enter_with_their_coefficients():
    st, out, _, new_logits = step(2)
    base = AlgorithmConfig(algo="grpo")
    rows = torch.arange(B)
    plain, _ = micro_batch_loss(base, K, st, rows, out, LO, T)
    with_entropy, _ = micro_batch_loss(dataclasses.replace(base, entropy_coef=0.01), K, st, rows, out, LO, T)
    mask = st.batch.response_mask.bool()
    torch.testing.assert_close(with_entropy, plain - 0.01 * seq_mean_token_mean(out.entropy, mask))
    with_aux, m = micro_batch_loss(dataclasses.replace(base, router_aux_loss_coef=0.1), K, st, rows, out, LO, T)
    aux = load_balancing_loss(new_logits, K, st.batch.attention_mask[:, LO:])
    torch.testing.assert_close(with_aux, plain + 0.1 * aux)
    assert m["actor/router_aux_loss"] == pytest.approx(float(aux.detach()))
