"""rspo.train.micro_batches, rspo.train.chunked_logprobs, rspo.train.row_cache: token-bounded
micro-batches leave the update's loss and gradients unchanged
(every algorithm, RS, every routing mode), ranks agree on their number of forwards, log-probs
computed from the hidden states in chunks equal the whole-logits ones, and the old-router cache
holds the rows a rank reads."""

import dataclasses

import pytest
import torch
from test_forward import layout, old_cache, run
from test_train import CASES, digit_task, make_cfg
from tiny_moe import ARCHS, make_tiny_moe, make_train_assets

from rspo.distributed import Dist
from rspo.losses import group_advantages
from rspo.router import RoutingMode
from rspo.train.micro_batches import merge_micro_metrics, pack_micro_batches, row_tokens
from rspo.train.policy import StepTensors
from rspo.train.row_cache import RowCache
from rspo.train.trainer import Trainer
from rspo.train.update import update_mini_batch


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_train_assets(tmp_path_factory.mktemp("memory_assets"))


def test_packing_respects_the_budget_and_keeps_every_row():
    lengths = torch.tensor([5, 17, 3, 9, 9, 30, 2, 11])
    rows = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7])
    mbs = pack_micro_batches(rows, lengths, budget=20)
    assert sorted(torch.cat(mbs).tolist()) == rows.tolist()
    for mb in mbs:
        assert len(mb) * int(lengths[mb].max()) <= 20 or len(mb) == 1  # a 30-token row goes alone
    assert [30] in [lengths[mb].tolist() for mb in mbs]
    assert all(len(mb) <= 2 for mb in pack_micro_batches(rows, lengths, budget=1000, max_rows=2))


def one_update(assets, tmp_path, algo, budget):
    """The gradient of one off-policy update: old pass, then weights moved (seeded), then the
    mini-batch's update with the optimizer step captured."""
    cfg = make_cfg(assets, **algo)
    cfg = dataclasses.replace(
        cfg,
        rollout=dataclasses.replace(cfg.rollout, max_new_tokens=10),
        schedule=dataclasses.replace(
            cfg.schedule, prompts_per_step=4, mini_batch_prompts=4, max_tokens_per_micro_batch=budget
        ),
    )
    tr = Trainer(cfg, tmp_path / f"b{budget}", task=digit_task())
    batch, rewards, _ = tr.rollouts.rollout(0, tr.device)
    adv = group_advantages(rewards, cfg.rollout.group_size)
    p = tr.policy
    mbs = p.mini_batches(0, 0)
    tokens = row_tokens(batch.attention_mask, batch.response_mask, batch.prompt_width)
    old_logp, entropy, cache = p._old_pass(batch, mbs, mbs, tokens)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(0)
        for w in tr.model.parameters():
            w.add_(0.05 * torch.randn(w.shape, generator=gen))
    grads = {}

    def captured_step():
        grads.update({n: w.grad.clone() for n, w in tr.model.named_parameters() if w.grad is not None})

    p.optimizer.step = captured_step
    tr.model.train()
    st = StepTensors(batch, adv, old_logp, entropy, cache, mbs, tokens)
    metrics = update_mini_batch(p, st, mbs[0], step=0, record=False)
    means = merge_micro_metrics(metrics, cfg.algorithm.algo)
    return grads, means, len(p.micro_batches(mbs[0], tokens))


@pytest.mark.parametrize("algo", CASES, ids=lambda a: "-".join(f"{v}" for v in a.values()))
def test_a_token_budget_splits_an_update_without_changing_its_loss_or_gradients(assets, tmp_path, algo):
    """16 rows of up to ~20 tokens: unsplit (one forward) vs a 40-token budget (several). The
    loss (the response-weighted mean of the micro-batch losses) and every gradient agree to float
    rounding (rel 1e-5, abs 1e-7): each algorithm's loss is a mean over responses."""
    whole, m_whole, n_whole = one_update(assets, tmp_path, algo, 0)
    split, m_split, n_split = one_update(assets, tmp_path, algo, 40)
    assert n_whole == 1 and n_split >= 4
    assert m_split["actor/pg_loss"] == pytest.approx(m_whole["actor/pg_loss"], rel=1e-5, abs=1e-7)
    if algo.get("router_shift"):
        assert m_split["router/shift_ratio_mean"] < 1.0  # off-policy: RS acts
    assert whole.keys() == split.keys() and whole
    for k in whole:
        torch.testing.assert_close(split[k], whole[k], rtol=1e-5, atol=1e-7, msg=k)


