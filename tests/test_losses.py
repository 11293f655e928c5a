"""rspo.losses: hand-computed values, equivalences, gradients, errors."""

import math

import pytest
import torch

from rspo.losses import (
    POLICY_LOSSES,
    NonFiniteLogProbError,
    compute_policy_loss,
    correction_metrics,
    group_advantages,
    rollout_correction,
    router_shift_log_weight,
    router_shift_metrics,
)
from rspo.method import OBJECTIVES  # noqa: E402

ALGOS = ("grpo", "gspo", "gmpo")


def _t(rows, dtype=torch.float64):
    return torch.tensor(rows, dtype=dtype)


def rs_loss(
    algo,
    log_prob,
    old,
    adv,
    mask,
    *,
    gamma=None,
    gamma_min=0.8,
    stop_gradient=True,
    clip_low=None,
    clip_high=None,
    engine_log_prob=None,
    correction="none",
    correction_low=0.5,
    correction_high=2.0,
):
    """The policy loss with RS and a rollout correction as the trainer's micro-batch forms it
    (rspo.train.update.micro_batch_loss): log gamma_tilde and omega from their own functions, the
    loss from compute_policy_loss, the diagnostics from theirs. (That the trainer's composition
    gives the same numbers is checked bit for bit on whole runs; these tests check the functions.)"""
    log_gamma = (
        None if gamma is None else router_shift_log_weight(gamma, mask.bool(), gamma_min, stop_gradient, log_prob.dtype)
    )
    weight = None
    if correction != "none":
        weight = rollout_correction(correction, old, engine_log_prob, mask, correction_low, correction_high)
        weight = weight.to(log_prob.dtype)
    loss, m = compute_policy_loss(
        algo, log_prob, old, adv, mask, log_gamma=log_gamma, weight=weight, clip=(clip_low, clip_high)
    )
    if gamma is not None:
        m.update(router_shift_metrics(gamma, mask, gamma_min))
    if weight is not None:
        m.update(correction_metrics(weight, mask))
    return loss, m


# ----------------------------------------------------------------------------- hand-computed


def grpo_case():
    # response 0: ratios (1.5, 0.9), A = +1; response 1: ratio 0.7 then padding, A = -1
    log_prob = _t([[math.log(1.5), math.log(0.9)], [math.log(0.7), 0.0]])
    old = torch.zeros_like(log_prob)
    adv = _t([1.0, -1.0])
    mask = _t([[1, 1], [1, 0]])
    return log_prob, old, adv, mask


def test_grpo_hand_computed():
    log_prob, old, adv, mask = grpo_case()
    loss, m = rs_loss("grpo", log_prob, old, adv, mask)
    # resp 0: t0 -min(1.5, clip=1.2) = -1.2 ; t1 -min(0.9, 0.9) = -0.9 ; mean -1.05
    # resp 1: t0 A=-1: -min(-0.7, -clip(0.7)=-0.8) = 0.8 ; mean 0.8
    # loss = (-1.05 + 0.8) / 2 = -0.125
    assert loss.item() == pytest.approx(-0.125, abs=1e-12)
    assert m["actor/pg_loss"] == pytest.approx(-0.125, abs=1e-12)
    # clipped term taken at (0,0) and (1,0), not at (0,1): 2 of 3 response tokens
    assert m["actor/pg_clipfrac"] == pytest.approx(2 / 3)
    # ppo_kl = mean(old - new) over the 3 tokens
    assert m["actor/ppo_kl"] == pytest.approx(-(math.log(1.5) + math.log(0.9) + math.log(0.7)) / 3)
    assert "router/shift_ratio_mean" not in m


