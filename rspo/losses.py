"""Policy losses of GRPO-style RLVR with router-shift (RS) weighting, as pure tensor functions.

Paper: "Towards Stable and Effective Reinforcement Learning for Mixture-of-Experts" (RSPO).
Equation names below are the paper's labels (``eq:...``).

    log w[i,t]        = logp_new - logp_old                                 Eq. (10, token_ratio)
    gamma_tilde[i,t]  = sg(max(gamma[i,t], gamma_min))                      Eq. (9, gamma_processed)
    log w_tilde[i,t]  = log w[i,t] + log gamma_tilde[i,t]                   Eq. (11, adjusted_ratio), log space

``log w_tilde`` then goes through the base algorithm's own clipping and aggregation:

- GRPO (Eq. grpo_surrogate, grpo_full_obj): token-level PPO clip of w_tilde at
  [1 - eps_low, 1 + eps_high] (0.2, 0.2), loss = -min(w A, clip(w) A) per token, mean over the
  tokens of a response, then mean over responses.
- GSPO (Eq. gspo_seq_ratio, gspo_surrogate, gspo_full_obj): s_i = exp(mean_t log w_tilde),
  sequence-level clip at [1 - 3e-4, 1 + 4e-4], loss_i = -min(s A, clip(s) A), mean over responses.
  RS enters per token, before the geometric mean.
- GMPO (Eq. gmpo_ratio): per-token clip of log w_tilde in LOG space at [-0.4, +0.4], sign-aware
  as in the official GMPO code and verl's ``geo_mean`` (A >= 0 clips only the upper side,
  A < 0 only the lower side), then s_i = exp(mean_t clipped log w_tilde) and loss_i = -A_i s_i,
  mean over responses.

RSPO, the paper's main method, is ``compute_policy_loss("gmpo", ..., log_gamma=log_gamma)`` with
``log_gamma = router_shift_log_weight(gamma, mask, gamma_min)`` and gamma from
``rspo.router_shift.router_shift_ratio``. The loss receives the router-shift term and the rollout
correction's weight computed (``router_shift_log_weight``, ``rollout_correction``), as verl's
policy-loss entry receives its correction weights; their diagnostics are their own functions'.

Train-inference mismatch (beyond the paper; docs/mismatch.md). The responses are sampled by the
rollout engine, whose log-probs ``logp_engine`` differ from the old pass's ``logp_old`` (another
precision, other kernels, an expert chosen differently at a near tie). ``rollout_correction`` turns
rho[i,t] = pi_old / pi_engine = exp(logp_old - logp_engine) (stop-gradient) into a weight omega on
the policy loss, in the four modes of TRL 1.16's GRPOTrainer and ms-swift (their names):

    token_truncate    omega[i,t] = min(rho[i,t], C)                          TIS (Yao et al., 2025)
    token_mask        omega[i,t] = rho[i,t] if lo <= rho[i,t] <= C else 0    icepop (Ring-1T)
    sequence_truncate omega[i]   = min(rho_i, C),  rho_i = exp(sum_t log rho[i,t])
    sequence_mask     omega[i]   = rho_i if lo <= rho_i <= C else 0          MIS

The sequence ratio is the product of the token ratios (TRL: the sum of the log differences; verl's
sequence level alike). The mask modes keep the ratio as the weight of the tokens they keep and
zero the rest, as TRL's mask modes and icepop's M(k) do; masked tokens stay in the means' counts.
Where omega enters: it multiplies the clipped objective, outside the clip (TRL multiplies its
per-token loss by it; verl's rollout correction too), while RS adjusts the log-ratio inside the clip:
GRPO's loss is -omega[i,t] min(w~ A, clip(w~) A) per token. GSPO and GMPO are sequence objectives:
their sequence term is multiplied by the masked mean of omega over the response (for the sequence
modes: omega[i] itself); TRL's GMPO applies no correction, so this is ours. With no correction
omega = 1 and every loss is the one above, bit for bit.

``mismatch_metrics`` reports, whatever the correction, how far the two policies are apart on the
sampled tokens (names of verl's and ms-swift's diagnostics; rspo.train.trainer logs them every step).

Conventions:
- ``clip_low`` / ``clip_high`` are the epsilons in each algorithm's own space: ratio space for GRPO
  and GSPO (the clip interval is [1 - clip_low, 1 + clip_high]); log space for GMPO (the interval
  is [-clip_low, +clip_high], i.e. (e^-0.4, e^0.4) in ratio space as the paper's appendix states).
- ``actor/ppo_kl`` is verl's k1 estimate: masked mean of (old_log_prob - log_prob) on the RAW
  ratio, before RS. ``actor/pg_clipfrac`` is measured on the RS-adjusted ratio: for GRPO the
  fraction of response tokens where the clipped term is the one taken (verl: L2 > L1), for GSPO
  the fraction of responses where that holds, for GMPO the fraction of response tokens whose
  log-ratio was clipped.
- Responses with an empty mask contribute nothing and are not counted in the means.

Deviations from the paper (each is an implementation detail the paper leaves open):
- GRPO clamps log w_tilde to [-20, 20] before exponentiation (as verl's vanilla loss does) so a
  degenerate token cannot overflow to inf; the clamp is inactive unless a token ratio exceeds
  e^20. GSPO and GMPO aggregate in log space and need no guard. No dual clip is used (the paper's
  GRPO is the plain PPO clip; verl adds ``clip_ratio_c`` = 3 for A < 0).
- The paper writes GMPO's clip symmetrically (Eq. gmpo_ratio); it defers the bounds to the GMPO
  paper, whose official code clips one side by the sign of the advantage. We follow that code.
- A (B, T) advantage tensor is accepted; GSPO and GMPO, which need one advantage per response,
  use its masked mean over the response (as verl does).
- ``group_advantages``: a group whose rewards are all equal gets exactly zero advantages (verl
  gets 0 up to float rounding); group_size 1 is such a group, where verl uses mean 0 and std 1.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rspo.method import DEFAULT_GAMMA_MIN, OBJECTIVES, Objective, check_gamma_min, register_objective
from rspo.method import ROLLOUT_CORRECTIONS as CORRECTIONS
from rspo.run_record import GAMMA, GAMMA_UNDER, PG_CLIPFRAC, PG_LOSS, PPO_KL

Tensor = torch.Tensor

GRPO_LOG_RATIO_GUARD = 20.0  # verl's clamp of the token log-ratio before exp (GRPO only).

# A registered loss takes the RS-adjusted log-ratio and the rollout correction's weight omega (B, T)
# and returns (loss, clipfrac).
PolicyLossFn = Callable[[Tensor, Tensor, Tensor, float, float, Tensor], tuple[Tensor, Tensor]]
RATIO_BAND = (0.5, 2.0)  # mismatch_metrics: tokens whose rho leaves it are counted
POLICY_LOSSES: dict[str, PolicyLossFn] = {}


class NonFiniteLogProbError(ValueError):
    """Raised when log-probs on response tokens contain NaN or inf (never averaged silently)."""


def register_policy_loss(name: str, facts: Objective | None = None) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Register a loss under ``name`` with its facts (rspo.method.Objective: label, default clip,
    clip-fraction unit, colour), which the configuration, the update and the report then read; the
    paper's three have theirs in rspo.method already. A new loss is this one decorator, e.g.
    ``@register_policy_loss("dapo", Objective("dapo", "DAPO", (0.2, 0.28), "token", 6))``."""
    if facts is not None:
        if facts.name != name:
            raise ValueError(f"policy loss {name!r}: its facts are named {facts.name!r}")
        register_objective(facts)
    if name not in OBJECTIVES:
        raise ValueError(f"policy loss {name!r}: no facts registered (pass an rspo.method.Objective)")

    def decorator(fn: PolicyLossFn) -> PolicyLossFn:
        if name in POLICY_LOSSES:
            raise ValueError(f"policy loss {name!r} is already registered")
        POLICY_LOSSES[name] = fn
        return fn

    return decorator


