"""rspo.train.forward: the shared-prompt forward equals the plain full forward (log-probs,
entropy, router logits and experts, gradients) on every architecture and routing mode; the
column window trims only padding; scoring uses the sampling temperature."""

import pytest
import torch
import torch.nn.functional as F
from router_reference import forward_with_router_cache
from tiny_moe import ARCHS, make_tiny_moe

from rspo.models import position_ids_from_mask
from rspo.router import OldRouterCache, RoutingMode
from rspo.train.forward import ForwardSettings, Rows, policy_forward, window

G = 3
# the modes that route from a cache (rollout replay: from the engine's experts, here the old pass's)
REPLAY = (RoutingMode.LOGIT_REPLAY, RoutingMode.INDEX_REPLAY, RoutingMode.ROLLOUT_REPLAY)


def layout(seed: int = 0, n_prompts: int = 2, P: int = 6, R: int = 5, vocab: int = 64):
    """Rows of the batch layout: left-padded prompts (shared by G rows), right-padded responses,
    with one all-padding column at both ends so that the window trims something."""
    g = torch.Generator().manual_seed(seed)
    prompt_lens = [P - 2, P - 1][:n_prompts]
    ids = torch.zeros(n_prompts * G, P + R + 1, dtype=torch.long)
    attn = torch.zeros_like(ids)
    resp = torch.zeros(n_prompts * G, R + 1)
    for i, pl in enumerate(prompt_lens):
        prompt = torch.randint(3, vocab, (pl,), generator=g)
        for j in range(G):
            row = i * G + j
            ids[row, P - pl : P] = prompt
            attn[row, P - pl : P] = 1
            n = int(torch.randint(1, R + 1, (1,), generator=g))
            ids[row, P : P + n] = torch.randint(3, vocab, (n,), generator=g)
            attn[row, P : P + n] = 1
            resp[row, :n] = 1
    return ids, attn, resp, P


def old_cache(model, ids, attn):
    """A cache of the rows from a perturbed copy of the model (so that replay changes routing)."""
    import copy

    old = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in old.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.add_(0.5 * torch.randn_like(p))
    _, cache = forward_with_router_cache(
        old, keep_logits=True, input_ids=ids, attention_mask=attn, position_ids=position_ids_from_mask(attn)
    )
    return cache


