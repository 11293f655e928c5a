"""Model FLOPs of the update (rspo.gpu_memory.flops), against a count by hand of a small MoE."""

from __future__ import annotations

import pytest

from rspo.gpu_memory.flops import PEAK_BF16, active_matrix_params, training_flops_per_token, update_mfu
from rspo.gpu_memory.shape import shape_from_config


def _config():
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        vocab_size=100,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_experts=6,
        num_experts_per_tok=2,
    )


def test_active_parameters_and_flops_counted_by_hand():
    shape = shape_from_config("t", _config(), 2)
    H, q, kv, E, k, I, V = 32, 4 * 8, 2 * 8, 6, 2, 16, 100
    attention = H * q + 2 * H * kv + q * H  # q, k, v, o (no biases)
    per_layer = attention + H * E + k * 3 * H * I  # + the router + two of the six experts
    dense_part = 2 * per_layer + V * H
    norms = active_matrix_params(shape) - dense_part  # what is left: the norms' weights
    assert 0 < norms <= 2 * (2 * H + 2 * 8)  # input/post norms and q/k norms per layer
    # a row of 9 tokens attends to 5 positions on average; attention: 12 x layers x q x 5
    assert training_flops_per_token(shape, 9) == pytest.approx(6 * active_matrix_params(shape) + 12 * 2 * q * 5)


def test_mfu_is_model_flops_over_the_gpus_peak():
    shape = shape_from_config("t", _config(), 2)
    per_token = training_flops_per_token(shape, 100)
    got = update_mfu(shape, tokens=1000, rows=10, seconds=2.0, gpu="h100-80gb")
    assert got["update_tflops"] == pytest.approx(per_token * 1000 / 2 / 1e12, rel=1e-3)
    assert got["update_mfu"] == pytest.approx(per_token * 1000 / 2 / PEAK_BF16["h100-80gb"], rel=1e-3)
    assert update_mfu(shape, 1000, 10, 2.0, gpu="") is None and update_mfu(shape, 0, 10, 2.0, "h100-80gb") is None
