"""The RLVR training loop: rollouts -> rewards -> advantages -> old pass -> off-policy mini-batch updates.

One run = one resolved ``TrainConfig`` = one run folder = one MLflow run. Per rollout step:

1. Sample ``prompts_per_step`` prompts (seeded by (seed, step)); generate G responses each.
2. Score them with the task's verifier; group-normalised advantages (rspo.losses.group_advantages).
3. Old pass: a no-grad forward of the TRAINING model over prompt+response that yields the old
   log-probs, the compact old-router cache (top-K indices + fp16 old router log-probs; plus the
   full fp32 logits only under logit replay) and the entropy, in one pass. The ratio's old policy is
   the trainer's (paper Sec. 3.2); the engine's log-probs serve the mismatch metrics and the optional
   rollout correction (docs/mismatch.md).
4. Split the step's prompts into mini-batches of ``mini_batch_prompts`` (groups stay together;
   order seeded by (seed, step, epoch)); for each: forward under the routing mode with router
   capture, gamma from the cache, ``compute_policy_loss``, backward (micro-batches accumulate),
   clip the grad norm, optimiser step (the loop: rspo.train.update.update_step). The first
   mini-batch of a step is on-policy (theta == theta_old, gamma == 1, every ratio 1); the later ones
   are off-policy, which is where RS acts.
5. Validation, checkpoint, logging.

The old pass runs on exactly the same micro-batches (rows and order) as the first epoch's
updates, so on the on-policy mini-batch the update forward reproduces the old forward bit for bit.

Router diagnostics (``router/shift_ratio_mean``, ``router/shift_clipfrac``) are computed for EVERY
run from the current router's own logits, whether RS is on or not and under every routing mode.

Data parallel (torchrun, ``rspo.distributed``): every rank holds an FSDP2-sharded copy of the model
and the full step batch. Rank r generates and scores its contiguous share of the step's prompts
(rows are seeded per global row, so the rollout equals the single-process one), the token rows and
scores are all-gathered into the same padded batch a single process would build, each mini-batch is
split into equal contiguous row shares, every rank runs the old pass and the updates on its share,
and FSDP2 averages the gradients (each micro-batch loss scaled by its share of the global mini-batch
x world size: the single-process gradient). Old log-probs, the router cache and the per-micro-batch
metrics are gathered: every rank logs the same numbers, rank 0 writes them. Checkpoints are sharded
and resharded on reading (rspo.train.checkpoint). prompts_per_step and a mini-batch's rows must
divide by the world size (equal to one process when the micro-batch size divides a rank's rows).

Deviations / choices the paper leaves open:
- Learning-rate schedule: linear warmup then constant (verl's default); the paper gives no lr.
  ``optim.router_lr_mult`` (default 1) gives the router weights their own learning rate: only the
  small study's stress regime uses it (router drift as the controlled variable; not in the paper).
- Metrics are averaged over the step's mini-batches (verl logs the same way).
- Mini-batch order is a seeded permutation of prompt groups (verl shuffles too).
- Log-probs (old pass and updates) are scored under softmax(logits / temperature), the
  distribution the rollout sampled (as verl does); top-p sampling is refused for training.
- Modes: rollouts and the old pass run in eval mode, the updates in train mode.
- A response ends at its first special token (EOS, pad, bos, unk, ...): the decoded text the
  verifier sees skips special tokens, so the trained tokens and the graded text stay the same;
  ``response/special_stop_frac`` counts the responses that ended on one other than EOS.

Implementation choices that change no result (up to float rounding):
- The old pass and the updates forward each prompt once per group of responses and trim the
  padding columns (``rspo.train.forward``).
- The first, on-policy mini-batch of a step records its own old log-probs, entropy and router
  cache in its update forward instead of a separate no-grad pass (one process, routing none or
  freeze, no dropout; ``onpolicy_shortcut``), so gamma is 1 and every ratio 1 there by construction.
"""

from __future__ import annotations

import logging
import random
import signal
import time
from pathlib import Path
from typing import Any

import torch