def run(model, ids, attn, resp, P, share, routing=RoutingMode.NONE, cache=None, temperature=1.0, logits_chunk=0):
    model.zero_grad(set_to_none=True)
    groups = torch.arange(ids.shape[0]) // G
    with policy_forward(
        model,
        Rows(ids, attn, resp, P, groups, cache),
        ForwardSettings(temperature=temperature, share_prompts=share, logits_chunk=logits_chunk),
        with_entropy=True,
        capture=True,
        routing=routing,
    ) as (out, win):
        (out.logp.sum() + 0.1 * out.entropy.sum()).backward()  # router logits: compared by value only
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out, win, grads


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("routing", list(RoutingMode), ids=lambda m: m.value)
def test_shared_prompt_forward_equals_the_plain_forward(arch, routing):
    model = make_tiny_moe(arch, top_k=2 if arch == "mixtral" else 1, num_experts=4).train()
    ids, attn, resp, P = layout()
    cache = old_cache(model, ids, attn) if routing in REPLAY else None
    a, win_a, ga = run(model, ids, attn, resp, P, True, routing, cache)
    b, win_b, gb = run(model, ids, attn, resp, P, False, routing, cache)
    assert win_a == win_b == window(attn, resp, P)
    torch.testing.assert_close(a.logp, b.logp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(a.entropy, b.entropy, rtol=1e-5, atol=1e-5)
    for la, lb, ia, ib in zip(a.router_logits, b.router_logits, a.router_indices, b.router_indices):
        torch.testing.assert_close(la, lb, rtol=1e-5, atol=1e-5)
        assert torch.equal(ia, ib)
    assert ga.keys() == gb.keys() and ga
    for k in ga:
        torch.testing.assert_close(ga[k], gb[k], rtol=1e-4, atol=1e-5, msg=k)
    gate = [k for k in ga if k.endswith("mlp.gate.weight")]
    if routing in (RoutingMode.FREEZE, RoutingMode.LOGIT_REPLAY):
        assert not gate, "a frozen or replayed router must get no gradient"
    else:
        assert gate


def test_the_window_trims_padding_only_and_scores_the_sampling_temperature():
    model = make_tiny_moe("qwen3_moe", top_k=1)
    ids, attn, resp, P = layout(seed=3)
    lo, hi = window(attn, resp, P)
    assert lo == 1 and hi == P + int(resp.sum(1).max())  # the first column and the last are padding
    T = 1.7
    with torch.no_grad():
        with policy_forward(
            model, Rows(ids, attn, resp, P, torch.arange(ids.shape[0]) // G), ForwardSettings(T), with_entropy=True
        ) as (out, _):
            pass
        full = model(input_ids=ids, attention_mask=attn, position_ids=position_ids_from_mask(attn)).logits
    logp_all = F.log_softmax(full[:, P - 1 : -1] / T, dim=-1)  # (B, R + 1, V) untrimmed reference
    ref = logp_all.gather(-1, ids[:, P:, None]).squeeze(-1)
    r = hi - P
    mask = resp[:, :r].bool()
    torch.testing.assert_close(out.logp[mask], ref[:, :r][mask], rtol=1e-5, atol=1e-5)
    ent = -(logp_all.exp() * logp_all).sum(-1)[:, :r]
    torch.testing.assert_close(out.entropy[mask], ent[mask], rtol=1e-5, atol=1e-5)


def test_cache_columns_and_rows_are_assigned_in_place():
    model = make_tiny_moe("qwen2_moe", top_k=1)
    ids, attn, resp, P = layout()
    full = old_cache(model, ids, attn)
    part = full[torch.tensor([1, 2]), 2:7]
    cache = OldRouterCache.zeros(full.num_layers, full.batch_shape, full.top_k, full.num_experts, keep_logits=True)
    cache.assign(torch.tensor([4, 0]), part.pad_columns(2, full.batch_shape[1]))
    assert torch.equal(cache.indices[:, 4, 2:7], full.indices[:, 1, 2:7])
    assert torch.equal(cache.logp[:, 0, 2:7], full.logp[:, 2, 2:7])
    assert torch.equal(cache.logits[:, 0, 2:7], full.logits[:, 2, 2:7])
    assert not cache.logp[:, 4, :2].any() and not cache.logp[:, 1].any()
    with pytest.raises(ValueError, match="do not fit"):
        part.pad_columns(8, full.batch_shape[1])
    with pytest.raises(ValueError, match="cannot assign"):
        cache.assign(torch.tensor([0]), part.pad_columns(2, full.batch_shape[1]))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("routing", list(RoutingMode), ids=lambda m: m.value)
def test_gradient_checkpointing_gives_the_forward_and_gradients_of_the_plain_backward(arch, routing):
    """Non-reentrant checkpointing recomputes each layer in backward(); the router capture's own
    F.linear must run again there (same saved tensors) and the captured logits must keep their
    gradient (RS without stop-gradient, the aux loss). Before the capture spanned the backward,
    this raised torch.utils.checkpoint.CheckpointError (a different number of saved tensors)."""
    from rspo.train.memory import enable_activation_checkpointing

    model = make_tiny_moe(arch, top_k=2 if arch == "mixtral" else 1, num_experts=4).train()
    ids, attn, resp, P = layout(seed=5)
    cache = old_cache(model, ids, attn) if routing in REPLAY else None

    def grads_of(checkpointing: bool):
        if checkpointing:
            enable_activation_checkpointing(model)
        else:
            model.gradient_checkpointing_disable()
        model.zero_grad(set_to_none=True)
        with policy_forward(
            model,
            Rows(ids, attn, resp, P, torch.arange(ids.shape[0]) // G, cache),
            ForwardSettings(share_prompts=False),
            with_entropy=True,
            capture=True,
            routing=routing,
        ) as (out, _):
            router = sum(torch.logsumexp(lg.float(), -1).sum() for lg in out.router_logits)
            (out.logp.sum() + 0.1 * out.entropy.sum() + 0.01 * router).backward()
            assert len(out.router_logits[0]) == ids.shape[0] * (_[1] - _[0])  # the forward, recorded once
        return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    plain, g_plain = grads_of(False)
    ckpt, g_ckpt = grads_of(True)
    assert model.model.layers[0].gradient_checkpointing
    torch.testing.assert_close(ckpt.logp, plain.logp, rtol=0, atol=0)
    assert g_plain.keys() == g_ckpt.keys()
    # the captured logits carry the router's gradient (but for freeze, whose router has none)
    assert any(k.endswith("mlp.gate.weight") for k in g_ckpt) == (routing is not RoutingMode.FREEZE)
    for k in g_plain:
        torch.testing.assert_close(g_ckpt[k], g_plain[k], rtol=1e-5, atol=1e-6, msg=k)
