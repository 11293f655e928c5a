"""A stand-in for the colocated vLLM engine that holds memory as one does, so that a training step
can be measured (rspo preflight, where vLLM is not installed) or simulated (rspo.gpu_memory.simulate,
on fake tensors) with the trainer's own code.

``StandInEngine`` answers the calls ``rspo.rollout.colocate.EngineSleep`` makes on ``vllm.LLM``:
it allocates the engine's weights (``weight_bytes``: P x c / tensor parallel size) and its KV cache
(``kv_bytes``: what the engine's share leaves) on ``device`` when it is built, ``sleep(level=2)``
frees both, ``wake_up(tags=["weights"])`` and ``wake_up(tags=["kv_cache"])`` allocate them again.
What a real engine also holds (its activations at its batch size, CUDA graphs, NCCL and all-reduce
buffers) it does not: the plan counts those as their own lines (rspo.gpu_memory.plan).

``StandInBackend`` is the rollout backend around it. ``generate`` returns rows of the longest
shape a step can have: prompts of ``prompt_tokens`` and responses of ``response_tokens`` tokens,
none of them a stop token, so every position is trained on (the most memory the old pass and the
updates can need), with random token ids. ``sync_weights`` wakes the weights and streams the
training model's weights through the generator the vLLM backend hands its engine
(``checkpoint_weights``: one gathered decoder layer at a time, each shard cast to the engine's
dtype first), so the sync holds what the real one holds; given the ``model``, the backend streams it
once when it is built, as the vLLM backend loads an engine built on dummy weights.
"""

from __future__ import annotations

import random

import torch

from rspo.phase_memory import return_cached_blocks
from rspo.rollout.base import RolloutBatch, Sampling, pack_rows, refuse_old_values, stop_token_ids
from rspo.rollout.colocate import EngineSleep

ELEMENT = torch.bfloat16  # the engine's buffers are allocated as bf16 elements (2 bytes each)


class StandInEngine:
    """Weights and KV cache of an engine as two device buffers, freed and re-allocated by the
    sleep-mode calls of ``vllm.LLM``."""

    def __init__(self, weight_bytes: int, kv_bytes: int, device: torch.device) -> None:
        self.sizes = {"weights": int(weight_bytes), "kv_cache": int(kv_bytes)}
        self.device = device
        self.buffers: dict[str, torch.Tensor | None] = {tag: None for tag in self.sizes}
        self.events: list[str] = []  # the calls received, in order (tests read them)
        self.wake_up(tags=list(self.sizes))

    def sleep(self, level: int = 2) -> None:
        if level != 2:
            raise ValueError(f"the stand-in engine sleeps at level 2 only (weights and KV cache freed), got {level}")
        self.buffers = {tag: None for tag in self.sizes}
        return_cached_blocks(self.device)  # as vLLM's CuMemAllocator.sleep: the memory goes back to the driver
        self.events.append("sleep")

    def wake_up(self, tags: list[str] | None = None) -> None:
        return_cached_blocks(self.device)  # vLLM's CuMemAllocator.wake_up empties torch's cache before it maps
        for tag in tags or list(self.sizes):
            if self.buffers[tag] is None:
                self.buffers[tag] = torch.empty(max(1, self.sizes[tag] // 2), dtype=ELEMENT, device=self.device)
        self.events.append("wake:" + ",".join(tags or list(self.sizes)))

    @property
    def resident_bytes(self) -> int:
        return sum(self.sizes[tag] for tag, buf in self.buffers.items() if buf is not None)


class StandInBackend:
    """A rollout backend on a ``StandInEngine`` (see the module docstring)."""

    def __init__(
        self,
        tokenizer,
        engine: StandInEngine,
        *,
        prompt_tokens: int,
        response_tokens: int,
        dtype: torch.dtype,
        sleep: bool,
        seed: int = 0,
        batch_device: torch.device | None = None,
        model=None,
    ) -> None:
        self.tokenizer = tokenizer
        self.engine = engine
        self.batch_device = engine.device if batch_device is None else batch_device
        self.prompt_tokens, self.response_tokens = prompt_tokens, response_tokens
        self.dtype = dtype
        self.sleeper = EngineSleep(engine, sleep, on_cpu=False)
        special = set(stop_token_ids(tokenizer))
        self.ordinary = [i for i in range(len(tokenizer)) if i not in special]  # ids that end no response
        self.rng = random.Random(seed)
        self.last_sync_s = 0.0
        if model is not None:  # as the vLLM backend at its build: dummy weights, then the model's streamed in
            self._stream(model)

    def generate(
        self,
        prompts: list[str],
        n: int,
        sampling: Sampling,
        *,
        row_offset: int = 0,
        record_routing: bool = False,
        record_old: bool = False,
    ) -> RolloutBatch:
        """n rows per prompt of prompt_tokens + min(max_new_tokens, response_tokens) random tokens, on
        ``batch_device`` (default: the engine's, as vLLM's batch is on the trainer's device; the
        simulation keeps it on the host, where the trainer can read its values) (no log-probs and no
        routing are reported: the stand-in samples nothing)."""
        if not prompts:
            raise ValueError("prompts: empty")
        refuse_old_values("stand-in", record_old)
        self.sleeper.wake()
        R = min(sampling.max_new_tokens, self.response_tokens)
        B = len(prompts) * n
        pick = self.rng.choices
        prompt_rows = [pick(self.ordinary, k=self.prompt_tokens) for _ in range(B)]
        response_rows = [pick(self.ordinary, k=R) for _ in range(B)]
        return pack_rows(prompt_rows, response_rows, self.tokenizer, texts=[""] * B, device=self.batch_device)

    def release(self) -> None:
        self.sleeper.release()

    def wake_kv(self) -> None:
        self.sleeper.wake_kv()

    def sync_weights(self, model) -> None:
        """Wake the weights, then stream the training model's layers as the vLLM backend does."""
        import time

        t0 = time.perf_counter()
        self.sleeper.wake_weights()
        self._stream(model)
        self.last_sync_s = time.perf_counter() - t0

    def _stream(self, model) -> None:
        from rspo.rollout.vllm import checkpoint_weights

        for _name, _tensor in checkpoint_weights(model, self.dtype):
            pass  # the engine's loader copies each tensor into its weights; nothing else stays
