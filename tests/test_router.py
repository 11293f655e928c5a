"""Tests of rspo/router.py on tiny random MoE models of every supported architecture (CPU)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from router_reference import forward_with_router_cache, shift_ratio
from tiny_moe import ARCHS, make_tiny_moe
from torch import nn

from rspo.router import (
    SUPPORTED_MODELS,
    OldRouterCache,
    RoutingMode,
    capture_router_logits,
    moe_gates,
    route_from_logits,
    router_shift_ratio,
    router_spec,
    routing_control,
)

B, T, VOCAB = 3, 7, 64


def _batch(seed: int = 0, b: int = B, t: int = T) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (b, t), generator=g)  # (B, T)


def _lm_loss(out, ids: torch.Tensor) -> torch.Tensor:
    logits = out.logits[:, :-1]  # (B, T-1, V)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def _perturb_routers(model: nn.Module, scale: float = 1.0, seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for gate in moe_gates(model):
            gate.weight.add_(scale * torch.randn(gate.weight.shape, generator=g))


def _hook_counts(model: nn.Module) -> list[tuple[int, int]]:
    return [(len(g._forward_hooks), len(g._forward_pre_hooks)) for g in moe_gates(model)]


# ------------------------------------------------------------------------------------------
# Discovery
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_moe_gates_and_spec(arch):
    model = make_tiny_moe(arch, num_experts=4, top_k=2, num_layers=3, norm_topk_prob=False)
    gates = moe_gates(model)
    assert gates == [layer.mlp.gate for layer in model.model.layers]
    spec = router_spec(model)
    assert (spec.arch, spec.num_experts, spec.top_k, spec.moe_layers) == (arch, 4, 2, (0, 1, 2))
    assert spec.num_moe_layers == 3
    # Mixtral always renormalises the top-K probabilities; the others follow norm_topk_prob
    assert spec.norm_topk_prob is (arch == "mixtral")
    if arch != "mixtral":
        assert router_spec(make_tiny_moe(arch, norm_topk_prob=True)).norm_topk_prob is True


@pytest.mark.parametrize("arch", ["qwen2_moe", "qwen3_moe"])
def test_dense_layers_are_skipped(arch):
    model = make_tiny_moe(arch, num_layers=4, mlp_only_layers=[0])
    assert router_spec(model).moe_layers == (1, 2, 3)
    assert moe_gates(model) == [model.model.layers[i].mlp.gate for i in (1, 2, 3)]
    model = make_tiny_moe(arch, num_layers=4, decoder_sparse_step=2)
    assert router_spec(model).moe_layers == (1, 3)
    with capture_router_logits(model) as cap:
        model(_batch())
    assert len(cap.logits) == 2


def test_unsupported_models_raise_listing_supported():
    from transformers import LlamaConfig, LlamaForCausalLM

    llama = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=32,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
        )
    )
    for bad in (llama, nn.Linear(3, 3), object()):
        with pytest.raises(ValueError) as err:
            moe_gates(bad)
        msg = str(err.value)
        assert type(bad).__name__ in msg
        for name in SUPPORTED_MODELS:
            assert name in msg
    assert set(SUPPORTED_MODELS) == {
        "Qwen2MoeForCausalLM",
        "Qwen3MoeForCausalLM",
        "MixtralForCausalLM",
        "OlmoeForCausalLM",
    }
    for fn in (
        router_spec,
        lambda m: capture_router_logits(m).__enter__(),
        lambda m: routing_control(m, "freeze").__enter__(),
    ):
        with pytest.raises(ValueError, match="LlamaForCausalLM"):
            fn(llama)


# ------------------------------------------------------------------------------------------
# Capture
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_capture_equals_gate_output_and_linear(arch):
    model = make_tiny_moe(arch)
    gates = moe_gates(model)
    seen_in, seen_out = [], []
    handles = [g.register_forward_pre_hook(lambda m, a: seen_in.append(a[0])) for g in gates]
    handles += [g.register_forward_hook(lambda m, a, o: seen_out.append(o)) for g in gates]
    ids = _batch()
    try:
        with capture_router_logits(model) as cap, capture_router_logits(model, raw=True) as raw:
            out = model(ids, output_router_logits=True)
    finally:
        for h in handles:
            h.remove()
    assert len(cap.logits) == len(gates) == len(seen_out)
    for l, gate in enumerate(gates):
        assert cap.logits[l].shape == (B * T, 4)
        assert torch.equal(cap.logits[l], seen_out[l][0])  # the gate's own output
        assert torch.equal(cap.indices[l], seen_out[l][2])
        assert torch.equal(cap.logits[l], F.linear(seen_in[l].reshape(-1, gate.weight.shape[1]), gate.weight))
        assert torch.equal(raw.logits[l], cap.logits[l])
        assert torch.equal(cap.logits[l], out.router_logits[l])  # what transformers reports
        assert cap.logits[l].requires_grad  # graph kept for the no-stop-gradient ablation


def test_capture_concatenates_forwards_and_detach():
    model = make_tiny_moe("qwen3_moe")
    a, b = _batch(0), _batch(1, b=2)
    with capture_router_logits(model, detach=True) as cap:
        model(a)
        model(b)
    with capture_router_logits(model) as one:
        model(b)
    assert cap.num_calls == 2
    assert cap.logits[0].shape == ((B + 2) * T, 4)
    assert not cap.logits[0].requires_grad
    assert torch.allclose(cap.logits[1][B * T :], one.logits[1].detach(), atol=1e-6, rtol=0)
    with capture_router_logits(model) as empty:
        pass
    with pytest.raises(RuntimeError, match="no forward"):
        empty.logits  # noqa: B018 (reading the attribute is what raises)


@pytest.mark.parametrize("arch", ARCHS)
def test_hooks_removed_on_exit_and_on_exception(arch):
    model = make_tiny_moe(arch)
    ids = _batch()
    _, cache = forward_with_router_cache(model, keep_logits=True, input_ids=ids)
    before = _hook_counts(model)
    flags = [p.requires_grad for p in model.parameters()]

    contexts = [lambda: capture_router_logits(model), lambda: capture_router_logits(model, raw=True)]
    contexts += [lambda m=m: routing_control(model, m, cache) for m in RoutingMode]
    for make in contexts:
        with make():
            model(ids)
        assert _hook_counts(model) == before
        with pytest.raises(KeyError):
            with make():
                raise KeyError("boom")
        assert _hook_counts(model) == before
        assert [p.requires_grad for p in model.parameters()] == flags
    # the hooks were really installed inside the blocks
    with routing_control(model, "index_replay", cache):
        inside = _hook_counts(model)
    assert all(f == b + 1 for (f, _), (b, _) in zip(inside, before))
    # an error raised by a hook inside the forward (wrong rows) also removes the handles
    with pytest.raises(ValueError, match="cache holds"):
        with routing_control(model, "index_replay", cache[:2]):
            model(ids)
    assert _hook_counts(model) == before


# ------------------------------------------------------------------------------------------
# Router-shift ratio
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("logp_dtype", [torch.float16, torch.bfloat16])
def test_gamma_is_exactly_one_on_policy(arch, logp_dtype):
    model = make_tiny_moe(arch, initializer_range=0.3)  # sharper routing: |log r| spans several binades
    ids = _batch()
    with capture_router_logits(model, detach=True) as old:
        model(ids)
    _, cache = forward_with_router_cache(model, logp_dtype=logp_dtype, input_ids=ids)
    with capture_router_logits(model) as new:
        model(ids)
    gamma = router_shift_ratio(cache, new.logits)
    assert gamma.shape == (B, T)
    assert torch.equal(gamma, torch.ones(B, T))  # exactly 1 thanks to the straight-through rounding
    assert torch.equal(shift_ratio(old.logits, new.logits, router_spec(model).top_k), torch.ones(B * T))
    # without the rounding trick, the fp16/bf16 cache alone makes gamma != 1 on-policy
    assert (router_shift_ratio(cache, new.logits, straight_through=False) < 1).any()


@pytest.mark.parametrize("arch", ARCHS)
def test_gamma_below_one_after_router_perturbation(arch):
    model = make_tiny_moe(arch)
    ids = _batch()
    k = router_spec(model).top_k
    with capture_router_logits(model, detach=True) as old:
        model(ids)
    _, cache = forward_with_router_cache(model, input_ids=ids)
    _perturb_routers(model, scale=0.3)
    with capture_router_logits(model) as new:
        model(ids)
    gamma = router_shift_ratio(cache, new.logits)
    assert ((gamma > 0) & (gamma < 1)).all()
    ref = shift_ratio(old.logits, new.logits, k).view(B, T)
    assert ((ref > 0) & (ref < 1)).all()
    assert torch.allclose(gamma, ref, atol=4e-3, rtol=0)  # fp16 tolerance of the cache path
    # differentiable w.r.t. the router (the no-stop-gradient ablation needs it)
    gamma.sum().backward()
    assert all(g.weight.grad is not None and g.weight.grad.abs().sum() > 0 for g in moe_gates(model))


def _slow_gamma(old_logits, new_logits, top_k):
    """The paper's Eqs. (drift_layer), (drift_token), (router_shift_ratio) with Python loops."""
    L, N, E = len(old_logits), old_logits[0].shape[0], old_logits[0].shape[1]
    out = []
    for i in range(N):  # tokens
        delta = 0.0
        for l in range(L):  # MoE layers
            zo = [float(v) for v in old_logits[l][i]]
            zn = [float(v) for v in new_logits[l][i]]
            log_ro = [z - math.log(sum(math.exp(y) for y in zo)) for z in zo]  # log softmax, ALL experts
            log_rn = [z - math.log(sum(math.exp(y) for y in zn)) for z in zn]
            e_old = sorted(range(E), key=lambda e: -log_ro[e])[:top_k]  # old top-K experts
            d = sum(abs(log_rn[e] - log_ro[e]) for e in e_old) / top_k  # Eq. (drift_layer)
            delta += d / L  # Eq. (drift_token)
        out.append(math.exp(-delta))  # Eq. (router_shift_ratio)
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_reference_loop_vs_vectorised_and_cache(top_k):
    g = torch.Generator().manual_seed(0)
    L, b, t, E = 3, 2, 5, 6
    old = [2.0 * torch.randn(b * t, E, generator=g) for _ in range(L)]
    new = [o + 0.5 * torch.randn(b * t, E, generator=g) for o in old]
    slow = _slow_gamma(old, new, top_k)  # (N,)
    fast = shift_ratio(old, new, top_k)  # (N,)
    assert torch.allclose(fast.double(), slow, atol=1e-6, rtol=0)
    assert (slow < 1).all()
    for dt, tol in ((torch.float16, 4e-3), (torch.bfloat16, 4e-2), (torch.float32, 1e-6)):
        cache = OldRouterCache.from_logits(old, top_k, (b, t), logp_dtype=dt)
        via_cache = router_shift_ratio(cache, new)  # (b, t)
        assert via_cache.shape == (b, t)
        assert torch.allclose(via_cache.double().flatten(), slow, atol=tol, rtol=0)
        # (B, T, E) logits are accepted too
        assert torch.equal(router_shift_ratio(cache, [n.view(b, t, E) for n in new]), via_cache)


