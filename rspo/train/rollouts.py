"""The prompts of an RL run, the step's rollouts and the held-out validation.

``RunRecords`` are the training and held-out records (prompts longer than
``data.max_prompt_tokens`` dropped when they are loaded, before the model is). ``Rollouts``, built
once the rollout backend exists, draws each step's prompts as a pure
function of (seed, step) (consecutive slices of per-epoch seeded permutations, so a resumed run
draws the same prompts without saved sampler state), has them answered by the rollout backend on
this rank (its contiguous share of the step's prompts; with a tensor-parallel engine the share of
its group, rspo.rollout.colocate), scored by the task's verifier, and gathered into the padded
batch one process builds (rows in rank order). Validation gives every rank an equal contiguous
share of each held-out set (the last padded with repeats of the first record, whose scores are
dropped), so the ranks decode the same number of batches.

The hf backend decodes with the training model itself, so its forwards run in the compute dtype
(rspo.train.precision); a vLLM engine has its own dtype. After a rollout the trainer tells the
backend to release what it holds (vLLM's sleep mode on GPUs) until the next weight sync.
"""

from __future__ import annotations

import contextlib
import random
import time
from dataclasses import dataclass
from typing import Any

import torch

from rspo.backend_capabilities import capabilities
from rspo.config import TrainConfig
from rspo.distributed import Dist
from rspo.rollout import RolloutBackend, RolloutBatch, Sampling
from rspo.rollout.base import pack_rows, stop_token_ids
from rspo.rollout.colocate import generate_share
from rspo.rollout.fp8 import fp8_weights
from rspo.seeding import derive_seed
from rspo.tasks import Task, generate_and_score, load_records
from rspo.train.precision import Precision


@dataclass(frozen=True)
class RunRecords:
    """The training and held-out records of a run, read and checked before the model loads
    (prompts longer than ``data.max_prompt_tokens`` dropped; ``schedule.val_size`` records of each
    held-out set)."""

    train: list[dict[str, Any]]
    val: dict[str, list[dict[str, Any]]]

    @classmethod
    def load(cls, cfg: TrainConfig, task: Task, tokenizer) -> RunRecords:
        train = load_records(task, cfg.data.train_path)
        val = {name: load_records(task, path) for name, path in cfg.data.val_paths.items()}
        if cfg.schedule.val_size:
            val = {k: v[: cfg.schedule.val_size] for k, v in val.items()}
        limit = cfg.data.max_prompt_tokens
        return cls(
            _drop_long(train, "train", task, tokenizer, limit),
            {k: _drop_long(v, k, task, tokenizer, limit) for k, v in val.items()},
        )


def _drop_long(records: list[dict[str, Any]], name: str, task: Task, tokenizer, limit: int) -> list[dict[str, Any]]:
    """Drop prompts longer than data.max_prompt_tokens (an error if none is left)."""
    prompts = [task.prompt(r) for r in records]
    # a token spans >= 1 character, plus at most a couple of special tokens: only long texts need counting
    long_idx = [i for i, t in enumerate(prompts) if len(t) + 2 > limit]
    lengths = [len(p) for p in prompts]
    if long_idx:
        counted = tokenizer([prompts[i] for i in long_idx])["input_ids"]
        for i, ids in zip(long_idx, counted):
            lengths[i] = len(ids)
    kept = [r for r, n, t in zip(records, lengths, prompts) if n <= limit or len(t) + 2 <= limit]
    if not kept:
        raise ValueError(
            f"every {name} prompt is longer than data.max_prompt_tokens={limit} (shortest: {min(lengths)} tokens)"
        )
    return kept