# ----------------------------------------------------------------------------- aggregation


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of x over the positions where mask is True: over all positions, or along ``dim`` (a row
    without any such position gives 0 there; every caller leaves such rows out)."""
    x = torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))
    if dim is None:
        return x.sum() / mask.sum()
    return x.sum(dim) / mask.sum(dim).clamp(min=1)


def router_shift_sums(gamma: Tensor, mask: Tensor, gamma_min: float) -> Tensor:
    """(3,) float32: the sum of gamma over the mask, the tokens under gamma_min, the tokens. Ranks
    add these before ``router_shift_stats`` divides (the TRL plug-in reduces them across processes)."""
    g = gamma.detach().float()
    zero = torch.zeros((), dtype=g.dtype, device=g.device)
    below = torch.where(mask, (g < gamma_min).float(), zero).sum()
    return torch.stack([torch.where(mask, g, zero).sum(), below, mask.sum().float()])


def router_shift_stats(sums: Tensor) -> dict[str, float]:
    """``router/shift_ratio_mean`` (mean gamma before the floor) and ``router/shift_clipfrac`` (share
    of tokens the floor lifts) from ``router_shift_sums``: the one definition of both metrics, for the
    loss, the trainer's runs without RS and the TRL plug-in (NaN when there are no tokens)."""
    return {GAMMA: (sums[0] / sums[2]).item(), GAMMA_UNDER: (sums[1] / sums[2]).item()}