def test_grpo_with_router_shift_hand_computed():
    log_prob, old, adv, mask = grpo_case()
    gamma = _t([[0.9, 0.5], [1.0, 0.123]])  # last entry is padding, ignored
    loss, m = rs_loss("grpo", log_prob, old, adv, mask, gamma=gamma, gamma_min=0.8)
    # floored gamma: (0.9, 0.8), (1.0) -> w_tilde: (1.35, 0.72), (0.7)
    # resp 0: -min(1.35, 1.2) = -1.2 ; -min(0.72, 0.8) = -0.72 ; mean -0.96
    # resp 1: 0.8 as before ; loss = (-0.96 + 0.8) / 2 = -0.08
    assert loss.item() == pytest.approx(-0.08, abs=1e-12)
    # clipped: (0,0) yes; (0,1): l1=-0.72 < l2=-0.8? no; (1,0) yes -> 2/3
    assert m["actor/pg_clipfrac"] == pytest.approx(2 / 3)
    # ppo_kl is on the RAW ratio: unchanged by RS
    assert m["actor/ppo_kl"] == pytest.approx(-(math.log(1.5) + math.log(0.9) + math.log(0.7)) / 3)
    # gamma before the floor: (0.9 + 0.5 + 1.0) / 3 = 0.8 ; below 0.8: one token of three
    assert m["router/shift_ratio_mean"] == pytest.approx(0.8)
    assert m["router/shift_clipfrac"] == pytest.approx(1 / 3)


def gspo_case():
    log_prob = _t([[0.1, -0.05], [-0.001, 0.0]])
    old = torch.zeros_like(log_prob)
    adv = _t([1.0, -1.0])
    mask = _t([[1, 1], [1, 0]])
    return log_prob, old, adv, mask


def test_gspo_hand_computed():
    log_prob, old, adv, mask = gspo_case()
    loss, m = rs_loss("gspo", log_prob, old, adv, mask)
    # resp 0: s = exp((0.1 - 0.05)/2) = exp(0.025) = 1.02532 > 1 + 4e-4 -> -min(s, 1.0004) = -1.0004
    # resp 1: s = exp(-0.001) = 0.9990005, A=-1 -> max(s, clip(s)=0.9997) = 0.9997
    expected = (-1.0004 + 0.9997) / 2
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    assert m["actor/pg_clipfrac"] == pytest.approx(1.0)  # both responses clipped


def test_gspo_with_router_shift_applies_per_token_before_geometric_mean():
    log_prob, old, adv, mask = gspo_case()
    gamma = _t([[0.9, 1.0], [1.0, 1.0]])
    loss, m = rs_loss("gspo", log_prob, old, adv, mask, gamma=gamma, gamma_min=0.8)
    # resp 0: mean(0.1 + log 0.9, -0.05) = (0.1 - 0.1053605 - 0.05)/2 = -0.02768 -> s = 0.97270, inside
    # the band from below? no: 0.9727 < 1 - 3e-4, A=+1 -> -min(s, clip(s)) = -s (unclipped side)
    s0 = math.exp((0.1 + math.log(0.9) - 0.05) / 2)
    expected = (-s0 + 0.9997) / 2
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    assert m["actor/pg_clipfrac"] == pytest.approx(0.5)  # only response 1 clipped


def gmpo_case():
    log_prob = _t([[0.5, -0.6], [0.5, -0.6]])
    old = torch.zeros_like(log_prob)
    adv = _t([1.0, -1.0])
    mask = torch.ones_like(log_prob)
    return log_prob, old, adv, mask


def test_gmpo_hand_computed_sign_aware_clip():
    log_prob, old, adv, mask = gmpo_case()
    loss, m = rs_loss("gmpo", log_prob, old, adv, mask)
    # resp 0, A=+1: only the upper side is clipped: (0.4, -0.6) -> mean -0.1 -> loss -exp(-0.1)
    # resp 1, A=-1: only the lower side is clipped: (0.5, -0.4) -> mean 0.05 -> loss +exp(0.05)
    expected = (-math.exp(-0.1) + math.exp(0.05)) / 2
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    assert m["actor/pg_clipfrac"] == pytest.approx(2 / 4)


def test_gmpo_with_router_shift_hand_computed():
    log_prob, old, adv, mask = gmpo_case()
    gamma = _t([[0.5, 1.0], [1.0, 1.0]])
    loss, m = rs_loss("gmpo", log_prob, old, adv, mask, gamma=gamma, gamma_min=0.8)
    # resp 0: 0.5 + log(max(0.5, 0.8)) = 0.5 - 0.2231436 = 0.2768564 < 0.4, no clip
    #         mean(0.2768564, -0.6) = -0.1615718 -> loss -exp(-0.1615718)
    # resp 1: unchanged, +exp(0.05)
    expected = (-math.exp((0.5 + math.log(0.8) - 0.6) / 2) + math.exp(0.05)) / 2
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    assert m["actor/pg_clipfrac"] == pytest.approx(1 / 4)
    assert m["router/shift_ratio_mean"] == pytest.approx(3.5 / 4)
    assert m["router/shift_clipfrac"] == pytest.approx(1 / 4)


