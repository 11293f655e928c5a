"""rspo.rollout.colocate: which configurations may shard an engine over ranks, each rank's share of
a tensor-parallel group's rollout, and the sleep / wake order around a weight sync (the GPU path
driven by a fake engine; vLLM's CPU build has no sleep mode and is skipped with one log line).
The real engine sharded over two ranks: tests/test_distributed_vllm.py."""

import logging

import pytest
import torch

from rspo.distributed import Dist
from rspo.rollout.base import RolloutBatch, Sampling
from rspo.rollout.colocate import EngineSleep, check_tensor_parallel, generate_share


def test_a_sharded_engine_needs_torchrun_vllm_and_whole_groups():
    check_tensor_parallel(1, Dist(), "hf")
    check_tensor_parallel(2, Dist(rank=0, world_size=4, local_world_size=4), "vllm")
    with pytest.raises(ValueError, match="only the vllm backend"):
        check_tensor_parallel(2, Dist(rank=0, world_size=2, local_world_size=2), "hf")
    with pytest.raises(ValueError, match="needs torchrun with a multiple of 2"):
        check_tensor_parallel(2, Dist(), "vllm")
    with pytest.raises(ValueError, match="needs torchrun with a multiple of 4"):
        check_tensor_parallel(4, Dist(rank=0, world_size=8, local_world_size=2), "vllm")  # groups across nodes


class FakeEngineBackend:
    """Records each generate call; row i of a call is a response naming its global row."""

    def __init__(self):
        self.calls = []

    def generate(self, prompts, n, sampling, *, row_offset=0, record_routing=False):
        self.calls.append((list(prompts), n, row_offset, sampling))
        B = len(prompts) * n
        ids = torch.arange(row_offset, row_offset + B)[:, None].repeat(1, 2)
        return RolloutBatch(ids, torch.ones_like(ids), 1, torch.ones(B, 1), [f"row{row_offset + i}" for i in range(B)])


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_each_rank_keeps_its_rows_of_its_groups_rollout(tp):
    prompts = [f"p{i}" for i in range(8)]  # 8 prompts over 4 ranks: 2 each
    shares = {}
    for rank in range(4):
        backend = FakeEngineBackend()
        batch = generate_share(
            backend, prompts, 3, Dist(rank=rank, world_size=4, local_world_size=4), tp, Sampling(1.0, seed=9)
        )
        shares[rank] = batch.responses
        ((called, n, offset, sampling),) = backend.calls
        group = rank // tp
        assert called == prompts[group * tp * 2 : (group + 1) * tp * 2]  # the group's prompts, in rank order
        assert n == 3 and offset == group * tp * 2 * 3 and sampling == Sampling(1.0, seed=9)  # global row seeds
    for rank in range(4):  # every rank's own rows, as with an engine per rank
        assert shares[rank] == [f"row{r}" for r in range(rank * 6, rank * 6 + 6)]


class FakeLLM:
    def __init__(self):
        self.events = []

    def sleep(self, level):
        self.events.append(f"sleep{level}")

    def wake_up(self, tags=None):
        self.events.append("wake:" + ",".join(tags or ["all"]))

    def collective_rpc(self, method, args=(), kwargs=None):
        self.events.append(f"reload:{sum(1 for _ in (kwargs or {}).get('weights_iterator', args[0] if args else []))}")
        return [None]

    def reset_prefix_cache(self):
        self.events.append("reset")


def test_on_a_gpu_the_engine_sleeps_after_a_rollout_and_wakes_before_the_next_sync():
    """Sleep after the rollout; the sync wakes the weights alone, reloads them, and only then does
    wake_kv map the KV cache back (two stages: never weights and KV cache beside a gathered layer)."""
    from tiny_moe import make_tiny_moe

    from rspo.rollout.vllm import VLLMBackend
    from rspo.tokenizer import build_tokenizer

    tok = build_tokenizer()
    model = make_tiny_moe("qwen3_moe", vocab=len(tok))
    llm = FakeLLM()
    backend = VLLMBackend(model, tok, engine=llm, sampling_params_cls=object, on_cpu=False, sleep=True, dtype="float32")
    backend.release()
    backend.release()  # already asleep: once
    backend.sync_weights(model)
    assert llm.events[:2] == ["sleep2", "wake:weights"] and llm.events[2].startswith("reload:")
    assert llm.events[3] == "reset" and "wake:kv_cache" not in llm.events  # the KV cache still asleep
    assert int(llm.events[2].split(":")[1]) > 0  # the weights arrived after the weights woke
    backend.wake_kv()
    assert llm.events[4] == "wake:kv_cache"
    backend.sync_weights(model)  # awake: no second wake-up
    backend.wake_kv()
    assert sum(e.startswith("wake") for e in llm.events) == 2 and "wake:all" not in llm.events


def test_on_a_cpu_sleep_mode_is_skipped_with_one_log_line(caplog):
    llm = FakeLLM()
    with caplog.at_level(logging.WARNING, logger="rspo.rollout.colocate"):
        sleeper = EngineSleep(llm, enabled=True, on_cpu=True)
    sleeper.release()
    sleeper.wake()
    assert llm.events == [] and "no sleep mode" in caplog.text
    off = EngineSleep(llm, enabled=False, on_cpu=False)
    off.release()
    assert llm.events == []