def seq_mean_token_mean(per_token: Tensor, mask: Tensor) -> Tensor:
    """Mean over tokens of each response, then mean over non-empty responses.  (B, T) -> ()"""
    return masked_mean(per_token, mask, dim=1)[mask.any(dim=1)].mean()


# ----------------------------------------------------------------------------- losses


@register_policy_loss("grpo")
def grpo_loss(
    log_w: Tensor, adv_tok: Tensor, mask: Tensor, clip_low: float, clip_high: float, omega: Tensor
) -> tuple[Tensor, Tensor]:
    """Token-level PPO clip (Eq. grpo_surrogate), seq-mean-token-mean (Eq. grpo_full_obj)."""
    ratio = torch.exp(log_w.clamp(-GRPO_LOG_RATIO_GUARD, GRPO_LOG_RATIO_GUARD))  # (B, T) w_tilde
    loss_unclipped = -adv_tok * ratio  # (B, T)
    loss_clipped = -adv_tok * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)  # (B, T)
    per_token = torch.maximum(loss_unclipped, loss_clipped) * omega  # -omega min(wA, clip(w)A)
    clipfrac = masked_mean((loss_clipped > loss_unclipped).float(), mask)
    return seq_mean_token_mean(per_token, mask), clipfrac


@register_policy_loss("gspo")
def gspo_loss(
    log_w: Tensor, adv_tok: Tensor, mask: Tensor, clip_low: float, clip_high: float, omega: Tensor
) -> tuple[Tensor, Tensor]:
    """Sequence ratio s_i = exp(mean_t log w_tilde) (Eq. gspo_seq_ratio), sequence clip (Eq. gspo_surrogate)."""
    valid = mask.any(dim=1)  # (B,)
    seq_log_ratio = masked_mean(log_w, mask, dim=1)  # (B,) mean_t log w_tilde
    s = torch.exp(torch.where(valid, seq_log_ratio, torch.zeros_like(seq_log_ratio)))  # (B,)
    adv = masked_mean(adv_tok, mask, dim=1)  # (B,) one advantage per response
    loss_unclipped = -adv * s
    loss_clipped = -adv * s.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_seq = torch.maximum(loss_unclipped, loss_clipped) * masked_mean(omega, mask, dim=1)  # (B,)
    clipfrac = (loss_clipped > loss_unclipped)[valid].float().mean()
    return per_seq[valid].mean(), clipfrac


@register_policy_loss("gmpo")
def gmpo_loss(
    log_w: Tensor, adv_tok: Tensor, mask: Tensor, clip_low: float, clip_high: float, omega: Tensor
) -> tuple[Tensor, Tensor]:
    """Sign-aware per-token log clip, then geometric mean (Eq. gmpo_ratio); loss_i = -A_i s_i."""
    valid = mask.any(dim=1)  # (B,)
    clipped = log_w.clamp(-clip_low, clip_high)  # (B, T)
    # A >= 0: min(log w, clip) only cuts the upper side; A < 0: max(log w, clip) only the lower side.
    log_w_star = torch.where(adv_tok >= 0, torch.minimum(log_w, clipped), torch.maximum(log_w, clipped))
    clipfrac = masked_mean((log_w_star != log_w).float(), mask)
    seq_log_ratio = masked_mean(log_w_star, mask, dim=1)  # (B,)
    s = torch.exp(torch.where(valid, seq_log_ratio, torch.zeros_like(seq_log_ratio)))  # (B,) s_bar_i
    adv = masked_mean(adv_tok, mask, dim=1)  # (B,) one advantage per response
    per_seq = -adv * s * masked_mean(omega, mask, dim=1)  # omega's mean over the response
    return per_seq[valid].mean(), clipfrac