def test_default_clip_ranges_are_the_papers():
    assert {a: OBJECTIVES[a].clip for a in ALGOS} == {"grpo": (0.2, 0.2), "gspo": (3e-4, 4e-4), "gmpo": (0.4, 0.4)}
    assert {a: OBJECTIVES[a].clip_unit for a in ALGOS} == {"grpo": "token", "gspo": "sequence", "gmpo": "token"}
    assert set(POLICY_LOSSES) >= set(ALGOS)


# ----------------------------------------------------------------------------- equivalences


def random_batch(seed=0, B=6, T=7, dtype=torch.float64, scale=0.3):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=dtype) * 3
    log_prob = old + scale * torch.randn(B, T, generator=g, dtype=dtype)
    adv = torch.randn(B, generator=g, dtype=dtype)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(dtype)
    gamma = torch.rand(B, T, generator=g, dtype=dtype) * 0.5 + 0.5  # in [0.5, 1)
    return log_prob, old, adv, mask, gamma


@pytest.mark.parametrize("algo", ALGOS)
def test_router_shift_of_ones_equals_no_rs(algo):
    log_prob, old, adv, mask, _ = random_batch()
    lp1 = log_prob.clone().requires_grad_(True)
    lp2 = log_prob.clone().requires_grad_(True)
    loss1, m1 = rs_loss(algo, lp1, old, adv, mask)
    loss2, m2 = rs_loss(algo, lp2, old, adv, mask, gamma=torch.ones_like(log_prob))
    loss1.backward()
    loss2.backward()
    assert loss1.item() == pytest.approx(loss2.item(), abs=1e-14)
    torch.testing.assert_close(lp1.grad, lp2.grad)
    assert m1["actor/pg_clipfrac"] == m2["actor/pg_clipfrac"]
    assert m2["router/shift_ratio_mean"] == pytest.approx(1.0)
    assert m2["router/shift_clipfrac"] == 0.0


@pytest.mark.parametrize("algo", ALGOS)
def test_on_policy_ratios_are_one_and_nothing_is_clipped(algo):
    _, old, adv, mask, _ = random_batch()
    loss, m = rs_loss(algo, old.clone(), old, adv, mask)
    assert m["actor/ppo_kl"] == 0.0
    assert m["actor/pg_clipfrac"] == 0.0
    # every ratio is 1, so every per-response loss is -A_i; the loss is the mean of -A over responses
    assert loss.item() == pytest.approx((-adv).mean().item(), abs=1e-12)


