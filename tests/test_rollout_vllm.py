"""The vllm rollout backend against a real vLLM engine (vLLM's CPU build, the venv `make test`
creates: .venv-vllm). Skipped where vLLM is not installed (the main venv).

Tolerance of the log-prob checks: 1e-5 (absolute, natural log, float32). The engine and the
training model compute the same float32 network with different kernels (vLLM's CPU attention and
grouped-GEMM experts vs transformers' SDPA/grouped_mm), so their log-probs differ by float32
rounding accumulated over a few layers: measured up to ~1e-6 before and after syncs. A stale or
mis-laid weight moves them by 1e-3 to 1e-1 (the reload drift this backend fixes was ~1e-2), and
each test also checks that the weights it syncs move the log-probs by far more than 1e-5, so the
check has the power to see a sync that did not happen.
"""

from __future__ import annotations

import copy
import gc

import pytest
import torch

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm", reason="needs vLLM (its CPU build in .venv-vllm: `make test` runs these tests there)")

from tiny_moe import ARCHS, make_tiny_moe, make_train_assets  # noqa: E402

from rspo.config import train_config_from_dict  # noqa: E402
from rspo.rollout.hf import HFBackend  # noqa: E402
from rspo.rollout.vllm import VLLMBackend  # noqa: E402
from rspo.tokenizer import build_tokenizer  # noqa: E402

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


def train_cfg(assets, **rollout):
    rl = {
        "model": {"path": str(assets / "base"), "threads": 1, "dtype": "float32"},
        "data": {"task": "countdown", "train_path": str(assets / "data" / "train.jsonl"), "val_paths": {}},
        "rollout": {"backend": "vllm", "group_size": 4, "max_new_tokens": 8, "temperature": 1.0, **rollout},
        "algorithm": {"algo": "gmpo", "router_shift": True},
        "optim": {"lr": 3e-2},
        "schedule": {"total_steps": 3, "prompts_per_step": 4, "mini_batch_prompts": 2, "val_every": 0},
    }
    return train_config_from_dict(rl, seed=0, run_name="vllm-sync")


@pytest.mark.parametrize("arch", ARCHS)
def test_engine_samples_from_the_trained_policy_after_every_sync(arch, tmp_path):
    """Before any update and after each of three real Trainer steps (rollout -> old pass -> 4
    mini-batch updates -> sync), the engine's log-probs of its own sampled tokens equal the
    training model's; the weights moved between syncs by far more than the tolerance."""
    from rspo.train.trainer import Trainer

    tok = build_tokenizer()
    assets = make_train_assets(tmp_path / "assets", model=arch_model(arch, tok))
    trainer = Trainer(train_cfg(assets), tmp_path / "run", quiet=True, task=digit_task())
    try:
        backend = trainer.backend
        assert isinstance(backend, VLLMBackend) and backend.on_cpu
        gaps = [engine_logprob_gap(backend, trainer.model)]
        previous = copy.deepcopy(trainer.model)
        for _ in range(3):
            metrics = trainer.train_step()
            trainer.step += 1
            assert metrics["perf/sync_s"] >= backend.last_sync_s > 0
            moved = model_logprob_gap(previous, trainer.model)
            assert moved > 100 * TOL, f"{arch}: the step did not move the policy ({moved:.2e})"
            gaps.append(engine_logprob_gap(backend, trainer.model))
            previous = copy.deepcopy(trainer.model)
        print(f"{arch}: max |dlogp| before, after steps 1-3: {[f'{g:.1e}' for g in gaps]}")
        assert max(gaps) < TOL, f"{arch}: engine vs training model log-probs {gaps}"
    finally:
        del trainer
        gc.collect()


def case_mix(batch, tok, max_tokens: int = 12) -> bool:
    """Rows cut at max_tokens, rows ended by EOS and rows ended by another special token."""
    lengths = batch.response_mask.sum(1).long()
    last = batch.response_ids[torch.arange(len(lengths)), lengths - 1]
    special = torch.isin(last, torch.tensor(tok.all_special_ids))
    return bool(
        ((lengths == max_tokens) & ~special).any()
        and (last == tok.eos_token_id).any()
        and (special & (last != tok.eos_token_id)).any()
    )


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """One engine on a tiny Qwen2-MoE, and the same model in transformers."""
    from rspo.models import save_checkpoint

    tok = build_tokenizer()
    model = arch_model("qwen2_moe", tok, seed=3)
    with torch.no_grad():  # special tokens likely enough that some greedy rows stop on one, others run out:
        model.lm_head.weight[tok.unk_token_id] *= 2.0  # <unk> wins at a few positions
        # EOS takes over from one of the tokens greedy decoding emits: the first (by frequency) that
        # gives the case mix of test_greedy_batch_equals_the_hf_backend_field_by_field
        rows = HFBackend(model, tok).generate(GREEDY_PROMPTS, 1, temperature=0.0, max_new_tokens=12).token_rows()[1]
        emitted = torch.tensor([t for r in rows for t in r if t not in tok.all_special_ids])
        for token in torch.bincount(emitted).argsort(descending=True)[:8].tolist():
            model.lm_head.weight[tok.eos_token_id] = 1.1 * model.lm_head.weight[token]
            if case_mix(HFBackend(model, tok).generate(GREEDY_PROMPTS, 1, temperature=0.0, max_new_tokens=12), tok):
                break
        else:
            pytest.fail("no EOS row gives greedy rows that stop on EOS, on another special token and at max_tokens")
    path = save_checkpoint(model, tok, tmp_path_factory.mktemp("served") / "m")
    backend = VLLMBackend(model, tok, model_path=str(path), dtype="float32")
    yield backend, model, tok
    del backend
    gc.collect()