class Rollouts:
    def __init__(
        self,
        cfg: TrainConfig,
        task: Task,
        tokenizer,
        dist: Dist,
        *,
        records: RunRecords,
        backend: RolloutBackend,
        precision: Precision,
        reward_workers: int,
    ) -> None:
        """``backend`` answers the prompts; ``precision`` is the training model's (the hf backend
        decodes with it); ``reward_workers``: this rank's share of the node's verifier workers."""
        self.cfg, self.task, self.tokenizer, self.dist = cfg, task, tokenizer, dist
        self.backend, self.precision = backend, precision
        self.reward_workers = reward_workers
        self.tp = cfg.rollout.tensor_parallel_size
        # the old values from the rollout's own forwards (rollout.old_values=rollout), its router cache
        # with them; rollout routing replay needs the engine's experts; the hf backend reports them for
        # the routing-agreement metric too (cheap: K bytes per token and MoE layer)
        self.record_old = cfg.rollout.old_values == "rollout"
        self.record_routing = (
            self.record_old
            or cfg.algorithm.routing == "rollout_replay"
            or capabilities(cfg.rollout.backend).routing_for_free
        )
        self.train_records = records.train
        self.val_records = records.val
        self._perm: tuple[int, list[int]] = (-1, [])

    # ------------------------------------------------------------------ the engine, between rollouts

    def release_engine(self) -> None:
        """After a rollout: vLLM's sleep mode on GPUs frees the engine's memory until the sync."""
        self.backend.release()

    def sync_engine(self, model) -> None:
        """After the updates: the engine's weights wake and the training model streams into them."""
        self.backend.sync_weights(model)

    def wake_engine(self) -> None:
        """Before the next rollout: the engine's KV cache wakes."""
        self.backend.wake_kv()

    def _precision(self):
        """The hf backend decodes with the training model: in the compute dtype, or in rollout.dtype
        when one is set (autocast to it: the engine's precision, unlike the trainer's; fp8: an
        FP8 W8A8 engine while it decodes, rspo.rollout.fp8)."""
        if not capabilities(self.cfg.rollout.backend).in_trainer:
            return contextlib.nullcontext()
        dtype = self.cfg.rollout.dtype
        if not dtype or dtype == self.cfg.model.dtype:
            return self.precision.autocast()
        if dtype == "float32":
            return contextlib.nullcontext()
        if dtype == "fp8":  # FP8 weights and inputs, bf16 arithmetic (rspo.rollout.fp8)
            if self.dist.enabled:
                raise ValueError("rollout.dtype=fp8 rounds one process's weights; under torchrun they are FSDP shards")
            stack = contextlib.ExitStack()
            stack.enter_context(fp8_weights(self.backend.model))
            stack.enter_context(torch.autocast(self.precision.device_type, dtype=torch.bfloat16))
            return stack
        return torch.autocast(self.precision.device_type, dtype=getattr(torch, dtype))

    # ------------------------------------------------------------------ the step's prompts

    def _epoch_order(self, epoch: int) -> list[int]:
        """Seeded permutation of the training prompts for one pass (cached: it is O(n))."""
        if self._perm[0] != epoch:
            n = len(self.train_records)
            self._perm = (epoch, random.Random(derive_seed(self.cfg.seed, 7, epoch)).sample(range(n), n))
        return self._perm[1]

    def sample_prompts(self, step: int) -> list[dict[str, Any]]:
        """The records of a step, a pure function of (seed, step)."""
        n = len(self.train_records)
        k = self.cfg.schedule.prompts_per_step
        out = []
        for j in range(k):
            epoch, pos = divmod(step * k + j, n)
            out.append(self.train_records[self._epoch_order(epoch)[pos]])
        return out

    # ------------------------------------------------------------------ rollout

    def rollout(self, step: int, device: torch.device) -> tuple[RolloutBatch, torch.Tensor, float]:
        """This rank's share of the step's prompts, G responses each, scored; every rank's rows
        gathered into the batch one process builds. -> (batch, rewards (B,), generation seconds)"""
        cfg = self.cfg
        G = cfg.rollout.group_size
        records = self.sample_prompts(step)
        lo, hi = self.dist.shard_bounds(len(records))  # this rank's prompts
        t0 = time.perf_counter()
        sampling = Sampling(
            temperature=cfg.rollout.temperature,
            top_p=cfg.rollout.top_p,
            max_new_tokens=cfg.rollout.max_new_tokens,
            seed=derive_seed(cfg.seed, step, 1),
        )
        prompts = [self.task.prompt(r) for r in records]
        with self._precision():  # this rank's rows; a tensor-parallel group's prompts go to its engine together
            local = generate_share(
                self.backend,
                prompts,
                G,
                self.dist,
                self.tp,
                sampling,
                record_routing=self.record_routing,
                record_old=self.record_old,
            )
        t_gen = time.perf_counter() - t0
        per_response = [r for r in records[lo:hi] for _ in range(G)]
        local_scored = self.task.score_batch(local.responses, per_response, self.reward_workers)
        batch, scored = self._gather(local, local_scored, device)
        return batch, torch.tensor([s for s, _ in scored], dtype=torch.float32), t_gen

    def _gather(
        self, local: RolloutBatch, local_scored: list[tuple[float, str]], device: torch.device
    ) -> tuple[RolloutBatch, list[tuple[float, str]]]:
        """All ranks' rollout rows (in rank order) packed into the layout one process builds."""
        if not self.dist.enabled:
            return local, local_scored
        prompts, responses = local.token_rows()
        logp, routing = local.row_extras()  # the engine's log-probs and experts, if it reported them
        parts = self.dist.all_gather_object((prompts, responses, local.responses, local_scored, logp, routing))
        batch = pack_rows(
            [p for part in parts for p in part[0]],
            [r for part in parts for r in part[1]],
            self.tokenizer,
            texts=[t for part in parts for t in part[2]],
            device=device,
            logp_rows=None if logp is None else [x for part in parts for x in part[4]],
            routing_rows=None if routing is None else [x for part in parts for x in part[5]],
        )
        return batch, [x for part in parts for x in part[3]]

    def special_stop_frac(self, batch: RolloutBatch) -> float:
        """Share of responses ended by a special token other than EOS (pad, bos, unk, ...): the
        rollout stops there, since the decoded text the verifier sees skips special tokens."""
        eos = self.tokenizer.eos_token_id
        eos = set(eos if isinstance(eos, list) else [eos])
        special = torch.tensor([i for i in stop_token_ids(self.tokenizer) if i not in eos] or [-1])
        lengths = batch.response_mask.sum(1).long()  # (B,)
        last = batch.response_ids.gather(1, (lengths - 1).clamp(min=0)[:, None]).squeeze(1).cpu()  # (B,)
        return float(torch.isin(last, special).float().mean())

    # ------------------------------------------------------------------ validation

    @torch.no_grad()
    def validate(self, step: int) -> dict[str, float]:
        """Held-out score of every validation set (``val/<name>/score``)."""
        out = {}
        W = self.dist.world_size
        rc = self.cfg.rollout
        sampling = Sampling(
            rc.val_temperature, max_new_tokens=rc.max_new_tokens, seed=derive_seed(self.cfg.seed, step, 3)
        )
        for name, records in self.val_records.items():
            per = -(-len(records) // W)
            lo = self.dist.rank * per
            padded = records + [records[0]] * (W * per - len(records))
            mine = padded[lo : lo + per]
            if self.tp > 1:  # the group's records together, each rank keeps its own (rspo.rollout.colocate)
                prompts = [self.task.prompt(r) for r in padded]
                batch = generate_share(self.backend, prompts, 1, self.dist, self.tp, sampling)
                scored = self.task.score_batch(batch.responses, mine, self.reward_workers)
            else:
                with self._precision():
                    scored = generate_and_score(
                        self.backend, self.task, mine, sampling, workers=self.reward_workers, row_offset=lo
                    )
            scored = [x for part in self.dist.all_gather_object(scored) for x in part][: len(records)]
            out[f"val/{name}/score"] = sum(s for s, _ in scored) / len(scored)
        return out
