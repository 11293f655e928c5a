"""rspo.rollout.standin and the engine's residency over a real training step (CPU, main venv): the
stand-in engine allocates and frees at vLLM's sleep-mode calls; a Trainer step on it releases the
engine after the rollout, streams the weights into the woken weights with no gradient alive, wakes the
KV cache after, and a resumed run reads its checkpoint before the engine is built."""

import pytest
import torch
from test_train import digit_task, make_cfg
from tiny_moe import make_train_assets

from rspo.rollout.base import Sampling
from rspo.rollout.standin import StandInBackend, StandInEngine
from rspo.tokenizer import build_tokenizer
from rspo.train.trainer import Trainer


def test_the_engine_holds_its_share_awake_nothing_asleep_and_wakes_in_two_stages():
    engine = StandInEngine(4 * 2**20, 6 * 2**20, torch.device("cpu"))
    assert engine.resident_bytes == 10 * 2**20
    assert sum(b.numel() * b.element_size() for b in engine.buffers.values()) == 10 * 2**20
    engine.sleep(level=2)
    assert engine.resident_bytes == 0 and all(b is None for b in engine.buffers.values())
    engine.wake_up(tags=["weights"])
    assert engine.resident_bytes == 4 * 2**20
    engine.wake_up(tags=["kv_cache"])
    assert engine.resident_bytes == 10 * 2**20
    with pytest.raises(ValueError, match="level 2"):
        engine.sleep(level=1)


def test_the_engine_and_the_trainer_give_torchs_cached_blocks_back_on_a_gpu_only(monkeypatch):
    """As vLLM's sleep-mode pool does at sleep and at wake (its own memory, not torch's cache), and the
    trainer once its gradients are gone; on the CPU nothing is called."""
    from rspo.phase_memory import return_cached_blocks

    calls = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append(1))
    return_cached_blocks(torch.device("cpu"))
    engine = StandInEngine(0, 0, torch.device("cpu"))
    engine.sleep(level=2)
    engine.wake_up(tags=["weights"])
    assert calls == []
    return_cached_blocks(torch.device("cuda", 0))
    assert calls == [1]
    engine.device = torch.device("cuda", 0)
    engine.sizes = {"weights": 0, "kv_cache": 0}
    monkeypatch.setattr(torch, "empty", lambda *a, **k: None)  # no GPU here: the buffers are not made
    engine.sleep(level=2)
    engine.wake_up(tags=["weights"])
    assert calls == [1, 1, 1]


def test_rollouts_are_as_long_as_a_step_can_be_and_end_on_no_stop_token():
    tok = build_tokenizer()
    backend = StandInBackend(
        tok,
        StandInEngine(0, 0, torch.device("cpu")),
        prompt_tokens=7,
        response_tokens=5,
        dtype=torch.float32,
        sleep=True,
    )
    batch = backend.generate(["a", "b"], 3, Sampling(temperature=1.0, max_new_tokens=9))
    assert batch.input_ids.shape == (6, 7 + 5) and batch.prompt_width == 7
    assert bool(batch.response_mask.bool().all()) and bool(batch.attention_mask.bool().all())
    assert backend.generate(["a"], 2, Sampling(temperature=1.0, max_new_tokens=3)).response_mask.shape == (2, 3)
    # it samples nothing from the training model, so it has no old values to give
    with pytest.raises(ValueError, match="stand-in backend does not decode with the training model"):
        backend.generate(["a"], 2, Sampling(temperature=1.0, max_new_tokens=3), record_old=True)


def test_the_batch_is_on_the_engines_device_as_vllms_is_on_the_trainers():
    """On an H100 the stand-in's batch was on the CPU beside a model on cuda:0 (the old pass failed in
    the embedding); the meta device stands for a device that is not the CPU."""
    backend = StandInBackend(
        build_tokenizer(),
        StandInEngine(0, 0, torch.device("meta")),
        prompt_tokens=7,
        response_tokens=5,
        dtype=torch.float32,
        sleep=True,
    )
    batch = backend.generate(["a"], 2, Sampling(temperature=1.0, max_new_tokens=9))
    assert {batch.input_ids.device.type, batch.attention_mask.device.type, batch.response_mask.device.type} == {"meta"}


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_train_assets(tmp_path_factory.mktemp("standin_assets"))