def test_an_entropy_bonus_is_split_invariant_too(assets, tmp_path):
    algo = dict(algo="grpo", router_shift=True, entropy_coef=0.05)
    whole, _, _ = one_update(assets, tmp_path, algo, 0)
    split, _, _ = one_update(assets, tmp_path, algo, 40)
    for k in whole:
        torch.testing.assert_close(split[k], whole[k], rtol=1e-5, atol=1e-7, msg=k)


def test_ranks_run_as_many_forwards_as_the_rank_with_most_micro_batches(assets, tmp_path):
    cfg = make_cfg(assets)
    cfg = dataclasses.replace(cfg, schedule=dataclasses.replace(cfg.schedule, max_tokens_per_micro_batch=30))
    tr = Trainer(cfg, tmp_path / "r", task=digit_task())
    mb = torch.arange(8)
    p = tr.policy
    tokens = torch.tensor([30, 30, 30, 30, 5, 5, 5, 5])  # rank 0: 4 forwards, rank 1: 1
    counts = {}
    for rank in (0, 1):
        p.dist = Dist(rank=rank, world_size=2)
        mbs = p.micro_batches(mb, tokens)
        counts[rank] = (len(mbs), sum(m is None for m in mbs))
        assert sorted(torch.cat([m for m in mbs if m is not None]).tolist()) == mb[rank * 4 : rank * 4 + 4].tolist()
    assert counts == {0: (4, 0), 1: (4, 3)}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("share", [True, False], ids=["shared-prompts", "plain"])
def test_chunked_log_probs_equal_the_whole_logits_ones(arch, share):
    model = make_tiny_moe(arch, top_k=2 if arch == "mixtral" else 1).train()
    ids, attn, resp, P = layout(seed=7)
    runs = [run(model, ids, attn, resp, P, share, temperature=1.3, logits_chunk=chunk) for chunk in (0, 3)]
    (a, _, ga), (b, _, gb) = runs
    torch.testing.assert_close(b.logp, a.logp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(b.entropy, a.entropy, rtol=1e-5, atol=1e-5)
    assert ga.keys() == gb.keys() and "lm_head.weight" in ga
    for k in ga:
        torch.testing.assert_close(gb[k], ga[k], rtol=1e-4, atol=1e-6, msg=k)
    assert "forward" not in model.lm_head.__dict__  # the LM head is itself again after the block


def test_the_row_cache_holds_and_serves_batch_rows():
    model = make_tiny_moe("qwen3_moe", top_k=2)
    ids, attn, _, _ = layout()
    full = old_cache(model, ids, attn)
    B, T = full.batch_shape
    rows = torch.tensor([1, 4])
    rc = RowCache.zeros(rows, B, T, full.num_layers, full.top_k, full.num_experts, keep_logits=True)
    rc.assign(rows, full[rows])
    assert torch.equal(rc[torch.tensor([4])].logp, full[torch.tensor([4])].logp)
    assert torch.equal(rc[torch.tensor([1]), 2:5].indices, full[torch.tensor([1]), 2:5].indices)
    assert rc.nbytes == full[rows].nbytes  # 2 of the 6 rows
    with pytest.raises(IndexError, match="does not hold these rows"):
        rc[torch.tensor([0])]
    assert RoutingMode.INDEX_REPLAY  # the replay hooks read cache[rows] (tests/test_train.py, test_forward.py)