def test_router_shift_rows_and_straight_through_gradient():
    g = torch.Generator().manual_seed(3)
    L, b, t, E, K = 2, 4, 3, 5, 2
    old = [torch.randn(b * t, E, generator=g) for _ in range(L)]
    new = [(o + 0.3 * torch.randn(b * t, E, generator=g)).requires_grad_() for o in old]
    cache = OldRouterCache.from_logits(old, K, (b, t))
    full = router_shift_ratio(cache, new)  # (b, t)
    rows = torch.tensor([3, 1])
    sub_logits = [n.view(b, t, E)[rows] for n in new]
    assert torch.equal(router_shift_ratio(cache[rows], sub_logits), full[rows])
    # straight-through: gradient of the rounded value ~= gradient of the exact fp32 formula
    grads_st = torch.autograd.grad(full.sum(), new)
    grads_ref = torch.autograd.grad(shift_ratio(old, new, K).sum(), new)
    for a, r in zip(grads_st, grads_ref):
        assert a.abs().sum() > 0
        assert torch.allclose(a, r, atol=5e-3, rtol=5e-3)


def test_router_shift_input_errors():
    old = [torch.randn(6, 4) for _ in range(2)]
    cache = OldRouterCache.from_logits(old, 2, (2, 3))
    with pytest.raises(ValueError, match="layers"):
        router_shift_ratio(cache, old[:1])
    with pytest.raises(ValueError, match="B\\*T"):
        router_shift_ratio(cache, [torch.randn(5, 4)] * 2)
    with pytest.raises(ValueError, match="top_k"):
        shift_ratio(old, old, 5)
    with pytest.raises(ValueError, match="layers"):
        shift_ratio(old, old[:1], 2)
    with pytest.raises(ValueError, match="B\\*T"):
        OldRouterCache.from_logits(old, 2, (2, 2))


