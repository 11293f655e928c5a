"""Router-shift weighting (RS) for TRL's GRPO-style trainers: ``RSGRPOTrainer`` (GRPO, and GSPO with
``importance_sampling_level="sequence"``) and ``RSPOTrainer`` (TRL's GMPO + RS: the paper's method).

    from rspo.integrations.trl import RSPOConfig, RSPOTrainer

    args = RSPOConfig(output_dir="out", steps_per_generation=4, gamma_min=0.8)   # off-policy: see below
    trainer = RSPOTrainer(model="Qwen/Qwen3-30B-A3B", reward_funcs=my_reward, args=args, train_dataset=ds)
    trainer.train()

What it does (paper Sec. 4, Eqs. 5-11; the same functions as ``rspo train``, no second copy):
- The old pass (TRL's ``_generate_and_score_completions`` computes the old log-probs with
  ``_get_per_token_logps_and_entropies``) also records, through ``rspo.router.capture_router_logits``,
  the experts each MoE layer picked for every completion token and their log-probabilities
  (``rspo.router.OldRouterCache``: 3 bytes per (token, layer, k)). They travel with the batch as two
  batch-first tensors, ``rs_old_indices`` and ``rs_old_logp`` of shape (B, C, L, K), so TRL's
  shuffle and split keep them matched to their completions.
- The loss forward records the current router logits; ``rspo.router.router_shift_ratio`` gives
  gamma (B, C) on the positions that predict the completion tokens, and
  ``rspo.losses.router_shift_log_weight`` the floored, stop-gradient log gamma_tilde (Eq. 9).
- TRL's loss reads the old log-probs after its forward; it receives ``old - log gamma_tilde``, so
  its log-ratio is log w + log gamma_tilde (Eq. 11) before TRL's own clipping and aggregation
  (token level for GRPO, the sequence mean for GSPO, the sign-aware log clip and geometric mean for
  GMPO). The batch's inputs are never modified in place (TRL reuses them over ``num_iterations``).
- ``router/shift_ratio_mean`` and ``router/shift_clipfrac`` (the names ``rspo train`` logs) go
  through TRL's metric logging, token-weighted over every rank.

It refuses, naming why: a model ``rspo.router`` does not support (Qwen2-MoE, Qwen3-MoE, Mixtral
and OLMoE are); an on-policy configuration, where every update of a generation falls in one
optimiser step (``gradient_accumulation_steps`` a multiple of ``steps_per_generation *
num_iterations``): old and new routers are then the same and RS can do nothing; a TRL loss type
outside the PPO-clip family (``grpo``, ``bnpo``, ``dr_grpo``, ``dapo``); gamma_min outside (0, 1].

Side effects inside TRL (what else sees the shifted ratio, as RS means it to): TRL's off-policy
sequence mask (``off_policy_mask_threshold``) when no vLLM sampling log-probs exist, and the
bias-corrected KL (``use_bias_correction_kl``). The KL to the reference model itself uses the new
log-probs and is unchanged. TRL's vLLM importance-sampling ratio is computed before and is unchanged.

TRL's vLLM importance-sampling correction (``use_vllm=True`` with ``vllm_importance_sampling_correction``,
on by default; the modes ``vllm_importance_sampling_mode``, truncation ``vllm_importance_sampling_clip_*``):
TRL computes the ratio rho = pi_old / pi_vLLM in its generation step, truncated or masked, and
``GRPOTrainer._compute_loss`` multiplies its per-token loss by it, outside the clip; ``RSGRPOTrainer``
keeps that as it is (RS inside the clip, the correction outside: rspo.losses' composition). TRL 1.16's
``GMPOTrainer._compute_loss`` never reads the ratio, so a GMPO run with vLLM rollouts silently trains
uncorrected under a config that says the correction is on. ``RSPOTrainer`` applies it instead of
refusing the combination (the correction is what the paper's regime of engine/trainer mismatch asks
for, and the loss is defined in rspo.losses): each response's term -A_i s_i is weighted by the
masked mean of its token ratios over the response (TRL's sequence modes: the sequence ratio), as
``rspo.losses.compute_policy_loss(..., weight=omega)`` weights a sequence objective; equal to it on
one batch (tests/test_integrations_trl.py). Upstream difference, kept by plain ``GMPOTrainer``: TRL's
GRPO trainer corrects, its GMPO trainer does not. GMPO's clip-fraction metrics count by the sign of
the (weighted) advantage: a response a mask mode zeroes is left out of them.

Where it differs from ``rspo train`` (TRL's choices, kept): the router positions and gamma are
ours (the position that predicts each completion token, as ``rspo.models.response_slice``), but the
objective around them is TRL's: its GMPO clips where A > 0 (ours A >= 0: the same loss, A = 0 adds
nothing), its means count responses with an empty mask, its loss is divided by the accumulation
steps, and its MoE load-balancing loss follows ``router_aux_loss_coef`` (TRL turns it on for MoE
configs; the study and ``rspo parity`` set 0). On one batch the plug-in's loss and gradients equal
``rspo.losses.compute_policy_loss`` (tests/test_integrations_trl.py).

Tested with TRL 1.16.0 only (the ``trl`` extra pins it): the plug-in overrides private methods of
``GRPOTrainer`` (``_generate_and_score_completions``, ``_get_per_token_logps_and_entropies``,
``_compute_loss``) and relies on their order: the old pass is the first
``_get_per_token_logps_and_entropies`` call of a generation (the reference pass comes after it),
and ``_compute_loss`` reads the old log-probs after its forward (a read before the forward raises).
Not covered (untested, not refused unless said): TRL's liger loss path (refused), vLLM server mode,
DeepSpeed and FSDP on GPUs, PEFT models (refused: the routers sit under the adapter wrapper).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rspo.losses import router_shift_log_weight, router_shift_stats, router_shift_sums
from rspo.method import DEFAULT_GAMMA_MIN, check_gamma_min
from rspo.models import response_slice
from rspo.router import OldRouterCache, capture_router_logits, router_shift_ratio, router_spec

TESTED_TRL = "1.16.0"
PPO_CLIP_LOSSES = ("grpo", "bnpo", "dr_grpo", "dapo")
OLD_KEYS = ("rs_old_indices", "rs_old_logp")

try:
    from trl import GRPOConfig, GRPOTrainer
    from trl.experimental.gmpo import GMPOConfig, GMPOTrainer
except ImportError as e:  # pragma: no cover - the optional extra
    raise ImportError(
        f"rspo.integrations.trl needs TRL {TESTED_TRL}, an optional dependency: pip install 'trl=={TESTED_TRL}' "
        "(docs/trl.md; the repository's `make venv` has it)"
    ) from e


@dataclass
class _RSFields:
    """The two fields RS adds to a TRL config (mixed in before TRL's config class)."""

    gamma_min: float = field(
        default=DEFAULT_GAMMA_MIN,
        metadata={"help": "Floor of the router-shift ratio, in (0, 1] (paper: 0.8 in all experiments)."},
    )
    stop_gradient: bool = field(
        default=True, metadata={"help": "Detach the router-shift weight (paper: true; false is the ablation)."}
    )

    def __post_init__(self):
        super().__post_init__()
        self.gamma_min = check_gamma_min(float(self.gamma_min))


@dataclass
class RSGRPOConfig(_RSFields, GRPOConfig):
    """TRL's GRPOConfig plus RS: ``gamma_min`` (default 0.8) and ``stop_gradient`` (default true)."""


@dataclass
class RSPOConfig(_RSFields, GMPOConfig):
    """TRL's GMPOConfig plus RS (the paper's RSPO): ``gamma_min`` (0.8) and ``stop_gradient`` (true)."""


class _ShiftedOld(dict):
    """The batch inputs as ``_compute_loss`` sees them: ``old_per_token_logps`` is ``old - log
    gamma_tilde``, computed from the forward of this call (so it must be read after it)."""

    def __init__(self, inputs: dict, trainer: RouterShiftMixin):
        super().__init__(inputs)
        self._trainer = trainer

    def get(self, key, default=None):
        if key == "old_per_token_logps":
            return self._trainer._rs_shifted_old(dict.get(self, key))
        return dict.get(self, key, default)

    def __getitem__(self, key):
        if key == "old_per_token_logps":
            return self._trainer._rs_shifted_old(dict.__getitem__(self, key))
        return dict.__getitem__(self, key)


class RouterShiftMixin:
    """RS for a GRPOTrainer subclass (see the module docstring); put it first in the bases."""

    def _rs_init(self) -> None:
        args = self.args
        self.rs_gamma_min = check_gamma_min(float(getattr(args, "gamma_min", DEFAULT_GAMMA_MIN)))
        self.rs_stop_gradient = bool(getattr(args, "stop_gradient", True))
        base = self.accelerator.unwrap_model(self.model)
        if hasattr(base, "peft_config"):
            raise ValueError("RS with a PEFT model is not supported: its routers sit under the adapter wrapper")
        self.rs_spec = router_spec(base)  # ValueError naming the class for an unsupported model
        generate_every = args.steps_per_generation * self.num_iterations
        if args.gradient_accumulation_steps % generate_every == 0:
            raise ValueError(
                "RS can do nothing in this configuration: gradient_accumulation_steps "
                f"({args.gradient_accumulation_steps}) is a multiple of steps_per_generation x num_iterations "
                f"({args.steps_per_generation} x {self.num_iterations}), so every update of a generation happens "
                "in one optimiser step and the old and new routers are the same (on-policy; TRL computes no old "
                "pass). Set steps_per_generation > gradient_accumulation_steps or num_iterations > 1."
            )
        if getattr(self, "loss_type", "grpo") not in PPO_CLIP_LOSSES and not isinstance(self, GMPOTrainer):
            raise ValueError(
                f"RS is defined here for TRL's PPO-clip losses {list(PPO_CLIP_LOSSES)} and GMPO; "
                f"loss_type={self.loss_type!r} is not covered"
            )
        if getattr(args, "use_liger_kernel", False):
            raise ValueError("RS does not cover TRL's liger path (use_liger_kernel=True): its loss skips these hooks")
        self._rs_phase: str | None = None  # "old": the next logps call is the old pass; "loss": the loss forward
        self._rs_cache: OldRouterCache | None = None
        self._rs_log_gamma: torch.Tensor | None = None

    # ---- the old pass ------------------------------------------------------------------------------

    def _generate_and_score_completions(self, inputs):
        self._rs_phase, self._rs_old = "old", None
        try:
            out = super()._generate_and_score_completions(inputs)
        finally:
            self._rs_phase = None
        old, self._rs_old = self._rs_old, None
        if "old_per_token_logps" not in out or old is None:
            raise RuntimeError("RS: TRL computed no old pass for this generation (on-policy); see the module docstring")
        B, C = out["completion_ids"].shape
        if old.batch_shape != (B, C):
            raise RuntimeError(f"RS: old-router cache of shape {old.batch_shape} for a batch of {(B, C)} completions")
        out["rs_old_indices"] = old.indices.permute(1, 2, 0, 3).contiguous()  # (B, C, L, K) batch-first
        out["rs_old_logp"] = old.logp.permute(1, 2, 0, 3).contiguous()
        return out

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *a, **kw):
        phase = self._rs_phase
        if phase not in ("old", "loss"):  # generation-time reference passes, evaluation extras
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, *a, **kw
            )
        self._rs_phase = "done" if phase == "old" else phase  # only the first call of a generation is the old pass
        base = self.accelerator.unwrap_model(model)
        detach = phase == "old" or self.rs_stop_gradient
        with capture_router_logits(base, detach=detach) as cap:
            result = super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, *a, **kw
            )
        B, S = input_ids.shape
        C = int(logits_to_keep)
        # the positions that predict the completion tokens, as everywhere in rspo
        logits = [response_slice(lg.view(B, S, -1), S - C) for lg in cap.logits]
        if phase == "old":
            indices = [response_slice(ix.view(B, S, -1), S - C).reshape(B * C, -1) for ix in cap.indices]
            self._rs_old = OldRouterCache.from_logits(
                [lg.reshape(B * C, -1) for lg in logits], self.rs_spec.top_k, (B, C), indices_list=indices
            )
        else:
            cache = OldRouterCache(
                indices=self._rs_inputs["rs_old_indices"].permute(2, 0, 1, 3),  # (L, B, C, K)
                logp=self._rs_inputs["rs_old_logp"].permute(2, 0, 1, 3),
                num_experts=self.rs_spec.num_experts,
            )
            with torch.set_grad_enabled(not self.rs_stop_gradient and torch.is_grad_enabled()):
                self._rs_gamma = router_shift_ratio(cache, logits)  # (B, C)
        return result

    # ---- the loss -----------------------------------------------------------------------------------

    def _compute_loss(self, model, inputs):
        missing = [k for k in OLD_KEYS if k not in inputs]
        if missing:
            raise RuntimeError(f"RS: the batch has no {missing}; it did not come from this trainer's old pass")
        self._rs_phase, self._rs_inputs, self._rs_gamma = "loss", inputs, None
        try:
            return super()._compute_loss(model, _ShiftedOld(self._with_vllm_correction(inputs), self))
        finally:
            self._rs_phase, self._rs_inputs, self._rs_gamma = None, None, None

    def _with_vllm_correction(self, inputs: dict) -> dict:
        """GMPO: TRL's vLLM importance-sampling ratio applied outside the clip (module docstring), which
        TRL's GMPOTrainer leaves out. Its loss is -A_i s_i per response, s_i the geometric mean of the
        clipped (RS-adjusted) ratios; the corrected one is -m_i A_i s_i with m_i the response's masked mean
        of the ratio (the ratio itself in TRL's sequence modes), as rspo.losses weights a sequence
        objective. m_i >= 0 is stop-gradient, so it rides on the advantage: the sign-aware clip sees the
        same sign (a response with m_i = 0 adds nothing either way). A new dict: never in place."""
        if not isinstance(self, GMPOTrainer) or not (self.use_vllm and self.vllm_importance_sampling_correction):
            return inputs
        ratio = inputs.get("importance_sampling_ratio")
        if ratio is None:
            raise RuntimeError("RS: use_vllm with its importance-sampling correction, but the batch has no ratio")
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        ratio = ratio.detach().to(inputs["advantages"].dtype)
        if ratio.shape[1] == 1:  # TRL's sequence modes: one ratio per response
            per_response = ratio[:, 0]
        else:
            per_response = (ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        return {**inputs, "advantages": inputs["advantages"] * per_response}

    def _rs_shifted_old(self, old: torch.Tensor | None) -> torch.Tensor:
        gamma = self._rs_gamma
        if gamma is None:
            raise RuntimeError(
                "RS: the old log-probs were read before the loss forward; this TRL version reads them in another "
                f"order than {TESTED_TRL}, which this plug-in was written for"
            )
        if old is None:
            raise RuntimeError("RS: the batch has no old log-probs (on-policy); see the module docstring")
        inputs = self._rs_inputs
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        mask = mask.bool()
        log_gamma = router_shift_log_weight(gamma, mask, self.rs_gamma_min, self.rs_stop_gradient, old.dtype)
        self._rs_log_metrics(gamma.detach(), mask)
        return old - log_gamma  # a new tensor: the buffered inputs are reused over num_iterations

    def _rs_log_metrics(self, gamma: torch.Tensor, mask: torch.Tensor) -> None:
        total = self.accelerator.reduce(router_shift_sums(gamma, mask, self.rs_gamma_min), reduction="sum")
        mode = "train" if self.model.training else "eval"
        for name, value in router_shift_stats(total).items():
            self._metrics[mode][name].append(value)


class RSGRPOTrainer(RouterShiftMixin, GRPOTrainer):
    """TRL's GRPOTrainer with router-shift weighting (GRPO; GSPO with importance_sampling_level="sequence")."""

    _tag_names = ["trl", "grpo", "rspo"]

    def __init__(self, model, reward_funcs, args: RSGRPOConfig | None = None, **kwargs):
        super().__init__(model, reward_funcs, args=args, **kwargs)
        self._rs_init()


class RSPOTrainer(RouterShiftMixin, GMPOTrainer):
    """TRL's GMPOTrainer with router-shift weighting: RSPO, the paper's method."""

    _tag_names = ["trl", "gmpo", "rspo"]

    def __init__(self, model, reward_funcs, args: RSPOConfig | None = None, **kwargs):
        super().__init__(model, reward_funcs, args=args, **kwargs)
        self._rs_init()