def test_gspo_with_one_token_per_response_equals_grpo():
    log_prob, old, adv, _, _ = random_batch(B=8, T=1)
    mask = torch.ones_like(log_prob)
    lp1 = log_prob.clone().requires_grad_(True)
    lp2 = log_prob.clone().requires_grad_(True)
    l_grpo, m_grpo = rs_loss("grpo", lp1, old, adv, mask, clip_low=0.1, clip_high=0.15)
    l_gspo, m_gspo = rs_loss("gspo", lp2, old, adv, mask, clip_low=0.1, clip_high=0.15)
    l_grpo.backward()
    l_gspo.backward()
    assert l_grpo.item() == pytest.approx(l_gspo.item(), abs=1e-12)
    torch.testing.assert_close(lp1.grad, lp2.grad)
    assert m_grpo["actor/pg_clipfrac"] == pytest.approx(m_gspo["actor/pg_clipfrac"])


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("with_rs", [False, True])
def test_gradient_matches_finite_differences(algo, with_rs):
    log_prob, old, adv, mask, gamma = random_batch(seed=3, scale=0.05)
    rs = gamma if with_rs else None
    # GSPO's band is 7e-4 wide: widen it so the check is away from the clip kinks for most sequences
    clip = {"gspo": (0.2, 0.2)}.get(algo, (None, None))
    x = log_prob.clone().requires_grad_(True)

    def f(lp):
        return rs_loss(algo, lp, old, adv, mask, gamma=rs, clip_low=clip[0], clip_high=clip[1])[0]

    assert torch.autograd.gradcheck(f, (x,), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("algo", ALGOS)
def test_stop_gradient_controls_the_gamma_graph(algo):
    log_prob, old, adv, mask, gamma = random_batch(seed=5)
    gamma = (gamma * 0.2 + 0.8).clamp(max=1.0)  # in [0.9, 1): above gamma_min, so max() passes its grad
    g_sg = gamma.clone().requires_grad_(True)
    loss, _ = rs_loss(
        algo,
        log_prob.clone().requires_grad_(True),
        old,
        adv,
        mask,
        gamma=g_sg,
        stop_gradient=True,
        clip_low=10.0,
        clip_high=10.0,
    )
    loss.backward()
    assert g_sg.grad is None

    g_nosg = gamma.clone().requires_grad_(True)
    loss, _ = rs_loss(
        algo,
        log_prob.clone().requires_grad_(True),
        old,
        adv,
        mask,
        gamma=g_nosg,
        stop_gradient=False,
        clip_low=10.0,
        clip_high=10.0,
    )
    loss.backward()
    assert g_nosg.grad is not None
    assert g_nosg.grad[mask.bool()].abs().sum() > 0
    assert g_nosg.grad[~mask.bool()].abs().sum() == 0


def test_floor_blocks_gamma_gradient_below_gamma_min():
    log_prob, old, adv, mask, _ = random_batch(seed=6)
    gamma = torch.full_like(log_prob, 0.5, requires_grad=True)  # all below the 0.8 floor
    loss, _ = rs_loss("gmpo", log_prob, old, adv, mask, gamma=gamma, stop_gradient=False)
    loss.backward()
    assert gamma.grad.abs().sum() == 0


@pytest.mark.parametrize("algo", ALGOS)
def test_token_advantages_equal_response_advantages_when_constant(algo):
    log_prob, old, adv, mask, gamma = random_batch(seed=7)
    l1, _ = rs_loss(algo, log_prob, old, adv, mask, gamma=gamma)
    l2, _ = rs_loss(algo, log_prob, old, adv[:, None].expand_as(log_prob).clone(), mask, gamma=gamma)
    assert l1.item() == pytest.approx(l2.item(), abs=1e-12)


@pytest.mark.parametrize("algo", ALGOS)
def test_padding_content_is_ignored(algo):
    log_prob, old, adv, mask, gamma = random_batch(seed=8)
    pad = ~mask.bool()
    lp2 = log_prob.masked_fill(pad, float("nan"))
    old2 = old.masked_fill(pad, float("-inf"))
    g2 = gamma.masked_fill(pad, 7.0)  # out of range, but padding
    x1 = log_prob.clone().requires_grad_(True)
    x2 = lp2.clone().requires_grad_(True)
    l1, m1 = rs_loss(algo, x1, old, adv, mask, gamma=gamma)
    l2, m2 = rs_loss(algo, x2, old2, adv, mask, gamma=g2)
    l1.backward()
    l2.backward()
    assert l1.item() == pytest.approx(l2.item(), abs=1e-12)
    assert torch.isfinite(x2.grad).all()
    torch.testing.assert_close(x1.grad, x2.grad)
    assert m1 == pytest.approx(m2)


@pytest.mark.parametrize("algo", ALGOS)
def test_empty_responses_are_excluded_from_the_mean(algo):
    log_prob, old, adv, mask, _ = random_batch(seed=9, B=4)
    l_ref, _ = rs_loss(algo, log_prob[:3], old[:3], adv[:3], mask[:3])
    mask4 = mask.clone()
    mask4[3] = 0
    l4, _ = rs_loss(algo, log_prob, old, adv, mask4)
    assert l4.item() == pytest.approx(l_ref.item(), abs=1e-12)


def test_float32_inputs_work_and_metrics_are_floats():
    log_prob, old, adv, mask, gamma = random_batch(dtype=torch.float32)
    loss, m = rs_loss("gmpo", log_prob, old, adv, mask.bool(), gamma=gamma)
    assert loss.dtype == torch.float32
    assert all(isinstance(v, float) for v in m.values())
    assert set(m) == {
        "actor/pg_loss",
        "actor/ppo_kl",
        "actor/pg_clipfrac",
        "router/shift_ratio_mean",
        "router/shift_clipfrac",
    }


def test_grpo_guard_keeps_extreme_ratio_finite():
    log_prob = _t([[200.0, 0.0]])
    loss, m = rs_loss("grpo", log_prob, torch.zeros_like(log_prob), _t([-1.0]), torch.ones_like(log_prob))
    assert math.isfinite(loss.item())


# ----------------------------------------------------------------------------- errors


def test_the_loss_takes_its_weights_by_keyword_only():
    """Past the five tensors every argument is a keyword: the router-shift term and the correction's
    weight arrive computed (log gamma_tilde, omega), never as positional arguments to mix up."""
    log_prob, old, adv, mask, gamma = random_batch()
    with pytest.raises(TypeError):
        compute_policy_loss("gmpo", log_prob, old, adv, mask, torch.zeros_like(log_prob))
    log_gamma = router_shift_log_weight(gamma, mask.bool(), 0.8)
    a, _ = compute_policy_loss("gmpo", log_prob, old, adv, mask, log_gamma=log_gamma)
    b, _ = compute_policy_loss("gmpo", log_prob + log_gamma, old, adv, mask)  # the term is added to the log-ratio
    assert float(a) == pytest.approx(float(b), rel=1e-12)
    with pytest.raises(ValueError, match="^weight: shape"):
        compute_policy_loss("gmpo", log_prob, old, adv, mask, weight=torch.ones_like(log_prob)[:, :2])


def test_errors_name_the_argument():
    log_prob, old, adv, mask, gamma = random_batch()
    with pytest.raises(ValueError, match="algo"):
        rs_loss("ppo", log_prob, old, adv, mask)
    with pytest.raises(ValueError, match="old_log_prob"):
        rs_loss("grpo", log_prob, old[:, :3], adv, mask)
    with pytest.raises(ValueError, match="response_mask"):
        rs_loss("grpo", log_prob, old, adv, mask[:2])
    with pytest.raises(ValueError, match="advantages"):
        rs_loss("grpo", log_prob, old, adv[:2], mask)
    with pytest.raises(ValueError, match="^gamma: shape"):
        rs_loss("grpo", log_prob, old, adv, mask, gamma=gamma[:, :2])
    with pytest.raises(ValueError, match="log_prob"):
        rs_loss("grpo", log_prob[0], old[0], adv, mask[0])
    for bad in (0.0, -0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="gamma_min"):
            rs_loss("gmpo", log_prob, old, adv, mask, gamma=gamma, gamma_min=bad)
    for bad_value in (0.0, 1.01, -0.5):
        g = gamma.clone()
        g[0, 0] = bad_value
        with pytest.raises(ValueError, match=r"^gamma: must lie in \(0, 1\]"):
            rs_loss("gmpo", log_prob, old, adv, mask, gamma=g)
    with pytest.raises(ValueError, match="response_mask"):
        rs_loss("gmpo", log_prob, old, adv, torch.zeros_like(mask))
    with pytest.raises(ValueError, match="clip"):
        compute_policy_loss("grpo", log_prob, old, adv, mask, clip=(-0.1, None))


@pytest.mark.parametrize("name", ["log_prob", "old_log_prob"])
def test_nonfinite_log_probs_are_reported(name):
    log_prob, old, adv, mask, _ = random_batch()
    args = {"log_prob": log_prob.clone(), "old_log_prob": old.clone()}
    args[name][0, 0] = float("nan")
    with pytest.raises(NonFiniteLogProbError, match=name):
        rs_loss("gmpo", args["log_prob"], args["old_log_prob"], adv, mask)
    args[name][0, 0] = float("inf")
    with pytest.raises(NonFiniteLogProbError, match=name):
        rs_loss("grpo", args["log_prob"], args["old_log_prob"], adv, mask)


# ----------------------------------------------------------------------------- advantages


def test_group_advantages_hand_computed():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0])
    a = group_advantages(r, group_size=4)
    # group 0: mean 0.25, unbiased std sqrt((0.75^2 + 3 * 0.25^2) / 3) = 0.5
    eps = 1e-6
    expected0 = torch.tensor([0.75, -0.25, -0.25, -0.25]) / (0.5 + eps)
    # group 1: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = 0.57735
    s1 = math.sqrt(1 / 3)
    expected1 = torch.tensor([-0.5, 0.5, 0.5, -0.5]) / (s1 + eps)
    torch.testing.assert_close(a, torch.cat([expected0, expected1]))


