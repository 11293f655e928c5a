"""Checks shared by the vLLM tests (tests/test_*vllm*.py) and their torchrun worker
(tests/vllm_dist_worker.py); importing this module needs vLLM.

Tolerance of the log-prob checks: 1e-5 (absolute, natural log, float32). The engine and the
training model compute the same float32 network with different kernels (vLLM's CPU attention and
grouped-GEMM experts vs transformers' SDPA/grouped_mm), so their log-probs differ by float32
rounding accumulated over a few layers: measured up to ~2e-6 before and after syncs. A stale or
mis-laid weight moves them by 1e-3 to 1e-1 (the reload drift the backend fixes was ~1e-2), and
the tests also check that the weights they sync move the log-probs by far more than 1e-5, so the
check has the power to see a sync that did not happen.
"""

from __future__ import annotations

import torch
from tiny_moe import make_tiny_moe

from rspo.config import train_config_from_dict
from rspo.rollout.vllm import VLLMBackend
from rspo.tokenizer import build_tokenizer

TOL = 1e-5
PROMPTS = ["nums 1 2 target 3:", "nums 10 20 30 target 60:", "nums 4 5 target 9:", "nums 7 8 9 target 24:"]
GREEDY_PROMPTS = PROMPTS + ["nums 3 3 target 9:", "nums 12 2 5 target 7:", "nums 6 1 target 5:", "nums 9 9 9 target 1:"]


def engine_logprob_gap(backend: VLLMBackend, model, prompts=PROMPTS, n: int = 2, max_tokens: int = 12) -> float:
    """Largest |log p_engine - log p_model| over the tokens the engine samples (temperature 1)."""
    SP = backend.sampling_params_cls
    enc = backend.tokenizer(prompts)["input_ids"]
    params = [SP(n=n, temperature=1.0, max_tokens=max_tokens, seed=17 + i, logprobs=0) for i in range(len(prompts))]
    worst = 0.0
    count = 0
    for req in backend.engine.generate([{"prompt_token_ids": ids} for ids in enc], params, use_tqdm=False):
        for comp in req.outputs:
            ids = list(req.prompt_token_ids) + list(comp.token_ids)
            P = len(req.prompt_token_ids)
            with torch.no_grad():
                lp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
            for i, t in enumerate(comp.token_ids):
                worst = max(worst, abs(lp[P - 1 + i, t].item() - comp.logprobs[i][t].logprob))
                count += 1
    assert count >= len(prompts) * n  # something was compared
    return worst


def model_logprob_gap(a, b, prompts=PROMPTS) -> float:
    """Largest |log-prob difference| between two HF models over the prompts' next-token distributions."""
    tok = build_tokenizer()
    enc = tok(prompts, return_tensors="pt", padding=True, padding_side="left")
    with torch.no_grad():
        la = torch.log_softmax(a(**enc).logits.float(), -1)
        lb = torch.log_softmax(b(**enc).logits.float(), -1)
    return (la - lb)[enc["attention_mask"].bool()].abs().max().item()


def arch_model(arch: str, tok, seed: int = 0):
    # hidden 128 with 4 heads: head size 32, the smallest the CPU attention kernels serve; 4 experts, top-1
    return make_tiny_moe(arch, num_experts=4, top_k=1, num_layers=2, hidden=128, vocab=len(tok), seed=seed)


def digit_task():
    """Countdown prompts with a dense reward (share of digit characters, as in test_train.py), so a
    random model gets advantages with variance and every step moves the weights."""
    from rspo.tasks import Task, get_task

    base = get_task("countdown")

    def score_batch(completions, records, workers):
        return [(sum(ch.isdigit() for ch in c) / max(1, len(c)), "digits") for c in completions]

    return Task("countdown-digits", base.load, base.prompt, score_batch)


def train_cfg(assets, prompts_per_step: int = 4, ckpt_every: int = 0, **rollout):
    rl = {
        "model": {"path": str(assets / "base"), "threads": 1, "dtype": "float32"},
        "data": {"task": "countdown", "train_path": str(assets / "data" / "train.jsonl"), "val_paths": {}},
        "rollout": {"backend": "vllm", "group_size": 4, "max_new_tokens": 8, "temperature": 1.0, **rollout},
        "algorithm": {"algo": "gmpo", "router_shift": True},
        "optim": {"lr": 3e-2},
        "schedule": {
            "total_steps": 3,
            "prompts_per_step": prompts_per_step,
            "mini_batch_prompts": 2,
            "val_every": 0,
            "ckpt_every": ckpt_every,
        },
    }
    return train_config_from_dict(rl, seed=0, run_name="vllm-sync")