# ------------------------------------------------------------------------------------------
# Cache layout, dtypes, memory
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "E, idx_dtype", [(4, torch.uint8), (256, torch.uint8), (257, torch.int16), (1000, torch.int16)]
)
def test_cache_dtypes_and_bytes(E, idx_dtype):
    g = torch.Generator().manual_seed(0)
    L, b, t, K = 2, 3, 4, 2
    logits = [torch.randn(b * t, E, generator=g) for _ in range(L)]
    cache = OldRouterCache.from_logits(logits, K, (b, t))
    assert cache.indices.dtype == idx_dtype and cache.logp.dtype == torch.float16
    assert cache.indices.shape == cache.logp.shape == (L, b, t, K)
    assert cache.bytes_per_entry == (3.0 if E <= 256 else 4.0)
    assert cache.nbytes == L * b * t * K * cache.bytes_per_entry
    # the cached experts and log-probs are the fp32 top-K and log_softmax over all experts
    for l in range(L):
        lp = F.log_softmax(logits[l], dim=-1)
        top = torch.topk(lp, K, dim=-1)
        assert torch.equal(cache.indices[l].reshape(-1, K).long(), top.indices)
        assert torch.equal(cache.logp[l].reshape(-1, K), top.values.half())
    full = OldRouterCache.from_logits(logits, K, (b, t), keep_logits=True, logp_dtype=torch.bfloat16)
    assert full.logp.dtype == torch.bfloat16
    assert torch.equal(full.logits, torch.stack(logits).view(L, b, t, E))
    assert full.nbytes == cache.nbytes + L * b * t * E * 4