def test_an_evaluation_engine_spans_the_jobs_gpus():
    from rspo.evaluate.run import engine_tensor_parallel

    assert engine_tensor_parallel("auto", "hf") == 1
    assert engine_tensor_parallel("auto", "vllm") == (torch.cuda.device_count() if torch.cuda.is_available() else 1)
    assert engine_tensor_parallel(4, "vllm") == 4


class _Allocator:
    """torch's allocator settings, recorded (what ``torch._C._accelerator_setAllocatorSettings`` was
    given, and its getter): the job starts with expandable segments on and a second option."""

    START = "expandable_segments:True,max_split_size_mb:512"

    def __init__(self):
        self.settings, self.calls = self.START, []

    def __call__(self, settings: str):
        self.calls.append(settings)
        self.settings = settings

    @property
    def expandable(self) -> bool:
        return "expandable_segments:True" in self.settings


@pytest.fixture
def cuda_allocator(monkeypatch):
    allocator = _Allocator()
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", _Allocator.START)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch._C, "_accelerator_setAllocatorSettings", allocator)
    monkeypatch.setattr(torch._C, "_accelerator_getAllocatorSettings", lambda: allocator.settings)
    return allocator


def test_the_engine_allocates_with_expandable_segments_off_and_training_gets_them_back(
    cuda_allocator, monkeypatch, tmp_path
):
    """vLLM 0.32 captures CUDA graphs into a sleep-mode MemPool, which torch's allocator refuses
    under expandable segments: the engine is built, put to sleep and woken with them off (a fake
    vllm.LLM fails the test when it is built, slept or woken with them on), and they are on again
    for training after each."""
    from rspo.rollout import vllm as V
    from rspo.tokenizer import build_tokenizer

    seen = []

    class FakeLLM:
        def __init__(self, **kwargs):
            assert not cuda_allocator.expandable, "vllm.LLM built under expandable segments"
            assert kwargs["enable_sleep_mode"] and kwargs["sleep_mode_offload_cudagraph"]
            seen.append("build")

        def sleep(self, level):
            assert not cuda_allocator.expandable, "engine put to sleep under expandable segments"
            seen.append(f"sleep{level}")

        def wake_up(self, tags):
            assert not cuda_allocator.expandable, "engine woken under expandable segments"
            seen.append(f"wake {tags[0]}")

        def collective_rpc(self, method, kwargs=None, args=()):
            list(kwargs["weights_iterator"])

        def reset_prefix_cache(self):
            pass

    monkeypatch.setattr(V, "_import_vllm", lambda: (FakeLLM, object))
    monkeypatch.setattr(V, "_on_cpu", lambda: False)
    from tiny_moe import make_tiny_moe

    tok = build_tokenizer()
    model = make_tiny_moe("qwen2_moe", num_experts=4, top_k=1, num_layers=1, hidden=16, vocab=len(tok))
    backend = V.VLLMBackend(model, tok, model_path=str(tmp_path), sleep=True, on_cpu=False, dtype="float32")
    assert cuda_allocator.expandable  # training's setting is back after the build
    backend.release()
    assert cuda_allocator.expandable
    backend.wake_kv()  # the sync's second stage without its first: only the KV cache wakes
    backend.sleeper.wake()
    assert cuda_allocator.expandable and seen == ["build", "sleep2", "wake kv_cache", "wake weights"]
    assert cuda_allocator.calls == ["max_split_size_mb:512,expandable_segments:False", _Allocator.START] * 4


def test_a_job_without_expandable_segments_is_left_as_it_is(monkeypatch):
    from rspo.rollout.colocate import engine_allocator

    calls = []
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:512")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch._C, "_accelerator_getAllocatorSettings", lambda: "max_split_size_mb:512")
    monkeypatch.setattr(torch._C, "_accelerator_setAllocatorSettings", calls.append)
    with engine_allocator():
        pass
    assert calls == []


def test_the_toggle_changes_only_expandable_segments_and_restores_the_exact_settings(monkeypatch):
    """On the CPU build's own allocator-settings API (torch 2.13 keeps the string there too): the
    site's other options survive the engine's build, and the string after is the one before; no
    FutureWarning from the deprecated torch.cuda.memory._set_allocator_settings."""
    import warnings

    from rspo.rollout.colocate import allocator_settings, engine_allocator, set_allocator_settings

    site = "expandable_segments:True,max_split_size_mb:512,garbage_collection_threshold:0.6"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    before = allocator_settings()
    set_allocator_settings(site)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)
            with engine_allocator():
                inside = torch._C._accelerator_getAllocatorSettings()
        assert inside == "max_split_size_mb:512,garbage_collection_threshold:0.6,expandable_segments:False"
        assert torch._C._accelerator_getAllocatorSettings() == site
    finally:
        set_allocator_settings(before)


def test_the_settings_string_is_read_as_torch_reads_it():
    from rspo.rollout.colocate import _expandable, with_expandable

    assert _expandable("expandable_segments:True") and _expandable("max_split_size_mb:64, expandable_segments : true")
    assert not _expandable("") and not _expandable("expandable_segments:True,expandable_segments:False")
    assert with_expandable("", False) == "expandable_segments:False"
    assert with_expandable("a:1,expandable_segments:True,b:2", False) == "a:1,b:2,expandable_segments:False"