from rspo.config import TrainConfig, check_world_size
from rspo.distributed import (
    Dist,
    init_distributed,
    rank_device,
)
from rspo.losses import group_advantages, masked_mean, mismatch_metrics
from rspo.models import load_tokenizer_checked, read_meta, resolve_device, set_threads
from rspo.phase_memory import PhaseMemory, measure_for
from rspo.rollout import RolloutBatch, make_backend
from rspo.rollout.colocate import check_tensor_parallel
from rspo.router import OldRouterCache, RoutingMode, router_spec, routing_agreement
from rspo.seeding import derive_seed
from rspo.tasks import Task, task_for
from rspo.train import checkpoint
from rspo.train.collapse import CollapseDetector
from rspo.train.forward import ForwardSettings, Rows, policy_forward
from rspo.train.group_stats import group_stats, response_entropy
from rspo.train.memory import (
    HostBuffers,
    RowCache,
    enable_activation_checkpointing,
    pack_micro_batches,
    row_tokens,
)
from rspo.train.optim import build_optimizer
from rspo.train.precision import Precision, load_and_shard
from rspo.train.rollouts import Rollouts
from rspo.train.run_folder import RunFolder, RunFolderMismatch
from rspo.train.time_limit import TimeLimit
from rspo.train.update import StepTensors, TooManyNonFinite, update_step

__all__ = ["RunFolderMismatch", "TooManyNonFinite", "Trainer"]

log = logging.getLogger(__name__)


def _stochastic(model: torch.nn.Module) -> bool:
    """Whether a forward in train mode can differ from eval mode (dropout, router jitter)."""
    c = model.config
    if any(
        float(getattr(c, k, 0.0) or 0.0) > 0
        for k in ("attention_dropout", "hidden_dropout", "dropout", "router_jitter_noise", "resid_pdrop", "embd_pdrop")
    ):
        return True
    return any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())


