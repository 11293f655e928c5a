"""The trained policy of an RL run: the model, its optimizer and schedule, its precision, its
process group and how it runs forwards over a step's rows.

``Policy`` owns everything the trainer's updates touch: the model (fp32 master weights sharded
under torchrun, forwards in the compute dtype: rspo.train.precision), the optimizer and its
learning-rate schedule, the routing mode of update forwards, the micro-batching of a step's rows
(rspo.train.micro_batches) and the count of updates skipped in a row for non-finite values. A step
reads it twice: ``old_pass(batch, adv, step)`` -> ``StepTensors`` (the old log-probs, entropy,
router cache and row token counts of the step's rows, on the very micro-batches the updates use),
then rspo.train.update.update_step(policy, tensors, step), the loop a reader compares with the
paper, which changes the policy only through its methods (``zero_grad``, ``clip_gradients``,
``apply_update``, ``skip_update``): the optimizer, the schedule and the non-finite streak are the
policy's own.
``save``/``load`` write and read its part of a checkpoint (rspo.train.checkpoint); ``save_final``
the Hugging Face checkpoint.

The memory simulation and the preflight build a Policy themselves (a given process
group view, random weights, another way to measure memory) and hand it to the trainer.

Deviation, opt-in (``rollout.old_values=rollout``, default ``recompute`` as in the paper, verl and
TRL): the old log-probs, entropy and router cache are the ones the hf backend recorded while it
sampled (the same model in the same precision), not a second no-grad forward. Equal to the old
pass's up to float rounding from the decoding's KV-cache shapes (docs/performance.md measures it);
the first mini-batch's ratio and router-shift ratio are then ~1 rather than exactly 1. The other
choices are rspo.train.trainer's (module docstring).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rspo.config import TrainConfig
from rspo.distributed import Dist, full_tensor, rank_device
from rspo.models import resolve_device
from rspo.phase_memory import PhaseMemory, measure_for
from rspo.rollout import RolloutBatch
from rspo.router import OldRouterCache, RoutingMode, router_spec
from rspo.seeding import derive_seed
from rspo.train import checkpoint
from rspo.train.forward import ForwardSettings, Rows, policy_forward
from rspo.train.memory import enable_activation_checkpointing
from rspo.train.micro_batches import pack_micro_batches, row_tokens
from rspo.train.optim import build_optimizer
from rspo.train.precision import Precision, load_and_shard
from rspo.train.row_cache import HostBuffers, RowCache

__all__ = ["NonFiniteStreak", "Policy", "StepTensors", "TooManyNonFinite"]


@dataclass
class StepTensors:
    """The tensors of one rollout step that its updates read.

    ``old_logp`` and ``entropy`` are (B, R) over the response columns, ``cache`` the old router cache
    of the rows this rank reads (None when no run setting needs it), ``mini_batches`` the first
    epoch's (the rows the old pass ran on, in its order), ``row_tokens`` each row's tokens (what a
    token budget packs micro-batches by: ``Policy.micro_batches``). The on-policy first mini-batch, when the
    policy skips its old pass, fills its rows of all three in its own update (``update_mini_batch``
    with ``record``)."""

    batch: RolloutBatch
    adv: torch.Tensor
    old_logp: torch.Tensor
    entropy: torch.Tensor
    cache: RowCache | None
    mini_batches: list[torch.Tensor]
    row_tokens: torch.Tensor


class TooManyNonFinite(RuntimeError):
    """``optim.max_nonfinite_in_row`` updates in a row were skipped for non-finite values."""


class NonFiniteStreak:
    """How many updates in a row were skipped for non-finite values (saved in checkpoints)."""

    def __init__(self, limit: int, count: int = 0) -> None:
        self.limit, self.count = limit, count

    def skipped(self, step: int, error: Exception) -> None:
        """One more skipped update; raises TooManyNonFinite at ``optim.max_nonfinite_in_row``."""
        self.count += 1
        if self.count >= self.limit:
            raise TooManyNonFinite(
                f"step {step}: {self.count} updates in a row skipped for non-finite values "
                f"(last: {error}); stopping (optim.max_nonfinite_in_row={self.limit})"
            ) from error

    def reset(self) -> None:
        self.count = 0


def _stochastic(model: torch.nn.Module) -> bool:
    """Whether a forward in train mode can differ from eval mode (dropout, router jitter)."""
    c = model.config
    if any(
        float(getattr(c, k, 0.0) or 0.0) > 0
        for k in ("attention_dropout", "hidden_dropout", "dropout", "router_jitter_noise", "resid_pdrop", "embd_pdrop")
    ):
        return True
    return any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())


class Policy:
    def __init__(
        self,
        cfg: TrainConfig,
        dist: Dist,
        *,
        memory: PhaseMemory | None = None,
        random_weights: bool = False,
    ) -> None:
        """The model read from ``cfg.model.path`` (built from its config.json with random weights
        when ``random_weights``: the memory simulation and the preflight), upcast and sharded layer
        by layer over ``dist``; ``memory`` measures each phase of a step (default: this device's)."""
        self.cfg = cfg
        self.dist = dist
        self.device = rank_device(resolve_device(cfg.model.device), dist)
        self.memory = memory or measure_for(self.device)
        # fp32 master weights, forwards in model.dtype; under torchrun read on the CPU, then upcast and
        # sharded layer by layer (each shard on its GPU): rspo.train.precision
        self.precision = Precision.of(cfg.model.dtype, self.device, dist)
        self.model = load_and_shard(
            cfg.model.path,
            self.precision,
            dist,
            self.device,
            cpu_offload=cfg.model.cpu_offload,
            prepare=self._prepare_model,
            random_weights=random_weights,
        )
        self.spec = router_spec(self.model)
        self.routing = RoutingMode(cfg.algorithm.routing)
        self.use_router_cache = (
            cfg.algorithm.router_shift
            or self.routing in (RoutingMode.LOGIT_REPLAY, RoutingMode.INDEX_REPLAY, RoutingMode.ROLLOUT_REPLAY)
            or cfg.tracking.router_diagnostics
        )
        # rollout.old_values=rollout: the hf backend recorded the old values while it sampled (one
        # process: its rows are this process's rows); no old pass
        self.old_from_rollout = cfg.rollout.old_values == "rollout"
        if self.old_from_rollout and dist.enabled:
            raise ValueError(
                "rl.rollout.old_values=rollout: one process only (under torchrun each rank would need "
                "the rollout's values of the rows gathered from the others)"
            )
        # The first mini-batch of a step is on-policy: its update forward IS the old forward, so it
        # records the old values itself instead of a separate no-grad pass. Only where that forward
        # equals the old pass exactly: one process (the old pass's cross-rank reduction is not
        # repeated for those rows), routing none/freeze (replay modes need the cache before the
        # forward), and a model without stochastic layers (train mode == eval mode); not with the old
        # values from the rollout (every mini-batch reads that one source).
        self.onpolicy_shortcut = (
            not dist.enabled
            and not self.old_from_rollout
            and self.routing in (RoutingMode.NONE, RoutingMode.FREEZE)
            and not _stochastic(self.model)
        )
        self.model.eval()
        self.optimizer, self.scheduler, self.router_lr = build_optimizer(self.model, cfg.optim, sharded=dist.enabled)
        self.memory.start(self.model, self.optimizer)
        self.nonfinite = NonFiniteStreak(cfg.optim.max_nonfinite_in_row)
        self._forward_settings = ForwardSettings(  # every forward's, built once
            temperature=cfg.rollout.temperature,
            share_prompts=not cfg.model.gradient_checkpointing,
            autocast=self.precision.autocast,
            logits_chunk=cfg.model.logits_chunk_tokens,
        )
        self._host_buffers = HostBuffers(pin=self.device.type == "cuda")  # the router cache's, pinned once

    def _prepare_model(self, model: torch.nn.Module) -> None:
        """Before sharding: activation checkpointing (rspo.train.memory), no KV cache in training forwards."""
        if self.cfg.model.gradient_checkpointing:
            enable_activation_checkpointing(model)
        model.config.use_cache = False

    # ------------------------------------------------------------------ rows and micro-batches

    def local_rows(self, mb: torch.Tensor) -> torch.Tensor:
        """This rank's contiguous share of a mini-batch's rows (all of them in one process)."""
        lo, hi = self.dist.shard_bounds(len(mb))
        return mb[lo:hi]

    def _split(self, rows: torch.Tensor, tokens: torch.Tensor) -> list[torch.Tensor]:
        sc = self.cfg.schedule
        if sc.max_tokens_per_micro_batch:  # token-bounded (rspo.train.micro_batches)
            return pack_micro_batches(rows, tokens, sc.max_tokens_per_micro_batch, sc.micro_batch_size)
        size = sc.micro_batch_size or len(rows)
        return [rows[i : i + size] for i in range(0, len(rows), size)]

    def micro_batches(self, mb: torch.Tensor, tokens: torch.Tensor) -> list[torch.Tensor | None]:
        """This rank's micro-batches of mini-batch ``mb`` (its contiguous share of the rows, in
        micro_batch_size rows or packed under the token budget by ``tokens``, each row's count:
        StepTensors.row_tokens). Under torchrun with a token budget the ranks' counts differ: padded
        with None (an empty forward) to the largest count."""
        mine: list[torch.Tensor | None] = list(self._split(self.local_rows(mb), tokens))
        if self.dist.enabled and self.cfg.schedule.max_tokens_per_micro_batch:
            per = len(mb) // self.dist.world_size  # every rank holds the whole batch: no collective needed
            most = max(len(self._split(mb[r * per : (r + 1) * per], tokens)) for r in range(self.dist.world_size))
            mine += [None] * (most - len(mine))
        return mine

    def mini_batches(self, step: int, epoch: int) -> list[torch.Tensor]:
        """The step's mini-batches of one epoch: a seeded order of prompt groups, split in
        ``mini_batch_prompts`` (groups stay together) -> each one's rows."""
        G, n_prompts = self.cfg.rollout.group_size, self.cfg.schedule.prompts_per_step
        order = random.Random(derive_seed(self.cfg.seed, step, 11, epoch)).sample(range(n_prompts), n_prompts)
        per = self.cfg.schedule.mini_batch_prompts
        mbs = []
        for i in range(0, n_prompts, per):
            prompts = torch.tensor(order[i : i + per])
            mbs.append((prompts[:, None] * G + torch.arange(G)[None, :]).reshape(-1))  # rows of those groups
        return mbs

    # ------------------------------------------------------------------ forwards

    def forward(
        self,
        batch: RolloutBatch,
        rows: torch.Tensor,
        *,
        with_entropy: bool,
        capture: bool,
        update: bool,
        cache: OldRouterCache | None = None,
    ):
        """``policy_forward`` of these rows (prompts shared per group, see rspo.train.forward); the
        routing mode applies to update forwards only, but rollout replay (R3), whose experts come
        from the engine (``cache``: its routing), to the old pass too."""
        replay_old = not update and self.routing is RoutingMode.ROLLOUT_REPLAY
        return policy_forward(
            self.model,
            Rows(
                batch.input_ids[rows],
                batch.attention_mask[rows],
                batch.response_mask[rows],
                batch.prompt_width,
                rows // self.cfg.rollout.group_size,
                cache[rows] if cache is not None else None,
            ),
            self._forward_settings,
            with_entropy=with_entropy,
            capture=capture,
            routing=self.routing if update or replay_old else RoutingMode.NONE,
        )

    def _new_cache(self, batch: RolloutBatch, mbs: list[torch.Tensor]) -> RowCache | None:
        """The old-router cache of the rows this rank reads, on the CPU (rspo.train.row_cache.RowCache):
        under torchrun with one epoch its own rows of every mini-batch, else every row."""
        if not self.use_router_cache:
            return None
        B, T = batch.input_ids.shape
        local = self.dist.enabled and self.cfg.schedule.ppo_epochs == 1
        rows = torch.cat([self.local_rows(mb) for mb in mbs]).sort().values if local else torch.arange(B)
        return RowCache.zeros(
            rows,
            B,
            T,
            self.spec.num_moe_layers,
            self.spec.top_k,
            self.spec.num_experts,
            keep_logits=self.routing is RoutingMode.LOGIT_REPLAY,
            buffers=self._host_buffers,
            max_width=self.cfg.data.max_prompt_tokens + self.cfg.rollout.max_new_tokens,
        )

    def record_cache(self, cache: RowCache, rows: torch.Tensor, out, lo: int, hi: int, T: int) -> None:
        """The old router cache of ``rows`` from a forward's detached router logits and experts."""
        part = OldRouterCache.from_logits(
            [lg.detach() for lg in out.router_logits],
            self.spec.top_k,
            (len(rows), hi - lo),
            indices_list=out.router_indices,
            keep_logits=self.routing is RoutingMode.LOGIT_REPLAY,
        )
        cache.assign(rows, part.pad_columns(lo, T))

    def _engine_routing(self, batch: RolloutBatch, with_logp: bool = False) -> OldRouterCache:
        """The experts the rollout engine routed each position to, as an old-router cache (R3); with
        ``with_logp`` their log router probabilities too (``rollout.old_values=rollout``), else zeros."""
        if batch.routed_experts is None or (with_logp and batch.routed_logp is None):
            raise ValueError(
                "algorithm.routing=rollout_replay or rollout.old_values=rollout: the rollout backend reported no "
                "routing (the hf backend records it; vLLM's needs a GPU and enable_return_routed_experts)"
            )
        idx = batch.routed_experts.to(dtype=torch.uint8 if self.spec.num_experts <= 256 else torch.int16)
        logp = batch.routed_logp if with_logp else torch.zeros(idx.shape, dtype=torch.float16)
        return OldRouterCache(indices=idx, logp=logp, num_experts=self.spec.num_experts)

    # ------------------------------------------------------------------ the step

    def old_pass(self, batch: RolloutBatch, adv: torch.Tensor, step: int) -> StepTensors:
        """What the step's updates read: the old log-probs, entropy and router cache of every row,
        on the first epoch's micro-batches (the on-policy first mini-batch records its own in its
        update when ``onpolicy_shortcut``: rspo.train.update)."""
        mbs0 = self.mini_batches(step, 0)
        tokens = row_tokens(batch.attention_mask.cpu(), batch.response_mask.cpu(), batch.prompt_width)
        with self.memory.phase("old_pass"):
            if self.old_from_rollout:
                old_logp, entropy, cache = self._rollout_old_values(batch, mbs0)
            else:
                order = mbs0[1:] if self.onpolicy_shortcut else mbs0
                old_logp, entropy, cache = self._old_pass(batch, order, mbs0, tokens)
        return StepTensors(batch, adv, old_logp, entropy, cache, mbs0, tokens)

    def _rollout_old_values(self, batch: RolloutBatch, mbs: list[torch.Tensor]):
        """The old log-probs, entropy and router cache the hf backend recorded while it sampled
        (``rollout.old_values=rollout``), in the old pass's layout."""
        if batch.engine_logp is None or batch.engine_entropy is None:
            raise ValueError("rl.rollout.old_values=rollout: the rollout recorded no old log-probs or entropy")
        old_logp = batch.engine_logp.to(self.device, torch.float32)
        entropy = batch.engine_entropy.to(self.device, torch.float32)
        cache = self._new_cache(batch, mbs)
        if cache is not None:
            cache.assign(torch.arange(batch.input_ids.shape[0]), self._engine_routing(batch, with_logp=True))
        return old_logp, entropy, cache

    @torch.no_grad()
    def _old_pass(self, batch: RolloutBatch, order: list[torch.Tensor], mbs: list[torch.Tensor], tokens: torch.Tensor):
        """Old log-probs, entropy and router cache on the same micro-batches the updates use.

        Rows of mini-batches not in ``order`` (the on-policy first mini-batch, when the update
        records its own old values) stay zero until its update (rspo.train.update) fills them;
        ``mbs``: all of the step's mini-batches (the rows the cache must hold).
        """
        B, T = batch.input_ids.shape
        P = batch.prompt_width
        R = batch.response_mask.shape[1]
        old_logp = torch.zeros(B, R, device=self.device)
        entropy = torch.zeros(B, R, device=self.device)
        cache = self._new_cache(batch, mbs)
        engine = self._engine_routing(batch) if self.routing is RoutingMode.ROLLOUT_REPLAY else None
        self.model.eval()
        for mb in order:
            for rows in self.micro_batches(mb, tokens):
                if rows is None:  # another rank has more micro-batches: join its collectives
                    with self.forward(batch, self.local_rows(mb)[:1], with_entropy=False, capture=False, update=False):
                        continue
                with self.forward(
                    batch, rows, with_entropy=True, capture=cache is not None, update=False, cache=engine
                ) as (out, (lo, hi)):
                    if cache is not None:
                        self.record_cache(cache, rows, out, lo, hi, T)
                    old_logp[rows, : hi - P] = out.logp
                    entropy[rows, : hi - P] = out.entropy
        if self.dist.enabled:  # each row was computed by one rank and is zero elsewhere: sums are exact
            self.dist.all_reduce_sum_(old_logp)
            self.dist.all_reduce_sum_(entropy)
            if cache is not None and self.cfg.schedule.ppo_epochs > 1:  # with one epoch a rank reads its own rows
                cache.all_reduce(self.dist)
        return old_logp, entropy, cache

    def lr(self) -> float:
        return float(self.scheduler.get_last_lr()[0])

    # ------------------------------------------------------------------ one update's optimizer

    def zero_grad(self) -> None:
        """Drop the gradients (before an update's first backward, after a skipped one, after the step's
        updates: before anything of the engine wakes, rspo.rollout.colocate)."""
        self.optimizer.zero_grad(set_to_none=True)

    def clip_gradients(self) -> torch.Tensor:
        """Clip the accumulated gradients to optim.grad_clip -> their global norm (the same on every rank)."""
        with self.memory.phase("optimizer_step"):
            params = [w for w in self.model.parameters() if w.grad is not None and w.numel()]
            return full_tensor(torch.nn.utils.clip_grad_norm_(params, self.cfg.optim.grad_clip))

    def apply_update(self) -> None:
        """The optimizer's and the schedule's step; a finite update ends the non-finite streak."""
        self.nonfinite.reset()
        with self.memory.phase("optimizer_step"):
            self.optimizer.step()
        self.scheduler.step()

    def skip_update(self, step: int, error: Exception) -> None:
        """An update skipped for non-finite values: its gradients dropped, the streak counted (raises
        TooManyNonFinite at optim.max_nonfinite_in_row)."""
        self.zero_grad()
        self.nonfinite.skipped(step, error)

    # ------------------------------------------------------------------ checkpoints

    def save(self, step_dir: Path, state: dict[str, Any]) -> None:
        """The sharded model and optimizer state and ``state`` (the trainer's) with the schedule's and
        the non-finite streak's, written by every rank in parallel (rspo.train.checkpoint)."""
        state = {**state, "scheduler": self.scheduler.state_dict(), "nonfinite_in_row": self.nonfinite.count}
        with self.memory.phase("checkpoint_save"):
            checkpoint.save(step_dir, self.model, self.optimizer, state, self.dist)

    def load(self, step_dir: Path) -> dict[str, Any]:
        """Every rank reads its own shards (any world size resumes any other's checkpoint) -> the
        checkpoint's state (the trainer reads its own keys from it)."""
        state = checkpoint.load(step_dir, self.model, self.optimizer, self.dist)
        self.scheduler.load_state_dict(state["scheduler"])
        self.nonfinite = NonFiniteStreak(self.cfg.optim.max_nonfinite_in_row, state["nonfinite_in_row"])
        self.optimizer.zero_grad(set_to_none=True)  # nothing of the load's zero-gradient step stays
        return state

    def save_final(self, tokenizer, out: Path, meta: dict[str, Any]) -> None:
        """The final HF checkpoint in the preset's dtype, streamed layer by layer (rspo.train.checkpoint)."""
        dtype = getattr(torch, self.cfg.model.dtype)
        checkpoint.write_hf_checkpoint(self.model, tokenizer, out, dtype=dtype, meta=meta, dist=self.dist)