class Recording(StandInBackend):
    """A stand-in backend that records, at each call the trainer makes, what the training model holds."""

    def __init__(self, policy, tokenizer, events):
        super().__init__(
            tokenizer,
            StandInEngine(2**20, 2**20, policy.device),
            prompt_tokens=8,
            response_tokens=policy.cfg.rollout.max_new_tokens,
            dtype=torch.float32,
            sleep=True,
        )
        self.policy, self.events = policy, events
        events.append(("engine built",))

    def _grads(self) -> int:
        return sum(p.grad is not None for p in self.policy.model.parameters())

    def release(self):
        self.events.append(("release", self._grads()))
        super().release()

    def sync_weights(self, model):
        self.events.append(("sync", self._grads(), self.engine.resident_bytes))
        super().sync_weights(model)

    def wake_kv(self):
        self.events.append(("kv wake", self._grads(), self.engine.resident_bytes))
        super().wake_kv()


def test_a_step_releases_the_gradients_before_the_engine_wakes_and_a_resume_reads_before_it_starts(
    assets, tmp_path, monkeypatch
):
    import rspo.train.checkpoint as checkpoint
    import rspo.train.update as update_module  # the update loop releases the gradients and the cache

    events: list = []
    real_load = checkpoint.load
    monkeypatch.setattr(
        update_module,
        "return_cached_blocks",
        lambda device: events.append(("cache returned", sum(p.grad is not None for p in tr.model.parameters()))),
    )

    def load(*args, **kwargs):
        events.append(("checkpoint read", None))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(checkpoint, "load", load)
    cfg = make_cfg(assets, algo="gmpo", router_shift=True)
    tr = Trainer(cfg, tmp_path / "run", task=digit_task(), engine=lambda p, tok: Recording(p, tok, events))
    tr.train_step()
    tr.save_checkpoint()
    # the engine released after the rollout; the weights woken alone (1 MiB of 2) for the sync, with no
    # gradient anywhere; the KV cache woken after
    assert events[0] == ("engine built",)
    assert events[1] == ("release", 0)
    assert events[2] == ("cache returned", 0)  # the activations' cached blocks, after the gradients
    assert events[3] == ("sync", 0, 0) and events[4] == ("kv wake", 0, 2**20)
    assert tr.backend.engine.events == ["wake:weights,kv_cache", "sleep", "wake:weights", "wake:kv_cache"]
    metrics = tr.memory.first
    assert {"engine_start", "rollout", "old_pass", "update", "optimizer_step", "sync", "kv_wake"} <= set(metrics)
    assert all(row["rss_gib"] > 0 for row in metrics.values())  # CPU: the process's resident memory
    events.clear()
    resumed = Trainer(cfg, tmp_path / "run", task=digit_task(), engine=lambda p, tok: Recording(p, tok, events))
    assert events == [("checkpoint read", None), ("engine built",)]  # read first, then the engine
    assert resumed.step == 1 and "resume" in resumed.memory.current


def test_the_router_cache_is_pinned_once_and_reused(assets, tmp_path):
    """The old-router cache's host buffers (pinned next to a GPU) are allocated at the first step, for
    the longest rows the run can have, and reused by every later step."""
    cfg = make_cfg(assets, algo="gmpo", router_shift=True)
    tr = Trainer(cfg, tmp_path / "run", task=digit_task())
    for _ in range(3):
        m = tr.train_step()
        assert "memory/update/rss_gib" in m and "memory/sync/rss_gib" in m
    assert tr.policy._host_buffers.allocations == 2  # indices and log-probs, once
    width = cfg.data.max_prompt_tokens + cfg.rollout.max_new_tokens
    assert (
        tr.policy._host_buffers.flat["indices"].numel()
        >= width * cfg.schedule.prompts_per_step * cfg.rollout.group_size
    )