def test_group_advantages_equal_rewards_give_exact_zeros():
    r = torch.tensor([0.1, 0.1, 0.1, 1.0, 1.0, 1.0])
    assert torch.equal(group_advantages(r, 3), torch.zeros(6))
    assert torch.equal(group_advantages(torch.tensor([1.0, 0.0]), 1), torch.zeros(2))


def test_group_advantages_errors():
    with pytest.raises(ValueError, match="group_size"):
        group_advantages(torch.zeros(6), 4)
    with pytest.raises(ValueError, match="group_size"):
        group_advantages(torch.zeros(6), 0)
    with pytest.raises(ValueError, match="rewards"):
        group_advantages(torch.zeros(2, 3), 3)
    with pytest.raises(ValueError, match="rewards"):
        group_advantages(torch.tensor([1.0, float("nan")]), 2)


# ---------------------------------------------------------------------------- train-inference mismatch


def _ragged(seed=0):
    """Responses of lengths 5, 2, 4 and 0 (padding holding garbage), ratios on both sides of the bounds."""
    g = torch.Generator().manual_seed(seed)
    B, T = 4, 5
    mask = torch.zeros(B, T, dtype=torch.bool)
    for i, n in enumerate((5, 2, 4, 0)):
        mask[i, :n] = True
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    engine = old + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.9
    engine = engine + torch.tensor([[-0.5], [0.6], [0.0], [0.0]], dtype=torch.float64)  # sequence ratios > 2, < 0.5
    new = (old + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.1).requires_grad_(True)
    adv = torch.tensor([1.0, -0.5, 0.7, 0.3], dtype=torch.float64)
    garbage = torch.full((B, T), float("nan"), dtype=torch.float64)
    return (
        torch.where(mask, new, garbage.detach()),
        torch.where(mask, old, garbage),
        torch.where(mask, engine, garbage),
        adv,
        mask,
    )


