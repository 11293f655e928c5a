"""The GPU branch of rspo.rollout.vllm that the CPU build cannot run, checked against vLLM 0.32's own
types: every engine configuration the presets can ask for is accepted by ``vllm.EngineArgs`` (a
misspelt or removed argument is a TypeError there, before any GPU hour), and ``routed_experts_of``
reads a ``vllm.outputs.CompletionOutput`` in 0.32's format (R3's routing on GPUs)."""

import itertools

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.vllm
vllm = pytest.importorskip(
    "vllm", reason="needs vLLM (its CPU build in .venv-vllm: `make test` runs these tests there)"
)

from rspo.rollout import vllm as V  # noqa: E402

CASES = list(itertools.product([1, 2], [False, True], [False, True], [1, 2], [False, True], [None, 12.5]))


@pytest.mark.parametrize("world, sleep, eager, tp, routing, kv_gib", CASES)
def test_every_gpu_engine_configuration_is_what_vllm_0_32_accepts(
    monkeypatch, tmp_path, world, sleep, eager, tp, routing, kv_gib
):
    monkeypatch.setattr(V, "_on_cpu", lambda: False)
    monkeypatch.setenv("WORLD_SIZE", str(world))
    kw = V.engine_kwargs(
        str(tmp_path),  # a local checkpoint folder (vLLM resolves anything else on the hub)
        dtype="bfloat16",
        seed=3,
        max_model_len=9216,
        gpu_memory_utilization=0.4,
        kv_cache_gib=kv_gib,
        tensor_parallel_size=tp,
        sleep=sleep,
        enforce_eager=eager,
        return_routing=routing,
    )
    args = vllm.EngineArgs(**kw)  # TypeError on any argument vLLM 0.32 does not have
    assert args.enable_sleep_mode == sleep and args.gpu_memory_utilization == 0.4
    assert args.sleep_mode_offload_cudagraph == (sleep and not eager)  # no graphs to offload when eager
    assert args.enable_return_routed_experts == routing
    if world > 1:
        assert args.distributed_executor_backend == "external_launcher" and args.tensor_parallel_size == tp
    assert args.kv_cache_memory_bytes == (int(kv_gib * 2**30) if kv_gib else None)
    with pytest.raises(TypeError):
        vllm.EngineArgs(**kw, sleep_mode_offload_cuda_graph=True)  # a misspelling is refused


def test_routed_experts_of_reads_a_completion_in_vllm_0_32s_format():
    """CompletionOutput.routed_experts: [positions, layers, top-k] over the prompt and every generated
    token but the last (never forwarded); -> (layers, length, top-k), the last position 0..K-1."""
    from vllm.outputs import CompletionOutput

    prompt, generated, layers, k = 5, 3, 4, 2
    positions = prompt + generated - 1
    arr = np.random.default_rng(0).integers(0, 128, size=(positions, layers, k), dtype=np.uint8)
    out = CompletionOutput(
        index=0, text="", token_ids=[7, 8, 9], cumulative_logprob=None, logprobs=None, routed_experts=arr
    )
    got = V.routed_experts_of(out, prompt + generated)
    assert got.shape == (layers, prompt + generated, k) and got.dtype == torch.uint8
    assert torch.equal(got[:, :positions], torch.as_tensor(arr).permute(1, 0, 2))
    assert got[:, -1].tolist() == [[0, 1]] * layers
    wide = CompletionOutput(0, "", [7], None, None, routed_experts=arr.astype(np.uint16) + 200)  # > 256 experts
    assert V.routed_experts_of(wide, positions + 1).dtype == torch.int16
