"""The pretraining settings of a preset (``pretrain:``) as typed sections: the architecture of the small
MoE (``ArchConfig``, the mapping ``pretrain.model``; ``pretrain.text_model`` overlays it for the
math and code models) and the SFT run (``PretrainConfig``). Each setting's type, default, constraints
and description are stated once, on its field (rspo.constraints.setting); rspo.models builds the
transformers config from an ``ArchConfig``, ``rspo pretrain`` reads a ``PretrainConfig``, and the
preset schema's ``pretrain`` block is generated from these classes (scripts/preset_schema.py).

The architecture's defaults are a 4-layer, 128-wide Qwen2-MoE with 8 experts and top-1 routing
(the CPU scale; the paper's small model, Appendix A, is 12 layers: configs/paper_small.yaml).
It imports nothing heavy: the workflow reads it at plan time.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from rspo.config import PROMPT_FORMATS, build_checked
from rspo.constraints import Section, setting
from rspo.method import ConfigError

__all__ = ["ARCHS", "SOLUTIONS", "ArchConfig", "PretrainConfig", "build_arch", "build_pretrain"]

ARCHS = ("qwen2_moe", "qwen3_moe")
SOLUTIONS = ("first", "any")


@dataclass(frozen=True)
class ArchConfig(Section):
    """A small MoE's architecture (transformers' Qwen2-MoE or Qwen3-MoE, every layer sparse)."""

    arch: str = setting("qwen2_moe", choices=ARCHS, noun="architecture")
    """Model family: qwen2_moe (with an optional shared expert) or qwen3_moe."""
    hidden_size: int = setting(128, ge=1)
    """Width of the residual stream."""
    num_layers: int = setting(4, ge=1)
    """Decoder layers (each one an MoE layer)."""
    num_heads: int = setting(4, ge=1)
    """Attention heads."""
    num_kv_heads: int | None = setting(None, ge=1)
    """Key/value heads (unset: num_heads, no grouping)."""
    head_dim: int | None = setting(None, ge=1)
    """Width of one head (unset: transformers' hidden_size / num_heads)."""
    intermediate_size: int = setting(512, ge=1)
    """Width of a dense MLP (transformers' field; unused where every layer is sparse)."""
    moe_intermediate_size: int = setting(256, ge=1)
    """Width of one expert's MLP."""
    num_experts: int = setting(8, ge=1)
    """Experts per layer."""
    top_k: int = setting(1, ge=1)
    """Experts a token is routed to."""
    norm_topk_prob: bool = False
    """Renormalise the top-k routing weights to sum to 1."""
    shared_expert_intermediate_size: int = setting(0, ge=0)
    """qwen2_moe: width of the shared expert (0: none)."""
    max_position_embeddings: int = setting(256, ge=1)
    """Longest sequence (prompt and response) the model is built for."""
    router_aux_loss_coef: float = setting(0.0, ge=0)
    """transformers' load-balancing coefficient stored in the model config (pretraining's own is
    pretrain.router_aux_loss_coef)."""
    rope_theta: float = setting(10000.0, gt=0)
    """Rotary embedding base."""
    tie_word_embeddings: bool = True
    """Share the input embedding and the output head."""

    def checks(self, prefix: str) -> None:
        if self.top_k > self.num_experts:
            raise ConfigError(f"{prefix}.top_k: larger than num_experts ({self.top_k} > {self.num_experts})")
        if self.top_k == 1 and self.norm_topk_prob:
            raise ConfigError(
                f"{prefix}.norm_topk_prob: with top-1 routing, renormalising makes the single routing "
                "weight exactly 1 and the router gets no gradient; set it to false"
            )


@dataclass(frozen=True)
class PretrainConfig(Section):
    """Next-token SFT of the small MoE from scratch (rspo pretrain; paper Appendix A)."""

    model: ArchConfig = setting(ArchConfig(), ref="arch")
    """Architecture of the Countdown model."""
    text_model: dict[str, Any] | None = setting(None, ref="arch")
    """Overlay on `model` for the math/code base models (smoke only), e.g. longer positions."""
    format: str = setting("steps", choices=PROMPT_FORMATS, noun="format")
    """Countdown completion format: steps, optimal_path or search_path (rspo.tasks.countdown)."""
    examples: int = setting(1000, ge=1)
    """Training examples seen (steps = examples // batch_size)."""
    batch_size: int = setting(64, ge=1)
    """Examples per optimizer step."""
    lr: float = setting(1e-3, gt=0)
    """Peak learning rate (AdamW, betas 0.9/0.95)."""
    min_lr_ratio: float = setting(0.1, ge=0, le=1)
    """Final learning rate of the cosine decay, as a fraction of lr."""
    warmup_steps: int = setting(100, ge=0)
    """Linear warm-up steps."""
    weight_decay: float = setting(0.01, ge=0)
    """AdamW weight decay."""
    router_aux_loss_coef: float = setting(0.01, ge=0)
    """Weight of the load-balancing loss added to the SFT loss."""
    eval_every: int = setting(1000, ge=0)
    """Steps between held-out checks (0: only at the end)."""
    eval_size: int = setting(200, ge=1)
    """Held-out problems of each check."""
    ckpt_every: int = setting(500, ge=1)
    """Steps between resumable checkpoints."""
    seed: int = 0
    """Initialisation and data-order seed."""
    max_new_tokens: int = setting(64, ge=1)
    """Budget of the greedy held-out check during pretraining."""
    vocab_size: int = setting(512, ge=1)
    """Math/code byte-level BPE tokenizer size."""
    solution: str = setting("first", choices=SOLUTIONS, noun="solution")
    """Countdown `steps` targets: first (the solution Qin et al.'s DFS finds first) or any (one of the
    problem's valid solutions, drawn per example)."""

    def checks(self, prefix: str) -> None:
        if self.solution == "any" and self.format != "steps":
            raise ConfigError(f"{prefix}.solution: `any` needs format `steps` (the traces follow one search)")
        if self.text_model is not None:
            self.architecture("math")

    def architecture(self, task: str) -> ArchConfig:
        """The architecture of a task's model: `model`, and for math and code, whose prompts are
        longer, `text_model` on top."""
        if task == "countdown" or not self.text_model:
            return self.model
        return build_arch({**dataclasses.asdict(self.model), **self.text_model}, "pretrain.text_model")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def build_arch(data: dict[str, Any] | ArchConfig | None, prefix: str = "pretrain.model") -> ArchConfig:
    """An ``ArchConfig`` from a preset's mapping (its defaults where it sets none), checked: a
    ConfigError names the key."""
    if isinstance(data, ArchConfig):
        return data
    return build_checked(ArchConfig, data, prefix)


def build_pretrain(data: dict[str, Any] | None) -> PretrainConfig:
    """The typed ``pretrain:`` section (defaults where the preset sets none), checked."""
    return build_checked(PretrainConfig, data, "pretrain")