class Trainer:
    def __init__(
        self,
        cfg: TrainConfig,
        out_dir: str | Path,
        *,
        tracker_factory=None,
        task: Task | None = None,
        quiet: bool = False,
        dist: Dist | None = None,
        random_weights: bool = False,
        backend_factory=None,
        memory: PhaseMemory | None = None,
        memory_plan=None,
        job_limit: tuple[float, float] | None = None,
    ) -> None:
        """``dist``, ``random_weights``, ``backend_factory`` and ``memory`` are for measuring and
        simulating the step (rspo.gpu_memory.preflight, .simulate): a given process group view, the
        model built from its config.json with random weights instead of read, another rollout
        backend (``backend_factory(trainer)``), another way to measure each phase's memory.
        ``memory_plan(cfg, dist, gpu_bytes) -> {phase: GiB} | None``: the plan the first step's
        memory is printed beside on a GPU (the train command passes rspo.gpu_memory.plan's
        ``planned_phases``; the planner sits above the trainer). ``job_limit`` = (limit_s, margin_s):
        stop cleanly ``margin_s`` before the job's limit, counted from the job's start, or when
        SIGUSR1 arrives (rspo.train.time_limit; the train command passes its flags); none without."""
        self.cfg = cfg
        self.memory_plan = memory_plan
        self.quiet = quiet  # no progress lines (rspo.progress) when True
        self.folder = RunFolder(out_dir, cfg.fingerprint())
        self.out = self.folder.out
        set_threads(cfg.model.threads)
        device = resolve_device(cfg.model.device)
        self.dist: Dist = dist or init_distributed(device, cfg.model.collective_timeout_min, cfg.model.cpu_offload)
        if self.dist.enabled:
            check_world_size(cfg, self.dist.world_size)
        self.reward_workers = self.dist.node_share(cfg.data.reward_workers)  # a per-node budget
        self.tp = cfg.rollout.tensor_parallel_size  # ranks sharing one engine (rspo.rollout.colocate)
        check_tensor_parallel(self.tp, self.dist, cfg.rollout.backend)
        self.device = rank_device(device, self.dist)
        self.memory = memory or measure_for(self.device)
        meta = read_meta(cfg.model.path) if Path(cfg.model.path).is_dir() else {}
        self.tokenizer = load_tokenizer_checked(cfg.model.path, meta.get("tokenizer_fingerprint"))
        self.task: Task = task or task_for(cfg.data, self.tokenizer)  # math/code: the prompt format
        # prompts, rollouts and validation (the records are read and checked before the model loads)
        self.rollouts = Rollouts(cfg, self.task, self.tokenizer, self.dist, self.reward_workers)
        # fp32 master weights, forwards in model.dtype; under torchrun read on the CPU, then upcast and
        # sharded layer by layer (each shard on its GPU): rspo.train.precision
        self.precision = Precision.of(cfg.model.dtype, self.device, self.dist)
        self.model = load_and_shard(
            cfg.model.path,
            self.precision,
            self.dist,
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
        # The first mini-batch of a step is on-policy: its update forward IS the old forward, so it
        # records the old values itself instead of a separate no-grad pass. Only where that forward
        # equals the old pass exactly: one process (the old pass's cross-rank reduction is not
        # repeated for those rows), routing none/freeze (replay modes need the cache before the
        # forward), and a model without stochastic layers (train mode == eval mode).
        self.onpolicy_shortcut = (
            not self.dist.enabled
            and self.routing in (RoutingMode.NONE, RoutingMode.FREEZE)
            and not _stochastic(self.model)
        )
        self.model.eval()
        self.optimizer, self.scheduler = build_optimizer(self.model, cfg.optim, sharded=self.dist.enabled)
        self.memory.start(self.model, self.optimizer)
        self.collapse = CollapseDetector(
            cfg.tracking.collapse_window,
            cfg.tracking.collapse_drop,
            cfg.tracking.collapse_kl_spike,
            cfg.tracking.collapse_sustain,
        )
        self.step = 0
        self.nonfinite_in_row = 0
        self.tracker = None
        self.tracker_factory = tracker_factory
        self.metrics_path = self.folder.metrics_path
        self._row_tokens = torch.zeros(0, dtype=torch.long)  # tokens of each row of the step's batch
        self._host_buffers = HostBuffers(pin=self.device.type == "cuda")  # the router cache's, pinned once
        self._last_logged: dict[str, float] = {}
        self.last_batch: RolloutBatch | None = None  # the last step's rollout (benchmarks read it)
        self.time_limit = TimeLimit.for_job(self.dist, *job_limit) if job_limit else TimeLimit(self.dist)
        if job_limit:
            self.time_limit.watch(signal.SIGUSR1)
        # A resumed run loads its checkpoint before the engine exists: DCP's load allocates the
        # optimizer state through a zero-gradient step (parameters, gradients and Adam's moments at
        # once), which must not meet an awake engine (rspo.gpu_memory.plan, phase resume).
        self.resumed_run_id = self._restore()
        with self.memory.phase("engine_start"):
            self.backend = backend_factory(self) if backend_factory else self._make_backend()
        self.rollouts.backend, self.rollouts.precision = self.backend, self.precision

    def _make_backend(self):
        """The preset's rollout backend, built from the training model's current weights (a resumed
        run's: the checkpoint is loaded first)."""
        cfg = self.cfg
        # under FSDP every decoding forward is a collective: ranks stop together
        all_done = (lambda local: not self.dist.any(not local)) if self.dist.enabled else None
        return make_backend(
            cfg.rollout.backend,
            self.model,
            self.tokenizer,
            model_path=cfg.model.path,
            gpu_memory_utilization=cfg.rollout.vllm_gpu_memory_utilization,
            tensor_parallel_size=self.tp,
            sleep=cfg.rollout.vllm_sleep,
            enforce_eager=cfg.rollout.vllm_enforce_eager,
            return_routing=cfg.algorithm.routing == "rollout_replay",
            dtype=cfg.rollout.dtype or cfg.model.dtype,
            seed=cfg.seed,
            all_done=all_done,
        )

    def _prepare_model(self, model: torch.nn.Module) -> None:
        """Before sharding: activation checkpointing (rspo.train.memory), no KV cache in training forwards."""
        if self.cfg.model.gradient_checkpointing:
            enable_activation_checkpointing(model)
        model.config.use_cache = False

    # ------------------------------------------------------------------ run folder and resume

    def _restore(self) -> str | None:
        """Check the folder belongs to this config; restore the last checkpoint. -> MLflow run id."""
        self.folder.check_owner()
        if self.dist.is_main:
            for p in self.folder.remove_unfinished_saves():
                log.warning("removed %s, the unfinished save of a job that was killed while saving", p)
        ckpt = self.folder.latest_checkpoint()
        run_id = None
        if ckpt is not None:
            with self.memory.phase("resume"):
                run_id = self.load_checkpoint(ckpt)
        elif self.dist.is_main:
            self.folder.reset_metrics()
        self.dist.barrier()  # no rank reads the folder while rank 0 rewrites it
        return run_id

    def save_checkpoint(self) -> None:
        """Sharded model and optimizer state, written by every rank in parallel (rspo.train.checkpoint)."""
        state = {
            "step": self.step,
            "scheduler": self.scheduler.state_dict(),
            "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
            "collapse": self.collapse.state_dict(),
            "nonfinite_in_row": self.nonfinite_in_row,
            "mlflow_run_id": self.tracker.run_id if self.tracker else None,
        }
        t0 = time.perf_counter()
        with self.memory.phase("checkpoint_save"):
            checkpoint.save(self.folder.step_dir(self.step), self.model, self.optimizer, state, self.dist)
        self.time_limit.record_save(time.perf_counter() - t0)
        if self.dist.is_main:  # the older ones only once the new one is complete
            self.folder.prune_checkpoints(self.cfg.schedule.keep_checkpoints)
        self.dist.barrier()

    def load_checkpoint(self, ckpt: Path) -> str | None:
        """Every rank reads its own shards (any world size resumes any other's checkpoint)."""
        state = checkpoint.load(ckpt, self.model, self.optimizer, self.dist)
        self.scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        self.collapse.load_state_dict(state["collapse"])
        self.nonfinite_in_row = state["nonfinite_in_row"]
        self.step = int(state["step"])
        if self.dist.is_main:  # metric lines written after this checkpoint belong to work that is redone now
            self.folder.truncate_metrics(self.step)
        self.optimizer.zero_grad(set_to_none=True)  # nothing of the load's zero-gradient step stays
        return state.get("mlflow_run_id")

    # ------------------------------------------------------------------ one step

    def local_rows(self, mb: torch.Tensor) -> torch.Tensor:
        """This rank's contiguous share of a mini-batch's rows (all of them in one process)."""
        lo, hi = self.dist.shard_bounds(len(mb))
        return mb[lo:hi]

    def _split(self, rows: torch.Tensor) -> list[torch.Tensor]:
        sc = self.cfg.schedule
        if sc.max_tokens_per_micro_batch:  # token-bounded (rspo.train.memory)
            return pack_micro_batches(rows, self._row_tokens, sc.max_tokens_per_micro_batch, sc.micro_batch_size)
        size = sc.micro_batch_size or len(rows)
        return [rows[i : i + size] for i in range(0, len(rows), size)]

    def micro_batches(self, mb: torch.Tensor) -> list[torch.Tensor | None]:
        """This rank's micro-batches of mini-batch ``mb`` (its contiguous share of the rows, in
        micro_batch_size rows or packed under the token budget). Under torchrun with a token budget
        the ranks' counts differ: padded with None (an empty forward) to the largest count."""
        mine: list[torch.Tensor | None] = list(self._split(self.local_rows(mb)))
        if self.dist.enabled and self.cfg.schedule.max_tokens_per_micro_batch:
            per = len(mb) // self.dist.world_size  # every rank holds the whole batch: no collective needed
            most = max(len(self._split(mb[r * per : (r + 1) * per])) for r in range(self.dist.world_size))
            mine += [None] * (most - len(mine))
        return mine

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
            ForwardSettings(
                temperature=self.cfg.rollout.temperature,
                share_prompts=not self.cfg.model.gradient_checkpointing,
                autocast=self.precision.autocast,
                logits_chunk=self.cfg.model.logits_chunk_tokens,
            ),
            with_entropy=with_entropy,
            capture=capture,
            routing=self.routing if update or replay_old else RoutingMode.NONE,
        )

    def _new_cache(self, batch: RolloutBatch, mbs: list[torch.Tensor]) -> RowCache | None:
        """The old-router cache of the rows this rank reads, on the CPU (rspo.train.memory.RowCache):
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

    @torch.no_grad()
    def _old_pass(self, batch: RolloutBatch, order: list[torch.Tensor], mbs: list[torch.Tensor]):
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
            for rows in self.micro_batches(mb):
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

    def _engine_routing(self, batch: RolloutBatch) -> OldRouterCache:
        """The experts the rollout engine routed each position to, as an old-router cache (R3)."""
        if batch.routed_experts is None:
            raise ValueError(
                "algorithm.routing=rollout_replay: the rollout backend reported no routing (the hf backend "
                "records it; vLLM's needs a GPU and enable_return_routed_experts)"
            )
        idx = batch.routed_experts.to(dtype=torch.uint8 if self.spec.num_experts <= 256 else torch.int16)
        return OldRouterCache(
            indices=idx, logp=torch.zeros(idx.shape, dtype=torch.float16), num_experts=self.spec.num_experts
        )

    def _mismatch(self, st: StepTensors) -> dict[str, float]:
        """The train-inference mismatch of the step (rspo.losses.mismatch_metrics) and, when the engine
        reported its routing, the share of (position, MoE layer) whose experts the old pass chose too."""
        batch, old_logp, cache = st.batch, st.old_logp, st.cache
        if batch.engine_logp is None:
            return {}
        mask = batch.response_mask.bool()
        out = mismatch_metrics(old_logp, batch.engine_logp.to(old_logp.device), mask)
        if batch.routed_experts is not None and cache is not None:
            rows = (cache.slot >= 0).nonzero().squeeze(1)  # the rows this rank's cache holds
            attn = batch.attention_mask.cpu()[rows].bool()
            last = attn.long().cumsum(1) == attn.sum(1, keepdim=True)  # each row's last token: never forwarded
            agree, total = routing_agreement(batch.routed_experts[:, rows], cache[rows].indices, attn & ~last)
            if self.dist.enabled and not (self.cfg.schedule.ppo_epochs > 1):  # each rank holds its own rows
                counts = torch.tensor([agree, total], dtype=torch.float64)
                self.dist.all_reduce_sum_(counts)
                agree, total = float(counts[0]), float(counts[1])
            out["rollout_corr/routing_agreement"] = agree / max(total, 1)
        return out

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

    def mini_batches(self, step: int, epoch: int, G: int, n_prompts: int) -> list[torch.Tensor]:
        order = random.Random(derive_seed(self.cfg.seed, step, 11, epoch)).sample(range(n_prompts), n_prompts)
        per = self.cfg.schedule.mini_batch_prompts
        mbs = []
        for i in range(0, n_prompts, per):
            prompts = torch.tensor(order[i : i + per])
            mbs.append((prompts[:, None] * G + torch.arange(G)[None, :]).reshape(-1))  # rows of those groups
        return mbs

    def train_step(self) -> dict[str, float]:
        """One rollout step, its phases in order (rspo.phase_memory): rollout and rewards (then the
        engine's release), advantages and the old pass, the updates with their optimizer steps, the engine's
        weights synced, its KV cache woken."""
        cfg, step, mem = self.cfg, self.step, self.memory
        G = cfg.rollout.group_size
        t0 = time.perf_counter()
        with mem.phase("rollout"):
            batch, rewards, t_gen = self.rollouts.rollout(step, self.device)
        self.backend.release()  # vLLM sleep mode on GPUs: the engine's memory is free until the sync
        adv = group_advantages(rewards, G).to(self.device)
        t2 = time.perf_counter()
        n_prompts = cfg.schedule.prompts_per_step
        mbs0 = self.mini_batches(step, 0, G, n_prompts)
        # the on-policy first mini-batch records its own old values in its update (rspo.train.update)
        self._row_tokens = row_tokens(batch.attention_mask.cpu(), batch.response_mask.cpu(), batch.prompt_width)
        with mem.phase("old_pass"):
            old_logp, entropy, cache = self._old_pass(batch, mbs0[1:] if self.onpolicy_shortcut else mbs0, mbs0)
        t3 = time.perf_counter()
        st = StepTensors(batch, adv, old_logp, entropy, cache)
        metrics, first_mb, skipped = update_step(self, st, mbs0, n_prompts)
        t4 = time.perf_counter()
        with mem.phase("sync"):  # the engine's weights wake, the training model streams into them
            self.backend.sync_weights(self.model)
        with mem.phase("kv_wake"):
            self.backend.wake_kv()
        t5 = time.perf_counter()
        self.last_batch = batch
        mask = batch.response_mask
        n_tokens = float(mask.sum())
        upd_s = max(t4 - t3, 1e-9)
        metrics.update(
            {
                "critic/score/mean": float(rewards.mean()),
                "critic/score/max": float(rewards.max()),
                "critic/score/min": float(rewards.min()),
                **group_stats(rewards, batch.response_ids, mask, G),
                "actor/entropy": float(masked_mean(entropy, mask.bool())),
                "actor/response_entropy": response_entropy(entropy, mask),
                "response_length/mean": float(mask.sum(1).mean()),
                "response/special_stop_frac": self.rollouts.special_stop_frac(batch),
                "actor/skipped_updates": float(skipped),
                "actor/lr": float(self.scheduler.get_last_lr()[0]),
                "perf/rollout_s": t_gen,
                "perf/reward_s": t2 - t0 - t_gen,
                "perf/old_pass_s": t3 - t2,
                "perf/update_s": t4 - t3,
                "perf/sync_s": t5 - t4,  # weights into the rollout engine (vllm; ~0 for hf)
                "perf/step_s": t4 - t0,
                "perf/rollout_tokens_per_s": n_tokens / max(t_gen, 1e-9),
                "perf/tokens_per_s": n_tokens * cfg.schedule.ppo_epochs / upd_s,
                # every non-padding token the updates process (prompt + response), as a training loop counts
                "perf/update_tokens_per_s": float(batch.attention_mask.sum()) * cfg.schedule.ppo_epochs / upd_s,
            }
        )
        metrics.update(self._mismatch(st))
        if cache is not None:
            metrics["router/cache_bytes"] = float(cache.nbytes)
            metrics["router/cache_bytes_per_entry"] = float(cache.bytes_per_entry)
        if first_mb:
            metrics["router/onpolicy_shift_ratio_mean"] = first_mb.get("router/shift_ratio_mean", float("nan"))
            metrics["actor/onpolicy_ppo_kl"] = first_mb.get("actor/ppo_kl", float("nan"))
        first = mem.first is None
        metrics.update(mem.step_metrics())
        if first and mem.first:
            self._report_memory()
        return metrics

    def _report_memory(self) -> None:
        """The first step's memory per phase, beside the plan's totals on a GPU (rank 0 prints; a
        warning names each phase measured over its plan by more than 5%)."""
        planned = None
        if self.device.type == "cuda" and self.memory_plan is not None:
            gpu_bytes = torch.cuda.get_device_properties(self.device).total_memory
            planned = self.memory_plan(self.cfg, self.dist, gpu_bytes)
        if self.dist.is_main and not self.quiet:
            print(f"[train {self.cfg.run_name}] memory of the first step per phase (GiB):", flush=True)
            print(self.memory.table(self.memory.first, planned), flush=True)
        for line in self.memory.over_plan(self.memory.first, planned or {}):
            log.warning("[train %s] memory over plan: %s", self.cfg.run_name, line)

    # ------------------------------------------------------------------ validation

    def validate(self) -> dict[str, float]:
        """Held-out score of every validation set at the current step (rspo.train.rollouts)."""
        return self.rollouts.validate(self.step)

    # ------------------------------------------------------------------ main loop

    def save_final(self, meta: dict[str, Any]) -> None:
        """The final HF checkpoint in the preset's dtype, streamed layer by layer (rspo.train.checkpoint)."""
        dtype = getattr(torch, self.cfg.model.dtype)
        checkpoint.write_hf_checkpoint(
            self.model, self.tokenizer, self.out / "final", dtype=dtype, meta=meta, dist=self.dist
        )

    def run(self) -> dict[str, Any]:
        """The whole run: steps, validation, logging, checkpoints, the final checkpoint (rspo.train.run_loop)."""
        from rspo.train.run_loop import run

        return run(self)