def test_more_than_256_experts_end_to_end():
    model = make_tiny_moe("qwen3_moe", num_experts=300, top_k=3, num_layers=1, hidden=16)
    ids = _batch()
    _, cache = forward_with_router_cache(model, input_ids=ids)
    assert cache.indices.dtype == torch.int16 and int(cache.indices.max()) >= 0
    assert cache.bytes_per_entry == 4.0
    _perturb_routers(model)
    with routing_control(model, "index_replay", cache), capture_router_logits(model) as cap:
        model(ids)
    assert torch.equal(cap.indices[0], cache.indices[0].reshape(-1, 3).long())
    gamma = router_shift_ratio(cache, cap.logits)
    assert ((gamma > 0) & (gamma < 1)).all()


def test_cache_selection_move_and_cat():
    g = torch.Generator().manual_seed(1)
    logits = [torch.randn(4 * 5, 6, generator=g) for _ in range(2)]
    cache = OldRouterCache.from_logits(logits, 2, (4, 5), keep_logits=True)
    rows = torch.tensor([2, 0])
    sub = cache[rows]
    assert sub.batch_shape == (2, 5) and sub.num_layers == 2 and sub.top_k == 2
    assert torch.equal(sub.indices, cache.indices[:, rows]) and torch.equal(sub.logits, cache.logits[:, rows])
    assert cache[1:3].batch_shape == (2, 5)
    assert torch.equal(cache[3].logp, cache.logp[:, 3:4])
    assert torch.equal(cache[[True, False, True, False]].indices, cache.indices[:, [0, 2]])
    assert torch.equal(cache[rows, 1:4].logp, cache.logp[:, rows][:, :, 1:4])
    moved = cache.to("cpu")
    assert moved.device.type == "cpu" and torch.equal(moved.logp, cache.logp)
    joined = OldRouterCache.cat([cache[:1], cache[1:]])
    assert torch.equal(joined.indices, cache.indices) and torch.equal(joined.logits, cache.logits)
    with pytest.raises(ValueError, match="common length"):
        OldRouterCache.cat([cache[0, 0:3], cache[1]])  # T = 3 and T = 5
    with pytest.raises(ValueError, match="dtype"):
        OldRouterCache(indices=cache.indices.long(), logp=cache.logp, num_experts=6)
    with pytest.raises(ValueError, match="cache\\[rows, cols\\]"):
        cache[0, 1, 2]