def _omega_reference(mode, old, engine, mask, low, high):
    """omega by hand, row by row (rspo.losses' module docstring)."""
    B, T = mask.shape
    omega = [[0.0] * T for _ in range(B)]
    for i in range(B):
        toks = [t for t in range(T) if mask[i, t]]
        seq = math.exp(sum(float(old[i, t] - engine[i, t]) for t in toks))
        for t in toks:
            rho = seq if mode.startswith("sequence") else math.exp(float(old[i, t] - engine[i, t]))
            if mode.endswith("truncate"):
                omega[i][t] = min(rho, high)
            else:
                omega[i][t] = rho if low <= rho <= high else 0.0
    return omega


def _loss_reference(algo, new, old, adv, mask, omega, clip_low, clip_high):
    """The three objectives with omega, by hand (loops over responses and tokens)."""
    per_seq = []
    for i in range(mask.shape[0]):
        toks = [t for t in range(mask.shape[1]) if mask[i, t]]
        if not toks:
            continue
        A = float(adv[i])
        logw = [new[i, t] - float(old[i, t]) for t in toks]
        om = [omega[i][t] for t in toks]
        if algo == "grpo":
            terms = []
            for lw, o in zip(logw, om):
                r = torch.exp(lw)
                terms.append(-o * torch.minimum(r * A, r.clamp(1 - clip_low, 1 + clip_high) * A))
            per_seq.append(sum(terms) / len(terms))
        elif algo == "gspo":
            s = torch.exp(sum(logw) / len(logw))
            per_seq.append(-torch.minimum(s * A, s.clamp(1 - clip_low, 1 + clip_high) * A) * (sum(om) / len(om)))
        else:
            clipped = [
                torch.minimum(lw, lw.clamp(-clip_low, clip_high))
                if A >= 0
                else torch.maximum(lw, lw.clamp(-clip_low, clip_high))
                for lw in logw
            ]
            s = torch.exp(sum(clipped) / len(clipped))
            per_seq.append(-A * s * (sum(om) / len(om)))
    return sum(per_seq) / len(per_seq)


