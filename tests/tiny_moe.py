"""Tiny random MoE causal LMs of every supported architecture, for CPU tests.

`make_tiny_moe(arch)` builds a randomly initialised fp32 model in eval mode in well under a
second. The four architectures differ where it matters for routing (see rspo/router.py):

- qwen2_moe: router + shared expert gated by a sigmoid `shared_expert_gate`; renormalises the
  top-K probabilities only if `norm_topk_prob`; dense layers possible (`mlp_only_layers`,
  `decoder_sparse_step`).
- qwen3_moe: like qwen2_moe without the shared expert.
- mixtral: ALWAYS renormalises the top-K probabilities (`norm_topk_prob` does not exist in its
  config and is ignored here); routing weights stay fp32.
- olmoe: like qwen3_moe, every layer sparse.

Extra keyword arguments are passed to the config (e.g. `mlp_only_layers=[0]` for a
Qwen2/3-MoE with a dense first layer, `initializer_range=0.5` for sharper routing).
"""

from __future__ import annotations

import torch

ARCHS: tuple[str, ...] = ("qwen2_moe", "qwen3_moe", "mixtral", "olmoe")


def _config(
    arch: str,
    *,
    num_experts: int,
    top_k: int,
    num_layers: int,
    hidden: int,
    vocab: int,
    norm_topk_prob: bool,
    overrides: dict,
):
    common = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        num_experts_per_tok=top_k,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    if arch == "qwen2_moe":
        from transformers import Qwen2MoeConfig

        cfg = dict(
            common,
            intermediate_size=2 * hidden,
            moe_intermediate_size=hidden,
            shared_expert_intermediate_size=hidden,
            num_experts=num_experts,
            norm_topk_prob=norm_topk_prob,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        )
        cfg.update(overrides)
        return Qwen2MoeConfig(**cfg)
    if arch == "qwen3_moe":
        from transformers import Qwen3MoeConfig

        cfg = dict(
            common,
            intermediate_size=2 * hidden,
            moe_intermediate_size=hidden,
            num_experts=num_experts,
            norm_topk_prob=norm_topk_prob,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        )
        cfg.update(overrides)
        return Qwen3MoeConfig(**cfg)
    if arch == "mixtral":
        from transformers import MixtralConfig

        # Mixtral has no norm_topk_prob: its router always renormalises the top-K weights.
        cfg = dict(common, intermediate_size=hidden, num_local_experts=num_experts, router_jitter_noise=0.0)
        cfg.update(overrides)
        return MixtralConfig(**cfg)
    if arch == "olmoe":
        from transformers import OlmoeConfig

        cfg = dict(common, intermediate_size=hidden, num_experts=num_experts, norm_topk_prob=norm_topk_prob)
        cfg.update(overrides)
        return OlmoeConfig(**cfg)
    raise ValueError(f"unknown MoE architecture {arch!r}; expected one of {ARCHS}")


def make_tiny_moe(
    arch: str,
    *,
    num_experts: int = 4,
    top_k: int = 2,
    num_layers: int = 2,
    hidden: int = 32,
    vocab: int = 64,
    norm_topk_prob: bool = False,
    seed: int = 0,
    **overrides,
):
    """A tiny random fp32 `*ForCausalLM` of architecture `arch` (one of ARCHS), in eval mode.

    The weights depend only on (arch, sizes, seed). `hidden` must be a multiple of 8 (4
    attention heads of even size for the rotary embedding, 2 key/value heads).
    """
    if arch not in ARCHS:
        raise ValueError(f"unknown MoE architecture {arch!r}; expected one of {ARCHS}")
    if hidden % 8 != 0:
        raise ValueError(f"hidden={hidden} must be a multiple of 8 (4 heads of even size)")
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k={top_k} must be in [1, num_experts={num_experts}]")
    from transformers import AutoModelForCausalLM

    config = _config(
        arch,
        num_experts=num_experts,
        top_k=top_k,
        num_layers=num_layers,
        hidden=hidden,
        vocab=vocab,
        norm_topk_prob=norm_topk_prob,
        overrides=overrides,
    )
    with torch.random.fork_rng(devices=[]):  # do not disturb the caller's RNG
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.eval()