# ------------------------------------------------------------------------------------------
# Routing control
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("norm", [False, True])
def test_index_replay_forces_old_experts_with_current_weights(arch, norm):
    if arch == "mixtral" and norm:
        pytest.skip("Mixtral has no norm_topk_prob (always renormalises)")
    # top_k=2 and (for Qwen/OLMoE) norm_topk_prob=False: the router gets a gradient from the LM
    # loss. With top-1 and renormalisation (norm_topk_prob=True, or Mixtral always) the single
    # routing weight is exactly 1 and the router gets no gradient (notes/cpu_facts.md).
    model = make_tiny_moe(arch, top_k=2, norm_topk_prob=norm)
    spec = router_spec(model)
    ids = _batch()
    _, cache = forward_with_router_cache(model, input_ids=ids)
    _perturb_routers(model, scale=1.0)
    with torch.no_grad(), capture_router_logits(model) as free:
        model(ids)
    moved = [
        not torch.equal(free.indices[l], cache.indices[l].reshape(-1, 2).long()) for l in range(spec.num_moe_layers)
    ]
    assert any(moved), "perturbation too small to change the routing; the test would be vacuous"

    used, inputs = [], []
    handles = [g.register_forward_hook(lambda m, a, o: used.append(o)) for g in moe_gates(model)]
    handles += [g.register_forward_pre_hook(lambda m, a: inputs.append(a[0])) for g in moe_gates(model)]
    try:
        with routing_control(model, RoutingMode.INDEX_REPLAY, cache):
            out = model(ids, output_router_logits=True)
            _lm_loss(out, ids).backward()
    finally:
        for h in handles:
            h.remove()
    for l, (logits, scores, idx) in enumerate(used):
        assert torch.equal(idx, cache.indices[l].reshape(-1, 2).long())  # old experts
        gate = moe_gates(model)[l]
        assert torch.equal(logits, F.linear(inputs[l], gate.weight))  # the current router's logits
        if l == 0:  # same input as without replay (deeper layers see the replayed routing upstream)
            assert torch.equal(logits, free.logits[0])
        assert torch.equal(out.router_logits[l], logits)
        p = torch.softmax(logits.detach().double(), dim=-1).gather(-1, idx)  # current probs on old experts
        if spec.norm_topk_prob:
            p = p / p.sum(-1, keepdim=True)
        assert torch.allclose(scores.double(), p, atol=1e-6, rtol=0)
        # Qwen/OLMoE cast the scores back to the logits dtype, Mixtral keeps fp32 (both fp32 here)
        assert scores.dtype == torch.float32
    for gate in moe_gates(model):
        assert gate.weight.grad is not None and gate.weight.grad.abs().sum() > 0


def test_index_replay_on_a_mini_batch():
    model = make_tiny_moe("olmoe")
    ids = _batch(b=4)
    _, cache = forward_with_router_cache(model, input_ids=ids)
    _perturb_routers(model)
    rows = torch.tensor([3, 0])
    with routing_control(model, "index_replay", cache[rows]), capture_router_logits(model) as cap:
        model(ids[rows])
    for l, idx in enumerate(cap.indices):
        assert torch.equal(idx, cache.indices[l, rows].reshape(-1, 2).long())


@pytest.mark.parametrize("arch", ARCHS)
def test_logit_replay_reproduces_old_forward_and_blocks_router_gradient(arch):
    model = make_tiny_moe(arch)
    model.train()  # dropout is 0 in these configs; train mode as in the update forward
    ids = _batch()
    old_out, cache = forward_with_router_cache(model, keep_logits=True, input_ids=ids)
    _perturb_routers(model, scale=1.0)
    with torch.no_grad():
        drifted = model(ids).logits
    assert not torch.equal(drifted, old_out.logits)  # the perturbation matters without replay
    with routing_control(model, "logit_replay", cache):
        out = model(ids, output_router_logits=True)
        _lm_loss(out, ids).backward()
    assert torch.equal(out.logits, old_out.logits)  # exact reproduction of the old forward
    for l in range(cache.num_layers):  # output_router_logits reports the logits used
        assert torch.equal(out.router_logits[l], cache.logits[l].reshape(B * T, -1))
    for gate in moe_gates(model):
        assert gate.weight.grad is None or not gate.weight.grad.any()
    others = [p for n, p in model.named_parameters() if "mlp.gate." not in n and "shared_expert_gate" not in n]
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in others)
    with pytest.raises(ValueError, match="keep_logits"):
        with routing_control(model, "logit_replay", OldRouterCache(cache.indices, cache.logp, 4)):
            pass