@pytest.mark.parametrize("algo", ["grpo", "gspo", "gmpo"])
@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
def test_rollout_corrections_equal_their_hand_written_references(algo, mode):
    """TIS, icepop and MIS (token and sequence level) on a ragged batch: the weights and the loss and its
    gradient, with RS on top (gamma binding on some tokens): the weight multiplies the clipped objective."""
    from rspo.losses import rollout_correction

    new, old, engine, adv, mask = _ragged()
    low, high = 0.5, 2.0
    omega = rollout_correction(mode, old, engine, mask, low, high)
    want = _omega_reference(mode, old, engine, mask, low, high)
    assert torch.allclose(omega, torch.tensor(want, dtype=omega.dtype), atol=1e-9)
    assert 0 < float((omega[mask] == high).sum() + (omega[mask] == 0).sum())  # a bound is reached
    clip_low, clip_high = OBJECTIVES[algo].clip
    gamma = torch.where(mask, torch.tensor(0.9, dtype=torch.float64), torch.ones((), dtype=torch.float64))
    gamma[0, :2] = 0.7  # below gamma_min: floored
    loss, m = rs_loss(
        algo,
        new,
        old,
        adv,
        mask,
        gamma=gamma,
        engine_log_prob=engine,
        correction=mode,
        correction_low=low,
        correction_high=high,
    )
    log_gamma = torch.log(gamma.clamp(min=0.8))
    ref = _loss_reference(algo, new + log_gamma, old, adv, mask, want, clip_low, clip_high)
    assert float(loss) == pytest.approx(float(ref), rel=1e-9, abs=1e-12)
    (g1,) = torch.autograd.grad(loss, new)
    (g2,) = torch.autograd.grad(ref, new)
    torch.testing.assert_close(torch.where(mask, g1, 0), torch.where(mask, g2, 0))
    assert m["rollout_corr/weight_mean"] == pytest.approx(float(omega[mask].mean()))


@pytest.mark.parametrize("algo", ["grpo", "gspo", "gmpo"])
def test_no_correction_is_the_plain_loss_bit_for_bit(algo):
    new, old, engine, adv, mask = _ragged()
    a, _ = rs_loss(algo, new, old, adv, mask)
    b, _ = rs_loss(algo, new, old, adv, mask, engine_log_prob=engine, correction="none")
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match="needs engine_log_prob"):
        rs_loss(algo, new, old, adv, mask, correction="token_truncate")


def test_mismatch_metrics_hand_computed():
    from rspo.losses import mismatch_metrics

    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    old = torch.tensor([[-1.0, -2.0, 9.0], [-0.5, 9.0, 9.0]], dtype=torch.float64)
    eng = torch.tensor([[-1.5, -1.0, 0.0], [-0.5, 0.0, 0.0]], dtype=torch.float64)
    r = [0.5, -1.0, 0.0]  # old - engine on the response tokens
    m = mismatch_metrics(old, eng, mask)
    assert m["rollout_corr/kl"] == pytest.approx(-sum(r) / 3)
    assert m["rollout_corr/k3_kl"] == pytest.approx(sum(math.exp(x) - 1 - x for x in r) / 3)
    assert m["rollout_corr/chi2_token"] == pytest.approx(sum(math.exp(2 * x) for x in r) / 3 - 1)
    assert m["rollout_corr/chi2_seq"] == pytest.approx((math.exp(2 * -0.5) + math.exp(0.0)) / 2 - 1)
    assert m["rollout_corr/max_abs_logp_diff"] == pytest.approx(1.0)
    assert m["rollout_corr/ratio_outside_frac"] == pytest.approx(1 / 3)  # e^-1 < 0.5
    assert m["rollout_corr/training_ppl"] == pytest.approx((math.exp(1.5) + math.exp(0.5)) / 2)
    assert m["rollout_corr/rollout_ppl"] == pytest.approx((math.exp(1.25) + math.exp(0.5)) / 2)
    assert m["rollout_corr/ppl_ratio"] == pytest.approx((math.exp(0.25) + 1.0) / 2)
