"""Rollout routing replay (R3, beyond the paper) with the hf backend: the engine records the experts of
every position it forwards where the trainer routes them (in fp32, with no mismatch, the trainer's own
old pass agrees on every (position, MoE layer)); with the engine in bf16 the trainer's own routing
disagrees somewhere, and R3 forces the engine's experts in the old pass (100% agreement) and the
updates; a 2-rank gloo run of R3 equals one process. On four architectures."""

import dataclasses

import pytest
from dist_runs import assert_same_run, train
from test_train import digit_task, make_cfg
from tiny_moe import ARCHS, make_tiny_moe, make_train_assets

from rspo.tokenizer import build_tokenizer
from rspo.train.trainer import Trainer


def agreement(assets, out, routing: str, dtype: str) -> dict:
    cfg = make_cfg(assets, algo="gmpo", routing=routing)
    cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, dtype=dtype))
    return Trainer(cfg, out, task=digit_task(), quiet=True).train_step()


def test_r3_old_pass_selects_exactly_the_experts_the_sampling_used(tmp_path):
    tok = build_tokenizer()
    without = {}
    for arch in ARCHS:
        # small router weights: near-ties between experts, where a bf16 engine routes differently
        model = make_tiny_moe(
            arch, num_experts=8, top_k=2, num_layers=2, hidden=64, vocab=len(tok), initializer_range=0.02
        )
        assets = make_train_assets(tmp_path / arch / "assets", model=model)
        aligned = agreement(assets, tmp_path / arch / "fp32", "none", "")
        assert aligned["rollout_corr/routing_agreement"] == 1.0, arch  # recorded where the trainer routes
        assert aligned["rollout_corr/max_abs_logp_diff"] < 1e-5, arch
        without[arch] = agreement(assets, tmp_path / arch / "bf16", "none", "bfloat16")
        r3 = agreement(assets, tmp_path / arch / "r3", "rollout_replay", "bfloat16")
        assert r3["rollout_corr/routing_agreement"] == 1.0, arch
    print({a: m["rollout_corr/routing_agreement"] for a, m in without.items()})
    assert min(m["rollout_corr/routing_agreement"] for m in without.values()) < 1.0  # the metric can fail


@pytest.mark.slow
def test_two_ranks_with_rollout_replay_equal_one_process(tmp_path):
    assets = make_train_assets(tmp_path / "assets")
    algo = ("algorithm.algo=gmpo", "algorithm.routing=rollout_replay")
    train(assets, tmp_path / "one", 1, algo=algo)
    train(assets, tmp_path / "two", 2, algo=algo)
    assert_same_run(tmp_path / "one", tmp_path / "two")