def test_rows_do_not_depend_on_how_prompts_are_split(served):
    """A prompt's n responses depend only on (seed, its global row): one call equals two calls with
    row offsets (two ranks), and a different seed gives other responses."""
    backend, _, _ = served
    kw = dict(temperature=1.0, max_new_tokens=10, seed=11)
    whole = backend.generate(PROMPTS, 3, **kw)
    first = backend.generate(PROMPTS[:1], 3, row_offset=0, **kw)
    rest = backend.generate(PROMPTS[1:], 3, row_offset=3, **kw)
    reordered = backend.generate(PROMPTS[1:] + PROMPTS[:1], 3, **kw, row_offset=3)  # prompt 0 now last
    p_all, r_all = whole.token_rows()
    p1, r1 = first.token_rows()
    p2, r2 = rest.token_rows()
    assert p_all == p1 + p2 and r_all == r1 + r2
    assert whole.responses == first.responses + rest.responses
    assert len(set(map(tuple, r_all))) > len(PROMPTS)  # genuinely sampled
    _, r_re = reordered.token_rows()
    assert r_re[:9] == r2  # the other prompts keep their rows whatever comes after them
    other = backend.generate(PROMPTS, 3, temperature=1.0, max_new_tokens=10, seed=12)
    assert other.token_rows()[1] != r_all


def test_greedy_batch_equals_the_hf_backend_field_by_field(served):
    """Greedy decoding samples the same token ids in both backends (same fp32 model), so the two
    RolloutBatches must agree field by field: left-padded prompts, responses cut at max_tokens or
    right after their first special token (EOS or another, e.g. <unk>), padding, masks, texts."""
    backend, model, tok = served
    prompts = GREEDY_PROMPTS
    kw = dict(temperature=0.0, max_new_tokens=12, seed=0)
    v = backend.generate(prompts, 1, **kw)
    h = HFBackend(model, tok).generate(prompts, 1, **kw)
    lengths = v.response_mask.sum(1)
    last = v.response_ids[torch.arange(len(prompts)), (lengths - 1).long()]
    stopped = torch.isin(last, torch.tensor(backend.stop_ids))
    assert case_mix(v, tok)  # rows cut by max_tokens, rows ended by EOS, and by another special token
    assert v.prompt_width == h.prompt_width
    for field in ("input_ids", "attention_mask", "response_mask"):
        assert torch.equal(getattr(v, field), getattr(h, field)), field
    assert v.responses == h.responses
    # after a stop token: padding, masked out
    for i in torch.nonzero(stopped).flatten().tolist():
        L = int(lengths[i])
        assert torch.all(v.response_ids[i, L:] == tok.pad_token_id) and v.response_mask[i, L:].sum() == 0


def test_refused_head_size_is_a_clear_error(tmp_path):
    from rspo.models import save_checkpoint

    tok = build_tokenizer()
    model = make_tiny_moe("qwen3_moe", num_experts=4, top_k=1, num_layers=1, hidden=64, vocab=len(tok))
    path = save_checkpoint(model, tok, tmp_path / "m")  # head size 16
    with pytest.raises(ValueError, match="head size 16"):
        VLLMBackend(model, tok, model_path=str(path), dtype="float32")


def test_max_tokens_and_bad_input(served):
    backend, _, _ = served
    b = backend.generate(PROMPTS[:2], 2, temperature=1.0, max_new_tokens=3, seed=1)
    assert b.response_mask.shape[1] <= 3 and b.input_ids.shape == (4, b.prompt_width + b.response_mask.shape[1])
    with pytest.raises(ValueError, match="max_new_tokens"):
        backend.generate(PROMPTS[:1], 1, temperature=1.0, max_new_tokens=0)
    with pytest.raises(ValueError, match="prompts: empty"):
        backend.generate([], 1, temperature=1.0)


def test_sync_of_the_same_weights_keeps_the_engine_exact(served):
    """The drift that vLLM's plain in-place reload shows on the CPU build (a sync of the very same
    weights moved log-probs by ~1e-2) is gone; and a reload without the CPU fix-up does drift, so
    the fix is what makes the difference (if a vLLM release fixes the reload itself, this last
    assertion fails and the fix-up can go)."""
    backend, model, _ = served
    assert engine_logprob_gap(backend, model) < TOL
    backend.sync_weights(model)
    assert engine_logprob_gap(backend, model) < TOL
    backend.on_cpu = False  # the GPU path: plain reload_weights
    try:
        backend.sync_weights(model)
        drift = engine_logprob_gap(backend, model)
    finally:
        backend.on_cpu = True
    backend.sync_weights(model)
    assert engine_logprob_gap(backend, model) < TOL
    assert drift > 100 * TOL, drift
