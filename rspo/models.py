"""MoE causal LMs: build from an architecture (a preset's `pretrain.model`), load/save checkpoints, log-probs.

The small-scale setting of the paper is a Qwen2.5-MoE-style model (12 layers, 8 experts, top-1)
pretrained from scratch on Countdown (Appendix A). ``build_model`` makes such a model from an
architecture (``rspo.pretrain_config.ArchConfig``: ``pretrain.model`` in a preset, or a mapping of
its keys) with transformers' own Qwen2-MoE / Qwen3-MoE classes,
so checkpoints are standard Hugging Face folders that ``AutoModelForCausalLM`` and vLLM load.

Sequence layout used by the RL code (``response_logprobs``): each row is a LEFT-padded prompt of
width P followed by a RIGHT-padded response of width R. Position ids are the cumulative sum of
the attention mask, which is what ``generate`` uses for left-padded batches, so a training
forward sees exactly the positions the rollout saw. The log-prob of response token t comes from
the logits at position P + t - 1, and so does the router decision that produced it: per-token
router quantities are sliced the same way (``response_slice``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from rspo.pretrain_config import ArchConfig, build_arch

META_FILE = "rspo_meta.json"


def set_threads(threads: int = 0) -> int:
    """Pin torch intra-op threads to the cores the job was given (0 -> OMP_NUM_THREADS or 1)."""
    n = threads or int(os.environ.get("OMP_NUM_THREADS", "0") or 0) or 1
    torch.set_num_threads(n)
    os.environ["OMP_NUM_THREADS"] = str(n)
    return n


def resolve_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("model.device: cuda requested but no GPU is available")
    return torch.device(device)


def moe_config(
    arch: ArchConfig | dict[str, Any], vocab_size: int, bos_token_id: int, eos_token_id: int, pad_token_id: int
):
    """transformers config for an architecture (an ``ArchConfig``, or a preset's mapping of one)."""
    arch = build_arch(arch)
    common = dict(
        vocab_size=vocab_size,
        hidden_size=arch.hidden_size,
        intermediate_size=arch.intermediate_size,
        num_hidden_layers=arch.num_layers,
        num_attention_heads=arch.num_heads,
        num_key_value_heads=arch.num_heads if arch.num_kv_heads is None else arch.num_kv_heads,
        max_position_embeddings=arch.max_position_embeddings,
        num_experts=arch.num_experts,
        num_experts_per_tok=arch.top_k,
        moe_intermediate_size=arch.moe_intermediate_size,
        norm_topk_prob=arch.norm_topk_prob,
        router_aux_loss_coef=arch.router_aux_loss_coef,
        output_router_logits=False,
        tie_word_embeddings=arch.tie_word_embeddings,
        rope_theta=arch.rope_theta,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        decoder_sparse_step=1,
        mlp_only_layers=[],
    )
    if arch.head_dim is not None:
        common["head_dim"] = arch.head_dim
    if arch.arch == "qwen2_moe":
        from transformers import Qwen2MoeConfig

        return Qwen2MoeConfig(shared_expert_intermediate_size=arch.shared_expert_intermediate_size, **common)
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(**common)


def build_model(arch: ArchConfig | dict[str, Any], tokenizer, seed: int = 0):
    """Random-init MoE causal LM for ``tokenizer`` (fp32)."""
    from transformers import AutoModelForCausalLM

    cfg = moe_config(arch, len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)
    torch.manual_seed(seed)
    import warnings

    with warnings.catch_warnings():  # a zero-size shared expert (Qwen2-MoE without one) warns at init
        warnings.filterwarnings("ignore", message="Initializing zero-element tensors")
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    return model


def save_checkpoint(model, tokenizer, out_dir: str | Path, meta: dict[str, Any] | None = None) -> Path:
    """Standard HF folder (safetensors + config + tokenizer) written to a temp dir, then renamed."""
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    if tmp.exists():
        import shutil

        shutil.rmtree(tmp)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    (tmp / META_FILE).write_text(json.dumps(meta or {}, indent=2, sort_keys=True))
    if out_dir.exists():
        import shutil

        shutil.rmtree(out_dir)
    tmp.rename(out_dir)
    return out_dir


def read_meta(path: str | Path) -> dict[str, Any]:
    f = Path(path) / META_FILE
    return json.loads(f.read_text()) if f.is_file() else {}


def check_checkpoint(path: str | Path, weights: bool = True) -> bool:
    """Validate a local checkpoint folder (clear errors); False if ``path`` is a hub id. ``weights``:
    whether the folder must hold weights (a tokenizer, or a model built with random weights from its
    config.json, needs none)."""
    from rspo.hub import is_hub_id

    p = Path(path)
    if is_hub_id(path):
        return False
    if not p.is_dir():
        raise FileNotFoundError(f"model checkpoint folder not found: {p}")
    if not (p / "config.json").is_file():
        raise FileNotFoundError(f"model checkpoint {p} has no config.json (incomplete or not a HF checkpoint)")
    if weights and not any(p.glob("*.safetensors")) and not any(p.glob("*.bin")):
        raise FileNotFoundError(f"model checkpoint {p} has no weights (*.safetensors)")
    return True


def load_model(path: str | Path, dtype: str = "float32", device: str = "auto"):
    """Load a checkpoint (local folder, or hub id: its snapshot in the hub cache, rspo.hub) with
    clear errors for missing/corrupt files."""
    from transformers import AutoModelForCausalLM

    from rspo.hub import resolve_model

    path = resolve_model(path)
    check_checkpoint(path)
    try:  # "auto": the checkpoint's own dtype (config.json)
        model = AutoModelForCausalLM.from_pretrained(
            str(path), dtype="auto" if dtype == "auto" else getattr(torch, dtype)
        )
    except (OSError, ValueError, RuntimeError) as e:
        raise RuntimeError(f"could not load model checkpoint {path}: {e}") from e
    return model.to(resolve_device(device))


def load_tokenizer_checked(path: str | Path, expected_fingerprint: str | None = None):
    """Tokenizer of a checkpoint; with a fingerprint, a mismatch (another tokenizer) is an error."""
    from transformers import AutoTokenizer

    from rspo.hub import resolve_model
    from rspo.tokenizer import tokenizer_fingerprint

    path = resolve_model(path)
    check_checkpoint(path, weights=False)
    tok = AutoTokenizer.from_pretrained(str(path))
    if expected_fingerprint:
        fp = tokenizer_fingerprint(tok)
        if fp != expected_fingerprint:
            raise ValueError(
                f"tokenizer of {path} (fingerprint {fp}) differs from the one the data/checkpoint was made "
                f"with ({expected_fingerprint}): the checkpoint was trained with another tokenizer"
            )
    return tok


# ----------------------------------------------------------------------------- log-probs


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions as `generate` assigns them to left-padded rows.  (B, L) -> (B, L)"""
    pos = attention_mask.long().cumsum(-1) - 1
    return pos.clamp(min=0)


def response_slice(full: torch.Tensor, prompt_width: int) -> torch.Tensor:
    """Per-position quantity (B, P+R, ...) -> the positions that predict the response (B, R, ...)."""
    return full[:, prompt_width - 1 : -1]


def response_logprobs(
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    prompt_width: int,
    with_entropy: bool = False,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of the response tokens under softmax(logits / temperature), the distribution the
    rollout sampled from.  (B, P+R, V) -> (B, R) [, entropy (B, R)]"""
    logits = response_slice(logits, prompt_width).float()  # (B, R, V)
    if temperature != 1.0:
        logits = logits / temperature
    targets = input_ids[:, prompt_width:]  # (B, R)
    logp_all = F.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (B, R)
    return logp, (entropy_of(logp_all) if with_entropy else None)


def entropy_of(logp_all: torch.Tensor) -> torch.Tensor:
    """-sum p log p over the last dimension from log-probabilities: the entropy the old pass records
    (``response_logprobs``) and the hf rollout records in its place (rollout.old_values=rollout).
    (..., V) -> (...)"""
    return -(logp_all.exp() * logp_all).sum(-1)


def load_balancing_loss(
    router_logits: list[torch.Tensor], top_k: int, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Switch-Transformer load-balancing loss over all MoE layers, pad tokens excluded.

    Same formula as transformers' ``load_balancing_loss_func`` (E * sum_e f_e * P_e with f_e the
    share of top-k assignments to expert e and P_e the mean router probability, tokens of all
    layers pooled), computed here because that function fails with an attention mask for
    Qwen2-MoE in transformers 5.23. router_logits: one (N, E) tensor per layer; mask: (N,) or (B, T).
    """
    logits = torch.cat([lg.float() for lg in router_logits], dim=0)  # (L*N, E)
    E = logits.shape[-1]
    probs = torch.softmax(logits, dim=-1)
    chosen = torch.nn.functional.one_hot(torch.topk(probs, top_k, dim=-1).indices, E).float()  # (L*N, K, E)
    if mask is None:
        w = torch.ones(logits.shape[0], device=logits.device)
    else:
        w = mask.reshape(-1).float().repeat(len(router_logits))  # (L*N,)
    denom = w.sum().clamp(min=1)
    tokens_per_expert = (chosen * w[:, None, None]).sum(0) / denom  # (K, E)
    prob_per_expert = (probs * w[:, None]).sum(0) / denom  # (E,)
    return (tokens_per_expert * prob_per_expert[None, :]).sum() * E