@pytest.mark.parametrize("arch", ARCHS)
def test_freeze_keeps_router_and_restores_requires_grad(arch):
    model = make_tiny_moe(arch)
    ids = _batch()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with routing_control(model, RoutingMode.FREEZE):
        assert not any(p.requires_grad for g in moe_gates(model) for p in g.parameters())
        _lm_loss(model(ids), ids).backward()
    opt.step()
    opt.zero_grad()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    gate_names = {n for n, _ in model.named_parameters() if ".mlp.gate." in n}
    assert len(gate_names) == router_spec(model).num_moe_layers
    # router weights unchanged, every other parameter moved (for Qwen2-MoE that includes the
    # shared_expert_gate: only the router is frozen)
    assert changed == set(before) - gate_names
    assert all(p.requires_grad for p in model.parameters())  # restored on exit
    # and an unfrozen step does move the router
    _lm_loss(model(ids), ids).backward()
    opt.step()
    params = dict(model.named_parameters())
    assert all(not torch.equal(params[n], before[n]) for n in gate_names)


@pytest.mark.parametrize("arch", ARCHS)
def test_replay_in_bf16(arch):
    """bf16 models: logit replay is still exact (bf16 logits are exact in the fp32 cache) and the
    replayed scores have the architecture's dtype (bf16 for Qwen2/Qwen3/OLMoE, fp32 for Mixtral)."""
    model = make_tiny_moe(arch).to(torch.bfloat16)
    ids = _batch()
    old_out, cache = forward_with_router_cache(model, keep_logits=True, input_ids=ids)
    _perturb_routers(model)
    for mode in ("logit_replay", "index_replay"):
        used = []
        handles = [g.register_forward_hook(lambda m, a, o: used.append(o)) for g in moe_gates(model)]  # noqa: B023
        try:
            with torch.no_grad(), routing_control(model, mode, cache):
                out = model(ids)
        finally:
            for h in handles:
                h.remove()
        for _, scores, _idx in used:
            assert scores.dtype == (torch.float32 if arch == "mixtral" else torch.bfloat16)
        if mode == "logit_replay":
            assert torch.equal(out.logits, old_out.logits)


def test_routing_control_argument_errors():
    model = make_tiny_moe("qwen3_moe")
    with pytest.raises(ValueError, match="unknown routing mode"):
        with routing_control(model, "replay"):
            pass
    with pytest.raises(ValueError, match="needs the OldRouterCache"):
        with routing_control(model, "index_replay"):
            pass
    other = OldRouterCache.from_logits([torch.randn(6, 4)] * 3, 2, (2, 3))
    with pytest.raises(ValueError, match="MoE layers"):
        with routing_control(model, "index_replay", other):
            pass
    with routing_control(model, "none"), capture_router_logits(model) as cap:
        model(_batch())
    assert cap.num_calls == 1


def test_route_from_logits_matches_the_routers():
    """The replay path's routing equals each architecture's own gate on the same input."""
    for arch in ARCHS:
        for norm in (False, True):
            model = make_tiny_moe(arch, norm_topk_prob=norm, initializer_range=0.5)
            gate = moe_gates(model)[0]
            h = torch.randn(11, 32, generator=torch.Generator().manual_seed(2))
            logits, scores, idx = gate(h)
            spec = router_spec(model)
            mine = route_from_logits(
                logits, spec.top_k, renorm=spec.norm_topk_prob, scores_in_logits_dtype=arch != "mixtral"
            )
            assert torch.equal(mine[1], scores) and torch.equal(mine[2], idx)
            # in bf16: Qwen2/Qwen3/OLMoE cast the scores to bf16, Mixtral keeps them fp32
            gate = gate.to(torch.bfloat16)
            logits, scores, idx = gate(h.bfloat16())
            mine = route_from_logits(
                logits, spec.top_k, renorm=spec.norm_topk_prob, scores_in_logits_dtype=arch != "mixtral"
            )
            assert scores.dtype == (torch.float32 if arch == "mixtral" else torch.bfloat16)
            assert mine[1].dtype == scores.dtype
            assert torch.equal(mine[1], scores) and torch.equal(mine[2], idx)
