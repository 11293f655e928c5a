"""rspo.rollout.fp8: the hf backend's FP8 (W8A8) engine (rollout.dtype: fp8). Each weight matrix of
the decoder rounded to E4M3 with its own scale (per expert for expert stacks) and the inputs of its
products per row; routers, the shared expert's gate, embeddings, norms and LM head untouched, their
inputs too; the trainer's weights and experts implementation back bit for bit; a training step with
it reports a mismatch and leaves the weights the optimizer made."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from test_rollout_replay import agreement
from test_train import digit_task, make_cfg
from tiny_moe import ARCHS, make_tiny_moe, make_train_assets

from rspo.config import ConfigError, RolloutConfig
from rspo.rollout.fp8 import E4M3_MAX, fp8_weights, quantized_names, round_rows_to_fp8, round_to_fp8
from rspo.router import moe_gates
from rspo.tokenizer import build_tokenizer
from rspo.train.trainer import Trainer


def test_rounding_is_e4m3_with_amax_over_448_per_tensor_and_per_expert():
    torch.manual_seed(0)
    w = torch.randn(5, 7) * 0.03
    s = w.abs().max() / E4M3_MAX
    assert torch.equal(round_to_fp8(w), (w / s).to(torch.float8_e4m3fn).float() * s)
    assert torch.equal(round_to_fp8(round_to_fp8(w)), round_to_fp8(w))  # already on the grid
    stack = torch.stack([w, 100 * w])  # two experts, scales 100x apart: each keeps its own
    assert torch.allclose(round_to_fp8(stack)[1], 100 * round_to_fp8(w), rtol=1e-6)
    rel = ((round_to_fp8(w) - w).norm() / w.norm()).item()
    assert 1e-3 < rel < 0.07  # 3 mantissa bits: a few percent, not bf16's 0.4%


@pytest.mark.parametrize("arch", ARCHS)
def test_only_the_decoder_matrices_change_and_all_come_back_bit_for_bit(arch):
    model = make_tiny_moe(arch, num_experts=4, top_k=2, num_layers=2, hidden=32, vocab=40)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    names = set(quantized_names(model))
    gates = {id(p) for g in moe_gates(model) for p in g.parameters()}
    assert names and not any(id(p) in gates for n, p in model.named_parameters() if n in names)
    assert any(p.dim() == 3 for n, p in model.named_parameters() if n in names)  # the fused expert stacks
    with pytest.raises(RuntimeError, match="inside"), fp8_weights(model):
        for n, p in model.named_parameters():
            if n in names:
                assert torch.equal(p, round_to_fp8(before[n])) and not torch.equal(p, before[n]), n
            else:  # routers, embeddings, norms, LM head, biases
                assert torch.equal(p, before[n]), n
        raise RuntimeError("inside")  # an error while decoding still puts the weights back
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())


@pytest.mark.parametrize("arch", ARCHS)
def test_the_inputs_of_the_fp8_matrices_are_rounded_per_row_and_no_others(arch):
    torch.manual_seed(0)
    model = make_tiny_moe(arch, num_experts=4, top_k=2, num_layers=2, hidden=32, vocab=40)
    model.set_experts_implementation("grouped_mm")
    names = quantized_names(model)
    params = dict(model.named_parameters())
    x = torch.randn(3, 32)
    rows = round_rows_to_fp8(x)
    assert torch.equal(rows[1], round_rows_to_fp8(x[1:2])[0])  # one scale per row
    head = model.get_output_embeddings().weight
    gate = next(iter(moe_gates(model)[0].parameters()))
    with fp8_weights(model):
        assert model.config._experts_implementation == "eager"  # its loop goes through F.linear
        w = params[next(n for n in names if n.endswith("q_proj.weight"))]
        assert torch.equal(F.linear(x, w), F.linear(rows, w))
        stack = params[next(n for n in names if params[n].dim() == 3)]
        piece = stack[1]  # an expert's slice of the stack, as transformers' eager loop takes it
        y = torch.randn(3, piece.shape[1])
        assert torch.equal(F.linear(y, piece), F.linear(round_rows_to_fp8(y), piece))
        assert not torch.equal(F.linear(x, head), F.linear(rows, head))  # LM head: input as it is
        z = torch.randn(3, gate.shape[1])
        assert not torch.equal(F.linear(z, gate), F.linear(round_rows_to_fp8(z), gate))  # router: as it is
    assert model.config._experts_implementation == "grouped_mm"


def test_fp8_is_refused_beside_vllm_and_named_among_the_choices():
    with pytest.raises(ConfigError, match="vLLM's own quantization"):
        RolloutConfig(backend="vllm", dtype="fp8").validate("rl.rollout")
    with pytest.raises(ConfigError, match=r"unknown dtype 'fp4'; choose one of \[.*'float16', 'fp8'\]"):
        RolloutConfig(dtype="fp4").validate("rl.rollout")
    RolloutConfig(dtype="fp8").validate("rl.rollout")


def test_a_step_with_an_fp8_engine_measures_a_mismatch_and_trains_the_fp32_weights(tmp_path):
    tok = build_tokenizer()
    model = make_tiny_moe("qwen2_moe", num_experts=8, top_k=2, num_layers=2, hidden=64, vocab=len(tok))
    assets = make_train_assets(tmp_path / "assets", model=model)
    same = agreement(assets, tmp_path / "fp32", "none", "")
    cfg = make_cfg(assets, algo="gmpo")
    cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, dtype="fp8"))
    tr = Trainer(cfg, tmp_path / "fp8", task=digit_task(), quiet=True)
    fp8 = tr.train_step()
    assert same["rollout_corr/max_abs_logp_diff"] < 1e-5
    assert fp8["rollout_corr/k3_kl"] > 100 * max(same["rollout_corr/k3_kl"], 1e-12)
    assert fp8["rollout_corr/max_abs_logp_diff"] > 1e-3
    # the optimizer stepped the trainer's own weights, not their FP8 copies
    params = dict(tr.model.named_parameters())
    assert all(not torch.equal(params[n], round_to_fp8(params[n])) for n in quantized_names(tr.model))


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9) else [])


@pytest.mark.parametrize("device", DEVICES)
def test_the_engine_product_equals_an_fp8_gemm(device):
    """The engine's product (the weight rounded inside fp8_weights, its input rounded by the mode,
    bf16 autocast: the code path of a rollout) against torch._scaled_mm on the same E4M3 values and
    scales (row-wise for the input, one scale for the weight), which on a Hopper GPU (capability
    >= 8.9) is the FP8 tensor-core GEMM an FP8 engine runs. They differ by the bf16 rounding of the
    scaled values and the accumulation order only: far less than FP8's own rounding error."""
    torch.manual_seed(0)
    model = make_tiny_moe("qwen3_moe", num_experts=4, top_k=2, num_layers=1, hidden=64, vocab=40).to(device)
    name = next(n for n in quantized_names(model) if n.endswith("q_proj.weight"))
    w = dict(model.named_parameters())[name]
    x = torch.randn(32, w.shape[1], device=device) * torch.linspace(0.1, 4.0, w.shape[1], device=device)
    exact = F.linear(x, w).detach().double()
    sx = x.abs().amax(dim=-1, keepdim=True) / E4M3_MAX
    sw = w.detach().abs().amax() / E4M3_MAX
    xq, wq = (x / sx).to(torch.float8_e4m3fn), (w.detach() / sw).to(torch.float8_e4m3fn)
    try:
        gemm = torch._scaled_mm(
            xq,
            wq.t(),
            scale_a=sx.float(),
            scale_b=sw.float().expand(1, w.shape[0]).contiguous(),
            out_dtype=torch.bfloat16,
        ).double()
    except RuntimeError as e:  # torch before 2.13 has per-tensor scales only on the CPU
        if device == "cpu" and "per-tensor" in str(e):
            pytest.skip(f"this torch's CPU _scaled_mm has no row-wise scales: {e}")
        raise
    with torch.no_grad(), fp8_weights(model), torch.autocast(device, dtype=torch.bfloat16):
        engine = F.linear(x, w).double()

    def rel(a, b):
        return float((a - b).norm() / b.norm())

    quantization = rel(gemm, exact)  # what FP8 itself changes: the mismatch the regime is about
    print(f"{device}: FP8 vs exact {quantization:.4f}, engine vs FP8 GEMM {rel(engine, gemm):.5f}")
    assert 0.01 < quantization < 0.1
    assert rel(engine, gemm) < 0.25 * quantization, (rel(engine, gemm), quantization)