# A tiny Countdown RL setting on disk: 64 training problems and a random-init Qwen2-MoE base
# checkpoint with the project tokenizer (tests of the trainer and of data-parallel training).
TRAIN_ARCH = dict(
    arch="qwen2_moe",
    hidden_size=32,
    num_layers=2,
    num_heads=2,
    num_kv_heads=2,
    intermediate_size=64,
    moe_intermediate_size=32,
    num_experts=4,
    top_k=1,
    norm_topk_prob=False,
    shared_expert_intermediate_size=0,
    max_position_embeddings=96,
)


def make_train_assets(root, model=None):
    """root/data/{train,val,val_target}.jsonl and root/base (HF checkpoint + rspo_meta.json): the
    TRAIN_ARCH model, or ``model`` (a model for the project tokenizer, e.g. from make_tiny_moe)."""
    from rspo.data.countdown import CountdownConfig, generate
    from rspo.models import build_model, save_checkpoint
    from rspo.tokenizer import build_tokenizer, tokenizer_fingerprint

    generate(
        CountdownConfig(
            num_numbers=3,
            max_number=20,
            min_target=10,
            max_target=40,
            train_size=64,
            val_size=8,
            val_target_size=8,
            seed=1,
        ),
        root / "data",
    )
    tok = build_tokenizer()
    save_checkpoint(
        build_model(TRAIN_ARCH, tok, seed=0) if model is None else model,
        tok,
        root / "base",
        meta={"tokenizer_fingerprint": tokenizer_fingerprint(tok)},
    )
    return root


def train_args(assets, out, preset, *sets, run=None, threads=None):
    """`rspo train` arguments for the assets of make_train_assets: the preset, base model, train
    and val data, output folder, then one `--set` per override in ``sets``."""
    args = ["--preset", str(preset)]
    if run is not None:
        args += ["--run-name", run]
    args += [
        "--base-model",
        str(assets / "base"),
        "--train-data",
        str(assets / "data" / "train.jsonl"),
        "--val",
        f"val={assets / 'data' / 'val.jsonl'}",
        "--out",
        str(out),
    ]
    if threads is not None:
        args += ["--threads", str(threads)]
    for s in sets:
        args += ["--set", s]
    return args


def make_chat_checkpoint(out, num_heads: int = 2, vocab_size: int = 400, seed: int = 0):
    """A tiny random Qwen2-MoE with the smoke preset's math/code tokenizer (byte-level BPE that
    carries Qwen3's chat template and thinking switch), saved as a checkpoint folder at ``out``.
    ``num_heads=1`` gives head size 32, which vLLM's CPU attention serves."""
    from pathlib import Path

    from rspo.data import math as m
    from rspo.data.text_tokenizer import train_text_tokenizer
    from rspo.models import build_model, save_checkpoint
    from rspo.prompts import math_prompt
    from rspo.tokenizer import tokenizer_fingerprint

    out = Path(out)
    texts = [
        math_prompt(r["prompt"], "plain") + f" \\boxed{{{r['answer']}}}"
        for r in m.load_math_train("fallback", limit=200)
    ]
    texts += ["```python\ndef f(x):\n    return x + 1\n```\n", "Please provide a self-contained Python script"] * 20
    tok = train_text_tokenizer(texts, vocab_size, out.with_name(out.name + ".tok"))
    arch = dict(TRAIN_ARCH, num_heads=num_heads, num_kv_heads=num_heads, max_position_embeddings=1024)
    save_checkpoint(
        build_model(arch, tok, seed=seed), tok, out, meta={"tokenizer_fingerprint": tokenizer_fingerprint(tok)}
    )
    return out