# ----------------------------------------------------------------------------- entry point


def _check_finite(name: str, x: Tensor, mask: Tensor) -> None:
    bad = ~torch.isfinite(x) & mask
    if bool(bad.any()):
        raise NonFiniteLogProbError(f"{name} has {int(bad.sum())} non-finite value(s) (NaN or inf) on response tokens")


def router_shift_log_weight(
    gamma: Tensor,
    mask: Tensor,
    gamma_min: float = DEFAULT_GAMMA_MIN,
    stop_gradient: bool = True,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """log gamma_tilde (B, T), the term Eq. (11, adjusted_ratio) adds to the log-ratio: gamma
    checked on the response tokens (finite, in (0, 1]), floored at gamma_min (Eq. 9,
    gamma_processed), detached under ``stop_gradient`` (the paper's sg[.]); 0 on padding.
    ``compute_policy_loss`` and the TRL plug-in (``rspo.integrations.trl``) both use it."""
    gamma_min = check_gamma_min(float(gamma_min))
    if gamma.shape != mask.shape:
        raise ValueError(f"gamma: shape {tuple(gamma.shape)} does not match the response mask {tuple(mask.shape)}")
    dtype = gamma.dtype if dtype is None else dtype
    gamma = torch.where(mask, gamma.to(dtype), torch.ones((), dtype=dtype))
    _check_finite("gamma", gamma, mask)
    if bool(((gamma <= 0) | (gamma > 1)).any()):
        lo, hi = float(gamma[mask].min()), float(gamma[mask].max())
        raise ValueError(f"gamma: must lie in (0, 1] on response tokens, got range [{lo}, {hi}]")
    gamma_floored = gamma.clamp(min=gamma_min)  # max(gamma, gamma_min)   Eq. (9, gamma_processed)
    log_gamma = torch.log(gamma_floored)
    if stop_gradient:
        log_gamma = log_gamma.detach()  # sg[.]
    return log_gamma


def compute_policy_loss(
    algo: str,
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    log_gamma: Tensor | None = None,
    weight: Tensor | None = None,
    clip: tuple[float | None, float | None] | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Policy loss of ``algo`` with the router-shift term and the rollout-correction weight given.

    Args:
        algo: a registered loss: "grpo" | "gspo" | "gmpo" (rspo.method.OBJECTIVES).
        log_prob: (B, T) current-policy log-probs of the sampled tokens, with grad.
        old_log_prob: (B, T) old-policy log-probs (treated as constants).
        advantages: (B,) one advantage per response, or (B, T).
        response_mask: (B, T) 1 for response tokens, 0 for padding.
        log_gamma: (B, T) log gamma_tilde, added to the log-ratio inside the clip (Eq. 11,
            adjusted_ratio): ``router_shift_log_weight(gamma, mask, gamma_min, stop_gradient)`` with
            gamma from ``rspo.router_shift.router_shift_ratio`` (Eq. 7); None: no RS.
        weight: (B, T) the rollout correction's omega, outside the clip: ``rollout_correction(...)``
            (module docstring); None: omega = 1.
        clip: (clip_low, clip_high), epsilons in the algorithm's own space; None (or a None in it):
            the paper's for ``algo``.

    Returns:
        (loss, metrics): a scalar tensor to minimise, and python floats under ``actor/pg_loss``,
        ``actor/ppo_kl`` (on the raw ratio, before RS) and ``actor/pg_clipfrac``. The router-shift
        and correction diagnostics are their own functions' (``router_shift_metrics``,
        ``correction_metrics``).
    """
    if algo not in POLICY_LOSSES:
        raise ValueError(f"algo: unknown policy loss {algo!r}; choose one of {sorted(POLICY_LOSSES)}")
    if log_prob.dim() != 2:
        raise ValueError(f"log_prob: expected shape (B, T), got {tuple(log_prob.shape)}")
    shape = log_prob.shape
    for name, t in (
        ("old_log_prob", old_log_prob),
        ("response_mask", response_mask),
        ("log_gamma", log_gamma),
        ("weight", weight),
    ):
        if t is not None and t.shape != shape:
            raise ValueError(f"{name}: shape {tuple(t.shape)} does not match log_prob {tuple(shape)}")
    if advantages.shape == shape[:1]:
        adv_tok = advantages.unsqueeze(1).expand(shape)  # (B,) -> (B, T)
    elif advantages.shape == shape:
        adv_tok = advantages
    else:
        raise ValueError(f"advantages: expected shape ({shape[0]},) or {tuple(shape)}, got {tuple(advantages.shape)}")
    low, high = (None, None) if clip is None else clip
    clip_low = OBJECTIVES[algo].clip[0] if low is None else float(low)
    clip_high = OBJECTIVES[algo].clip[1] if high is None else float(high)
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip: must be >= 0, got ({clip_low}, {clip_high})")

    mask = response_mask.bool()
    if not bool(mask.any()):
        raise ValueError("response_mask: empty (no response token in the batch)")
    _check_finite("log_prob", log_prob, mask)
    _check_finite("old_log_prob", old_log_prob, mask)
    _check_finite("advantages", adv_tok, mask)

    zero = torch.zeros((), dtype=log_prob.dtype, device=log_prob.device)
    # Padding may hold anything (even NaN); it must not reach the masked sums or their gradients.
    log_w = torch.where(mask, log_prob - old_log_prob.detach(), zero)  # (B, T) Eq. (10, token_ratio)
    adv_tok = torch.where(mask, adv_tok.detach().to(log_prob.dtype), zero)
    metrics: dict[str, float] = {PPO_KL: masked_mean(-log_w.detach(), mask).item()}
    if log_gamma is not None:
        log_w = log_w + log_gamma  # log w_tilde = log w + log gamma_tilde     Eq. (11, adjusted_ratio)
    omega = torch.ones_like(log_w) if weight is None else weight
    loss, clipfrac = POLICY_LOSSES[algo](log_w, adv_tok, mask, clip_low, clip_high, omega)
    metrics[PG_LOSS] = loss.item()
    metrics[PG_CLIPFRAC] = clipfrac.item()
    return loss, metrics


def router_shift_metrics(gamma: Tensor, mask: Tensor, gamma_min: float) -> dict[str, float]:
    """``router/shift_ratio_mean`` and ``router/shift_clipfrac`` of gamma (RS on or off)."""
    return router_shift_stats(router_shift_sums(gamma, mask.bool(), gamma_min))


def correction_metrics(omega: Tensor, mask: Tensor) -> dict[str, float]:
    """``rollout_corr/weight_mean`` and ``rollout_corr/zeroed_frac`` (the tokens a mask mode left out)."""
    mask = mask.bool()
    return {
        "rollout_corr/weight_mean": masked_mean(omega, mask).item(),
        "rollout_corr/zeroed_frac": masked_mean((omega == 0).float(), mask).item(),
    }


def rollout_correction(
    mode: str, old_log_prob: Tensor, engine_log_prob: Tensor, mask: Tensor, low: float = 0.5, high: float = 2.0
) -> Tensor:
    """The correction's weight omega (B, T) (module docstring; 1 with mode "none"), stop-gradient:
    rho = pi_old / pi_engine per token, or per sequence (the product over its response tokens)."""
    if mode not in CORRECTIONS:
        raise ValueError(f"rollout correction: unknown mode {mode!r}; choose one of {list(CORRECTIONS)}")
    mask = mask.bool()
    if mode != "none":
        if engine_log_prob is None or engine_log_prob.shape != old_log_prob.shape:
            raise ValueError(f"correction {mode!r}: needs engine_log_prob of shape {tuple(old_log_prob.shape)}")
        _check_finite("engine_log_prob", engine_log_prob, mask)
    dtype = torch.promote_types(old_log_prob.dtype, torch.float32)  # at least fp32
    if mode == "none":
        return torch.ones(old_log_prob.shape, dtype=dtype, device=old_log_prob.device)
    zero = torch.zeros((), dtype=dtype, device=old_log_prob.device)
    log_rho = torch.where(mask, old_log_prob.detach().to(dtype) - engine_log_prob.detach().to(dtype), zero)  # (B, T)
    if mode.startswith("sequence"):  # rho_i = exp(sum_t log rho): one ratio per response, on every token
        log_rho = log_rho.sum(dim=1, keepdim=True).expand_as(log_rho)
    rho = torch.exp(log_rho.clamp(max=GRPO_LOG_RATIO_GUARD))  # a sequence ratio beyond e^20 is above any bound
    if mode.endswith("truncate"):
        omega = rho.clamp(max=high)
    else:
        omega = torch.where((rho >= low) & (rho <= high), rho, zero)
    return torch.where(mask, omega, zero)


def mismatch_metrics(old_log_prob: Tensor, engine_log_prob: Tensor, mask: Tensor) -> dict[str, float]:
    """How far the trainer's and the engine's policies are apart on the engine's samples (over the
    response tokens; names of verl's and ms-swift's diagnostics): with r = logp_old - logp_engine,
    ``kl`` mean(-r) (the k1 estimate of KL(engine || trainer)), ``k3_kl`` mean(e^r - 1 - r),
    ``training_ppl`` / ``rollout_ppl`` per response exp(-mean logp), averaged, ``ppl_ratio`` mean of
    their per-response ratio, ``log_ppl_diff`` mean over responses of mean(-r), ``chi2_token``
    mean(e^2r) - 1, ``chi2_seq`` mean over responses of e^(2 sum r) - 1, ``max_abs_logp_diff``,
    ``ratio_outside_frac`` the share of tokens whose e^r leaves RATIO_BAND."""
    mask = mask.bool()
    valid = mask.any(dim=1)
    old, eng = old_log_prob.detach().double(), engine_log_prob.detach().double()
    zero = torch.zeros((), dtype=torch.float64, device=old.device)
    r = torch.where(mask, old - eng, zero)  # (B, T)
    n = mask.sum(dim=1).clamp(min=1)
    mean_old = torch.where(mask, old, zero).sum(1) / n
    mean_eng = torch.where(mask, eng, zero).sum(1) / n
    ratio = torch.exp(r)
    low, high = RATIO_BAND
    out = {
        "kl": masked_mean(-r, mask),
        "k3_kl": masked_mean(ratio - 1 - r, mask),
        "training_ppl": torch.exp(-mean_old)[valid].mean(),
        "rollout_ppl": torch.exp(-mean_eng)[valid].mean(),
        "ppl_ratio": torch.exp(mean_eng - mean_old)[valid].mean(),
        "log_ppl_diff": (mean_eng - mean_old)[valid].mean(),
        "chi2_token": masked_mean(torch.exp(2 * r), mask) - 1,
        "chi2_seq": (torch.exp((2 * r.sum(1)).clamp(max=700)) - 1)[valid].mean(),
        "max_abs_logp_diff": r.abs().max(),
        "ratio_outside_frac": masked_mean(((ratio < low) | (ratio > high)).double(), mask),
    }
    return {f"rollout_corr/{k}": float(v) for k, v in out.items()}


def group_advantages(rewards: Tensor, group_size: int, eps: float = 1e-6) -> Tensor:
    """GRPO advantages: (r - mean_g) / (std_g + eps) within consecutive groups of ``group_size``.

    std is unbiased (as verl's ``compute_grpo_outcome_advantage``). A group whose rewards are all
    equal (including a group of one) gets exactly zero advantages.  (B,) -> (B,)
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards: expected shape (B,), got {tuple(rewards.shape)}")
    if group_size < 1:
        raise ValueError(f"group_size: must be >= 1, got {group_size}")
    if rewards.numel() % group_size != 0:
        raise ValueError(f"group_size: {group_size} does not divide the number of rewards {rewards.numel()}")
    if not bool(torch.isfinite(rewards).all()):
        raise ValueError("rewards: contains NaN or inf")
    r = rewards.to(torch.float32).view(-1, group_size)  # (B/G, G)
    constant = r.max(dim=1, keepdim=True).values == r.min(dim=1, keepdim=True).values  # (B/G, 1)
    if group_size == 1:
        return torch.zeros_like(rewards, dtype=torch.float32)
    mean = r.mean(dim=1, keepdim=True)
    std = r.std(dim=1, unbiased=True, keepdim=True)
    adv = torch.where(constant, torch.zeros_like(r), (r - mean) / (std + eps))
    return adv.view(-1)
