"""The RLVR training loop: rollouts -> rewards -> advantages -> old pass -> off-policy mini-batch updates.

One run = one resolved ``TrainConfig`` = one run folder = one MLflow run. ``Trainer`` is the run
loop: it owns the policy (rspo.train.policy: the model, its optimizer and forwards), the rollouts
(rspo.train.rollouts, given the rollout engine when built), the run folder, the MLflow tracker,
the collapse detector and the job's time limit; ``train_step`` is one step, ``run`` the whole run
(validation every ``schedule.val_every`` steps, one metrics row per step, checkpoints every
``schedule.ckpt_every`` steps, the final checkpoint and final.json, a clean stop before the job's
time limit: rspo.train.time_limit). Per rollout step:

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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rspo.config import TrainConfig, check_world_size
from rspo.distributed import Dist, init_distributed
from rspo.losses import group_advantages
from rspo.models import load_tokenizer_checked, read_meta, resolve_device, set_threads
from rspo.progress import Progress, train_progress_metrics
from rspo.rollout import RolloutBackend, make_backend
from rspo.rollout.colocate import check_tensor_parallel
from rspo.tasks import Task, task_for
from rspo.train.collapse import CollapseDetector
from rspo.train.optim import router_lr_mult_at
from rspo.train.policy import Policy, TooManyNonFinite
from rspo.train.rollouts import Rollouts, RunRecords
from rspo.train.run_folder import RunFolder, RunFolderMismatch
from rspo.train.step_metrics import StepTimes, mismatch, onpolicy_metrics, step_metrics
from rspo.train.time_account import TimeAccount
from rspo.train.time_limit import TimeLimit
from rspo.train.update import update_step

__all__ = ["RunFolderMismatch", "TooManyNonFinite", "Trainer", "process_group"]

log = logging.getLogger(__name__)


def process_group(cfg: TrainConfig) -> Dist:
    """This process's view of the run's process group (one process without torchrun), its torch
    threads set first."""
    set_threads(cfg.model.threads)
    return init_distributed(resolve_device(cfg.model.device), cfg.model.collective_timeout_min, cfg.model.cpu_offload)


def default_engine(cfg: TrainConfig, policy: Policy, tokenizer) -> RolloutBackend:
    """The preset's rollout backend, built from the policy's current weights (a resumed run's: the
    checkpoint is loaded first)."""
    dist = policy.dist
    # under FSDP every decoding forward is a collective: ranks stop together
    all_done = (lambda local: not dist.any(not local)) if dist.enabled else None
    return make_backend(
        cfg.rollout.backend,
        policy.model,
        tokenizer,
        model_path=cfg.model.path,
        gpu_memory_utilization=cfg.rollout.vllm_gpu_memory_utilization,
        tensor_parallel_size=cfg.rollout.tensor_parallel_size,
        sleep=cfg.rollout.vllm_sleep,
        enforce_eager=cfg.rollout.vllm_enforce_eager,
        return_routing=cfg.algorithm.routing == "rollout_replay",
        dtype=cfg.rollout.dtype or cfg.model.dtype,
        seed=cfg.seed,
        all_done=all_done,
    )


class Trainer:
    def __init__(
        self,
        cfg: TrainConfig,
        out_dir: str | Path,
        *,
        tracker_factory=None,
        task: Task | None = None,
        quiet: bool = False,
        policy: Policy | None = None,
        engine: Callable[[Policy, Any], RolloutBackend] | None = None,
        memory_plan=None,
        job_limit: tuple[float, float] | None = None,
        started: float | None = None,
    ) -> None:
        """``policy`` and ``engine`` are for measuring and simulating the step
        (rspo.gpu_memory.preflight, .simulate): a Policy built by the caller (a given process group
        view, random weights, another way to measure memory) and the rollout engine as a function
        of the policy and the tokenizer, built after a resumed run's checkpoint is loaded.
        ``memory_plan(cfg, dist, gpu_bytes) -> {phase: GiB} | None``: the plan the first step's
        memory is printed beside on a GPU (the train command passes rspo.gpu_memory.plan's
        ``planned_phases``; the planner sits above the trainer). ``job_limit`` = (limit_s,
        margin_s): stop cleanly ``margin_s`` before the job's limit, counted from the job's start,
        or when SIGUSR1 arrives (rspo.train.time_limit; the train command passes its flags); none
        without. ``started``: the wall-clock second the job's process started (its start-up is
        counted from it: rspo.train.time_account; default: now)."""
        self.account = TimeAccount(started=time.time() if started is None else started)
        self.cfg = cfg
        self.memory_plan = memory_plan
        self.quiet = quiet  # no progress lines (rspo.progress) when True
        self.folder = RunFolder(out_dir, cfg.fingerprint())
        self.dist: Dist = policy.dist if policy is not None else process_group(cfg)
        if self.dist.enabled:  # the batch splits over the ranks (a clear error before anything loads)
            check_world_size(cfg, self.dist.world_size)
        check_tensor_parallel(cfg.rollout.tensor_parallel_size, self.dist, cfg.rollout.backend)
        meta = read_meta(cfg.model.path) if Path(cfg.model.path).is_dir() else {}
        self.tokenizer = load_tokenizer_checked(cfg.model.path, meta.get("tokenizer_fingerprint"))
        self.task: Task = task or task_for(cfg.data, self.tokenizer)  # math/code: the prompt format
        records = RunRecords.load(cfg, self.task, self.tokenizer)  # read and checked before the model loads
        self.policy = policy or Policy(cfg, self.dist)
        self.collapse = CollapseDetector(
            cfg.tracking.collapse_window,
            cfg.tracking.collapse_drop,
            cfg.tracking.collapse_kl_spike,
            cfg.tracking.collapse_sustain,
        )
        self.step = 0
        self.tracker = None
        self.tracker_factory = tracker_factory
        self._last_logged: dict[str, float] = {}
        self.last_batch = None  # the last step's rollout (benchmarks read it)
        self.time_limit = TimeLimit.for_job(self.dist, *job_limit) if job_limit else TimeLimit(self.dist)
        if job_limit:
            self.time_limit.watch(signal.SIGUSR1)
        # A resumed run loads its checkpoint before the engine exists: DCP's load allocates the
        # optimizer state through a zero-gradient step (parameters, gradients and Adam's moments at
        # once), which must not meet an awake engine (rspo.gpu_memory.plan, phase resume).
        self.resumed_run_id = self._restore()
        with self.memory.phase("engine_start"):
            backend = (
                engine(self.policy, self.tokenizer) if engine else default_engine(cfg, self.policy, self.tokenizer)
            )
        self.rollouts = Rollouts(  # the engine's one owner: it generates, sleeps, syncs and wakes through it
            cfg,
            self.task,
            self.tokenizer,
            self.dist,
            records=records,
            backend=backend,
            precision=self.policy.precision,
            reward_workers=self.dist.node_share(cfg.data.reward_workers),  # a per-node budget
        )

    @property
    def model(self) -> torch.nn.Module:
        return self.policy.model

    @property
    def device(self) -> torch.device:
        return self.policy.device

    @property
    def memory(self):
        """The policy's phase memory (rspo.phase_memory)."""
        return self.policy.memory

    @property
    def out(self) -> Path:
        return self.folder.out

    @property
    def backend(self):
        """The rollout engine (owned by ``rollouts``; read here by benchmarks and tests)."""
        return self.rollouts.backend

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
        """The policy's sharded state and the loop's (rspo.train.checkpoint), every rank in parallel."""
        state = {
            "step": self.step,
            "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
            "collapse": self.collapse.state_dict(),
            "mlflow_run_id": self.tracker.run_id if self.tracker else None,
            "time_account": self.account.state(),
        }
        t0 = time.perf_counter()
        self.policy.save(self.folder.step_dir(self.step), state)
        seconds = time.perf_counter() - t0
        self.time_limit.record_save(seconds)
        self.account.add("checkpoint", seconds)
        if self.dist.is_main:  # the older ones only once the new one is complete
            self.folder.write_time_account(self.step, self.account.state())
            self.folder.prune_checkpoints(self.cfg.schedule.keep_checkpoints)
        self.dist.barrier()

    def load_checkpoint(self, ckpt: Path) -> str | None:
        """The policy's state and the loop's from a checkpoint. -> its MLflow run id."""
        state = self.policy.load(ckpt)
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        self.collapse.load_state_dict(state["collapse"])
        # the account written after the save, when there is one for this step (rspo.train.run_folder)
        self.account.restore(self.folder.time_account(int(state["step"])) or state.get("time_account"))
        self.step = int(state["step"])
        if self.dist.is_main:  # metric lines written after this checkpoint belong to work that is redone now
            self.folder.truncate_metrics(self.step)
        return state.get("mlflow_run_id")

    def save_final(self, meta: dict[str, Any]) -> None:
        """The final HF checkpoint in the preset's dtype (rspo.train.checkpoint)."""
        t0 = time.perf_counter()
        self.policy.save_final(self.tokenizer, self.out / "final", meta)
        self.account.add("final_save", time.perf_counter() - t0)

    # ------------------------------------------------------------------ one step

    def train_step(self) -> dict[str, float]:
        """One rollout step, its phases in order (rspo.phase_memory): rollout and rewards (then the
        engine's release), advantages and the old pass, the updates with their optimizer steps, the
        engine's weights synced, its KV cache woken. Then ``step`` counts it."""
        p, mem, G = self.policy, self.memory, self.cfg.rollout.group_size
        t0 = time.perf_counter()
        with mem.phase("rollout"):
            batch, rewards, t_gen = self.rollouts.rollout(self.step, p.device)
        self.rollouts.release_engine()  # vLLM sleep mode on GPUs: the engine's memory is free until the sync
        adv = group_advantages(rewards, G).to(p.device)
        t1 = time.perf_counter()
        st = p.old_pass(batch, adv, self.step)
        t2 = time.perf_counter()
        metrics, first_mb, skipped = update_step(p, st, self.step)
        t3 = time.perf_counter()
        with mem.phase("sync"):  # the engine's weights wake, the training model streams into them
            self.rollouts.sync_engine(p.model)
        with mem.phase("kv_wake"):
            self.rollouts.wake_engine()
        times = StepTimes(t_gen, t1 - t0 - t_gen, t2 - t1, t3 - t2, time.perf_counter() - t3)
        metrics.update(self._step_metrics(st, rewards, times, skipped, first_mb))
        self.last_batch = batch
        self.step += 1
        return metrics

    def _step_metrics(self, st, rewards, times: StepTimes, skipped: int, first_mb: dict) -> dict[str, float]:
        sc = self.cfg.schedule
        out = step_metrics(
            st,
            rewards,
            times,
            group_size=self.cfg.rollout.group_size,
            ppo_epochs=sc.ppo_epochs,
            skipped=skipped,
            lr=self.policy.lr(),
            special_stop_frac=self.rollouts.special_stop_frac(st.batch),
        )
        if self.cfg.optim.router_lr_mult_final is not None:  # a router-lr schedule: the step's multiplier
            out["actor/router_lr_mult"] = router_lr_mult_at(self.cfg.optim, self.step)
        out.update(mismatch(st, self.dist, sc.ppo_epochs))
        out.update(onpolicy_metrics(first_mb))
        first = self.memory.first is None
        out.update(self.memory.step_metrics())
        if first and self.memory.first:
            self._report_memory()
        return out

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

    def validate(self) -> dict[str, float]:
        """Held-out score of every validation set at the current step (rspo.train.rollouts)."""
        t0 = time.perf_counter()
        out = self.rollouts.validate(self.step)
        self.account.add("validation", time.perf_counter() - t0)
        return out

    # ------------------------------------------------------------------ the run

    def run_info(self) -> dict[str, Any]:
        a = self.cfg.algorithm
        return {
            "run_name": self.cfg.run_name,
            "preset": self.cfg.preset,
            "task": self.cfg.data.task,
            "algo": a.algo,
            "router_shift": a.router_shift,
            "gamma_min": a.gamma_min,
            "stop_gradient": a.stop_gradient,
            "routing": a.routing,
            "seed": self.cfg.seed,
            "fingerprint": self.cfg.fingerprint(),
        }

    def log(self, metrics: dict[str, float], step: int) -> None:
        """Every rank holds the same (reduced) metrics; rank 0 writes them."""
        row = {"step": step, **{k: float(v) for k, v in metrics.items()}}
        self._last_logged.update(row)
        if not self.dist.is_main:
            return
        self.folder.append_metrics(row)
        if self.tracker is not None:
            self.tracker.log_metrics(metrics, step)

    def _start_tracking(self, info: dict[str, Any]) -> None:
        """The run's MLflow run (the resumed one's id when a checkpoint holds it), rank 0 only."""
        if self.tracker_factory is None or not self.dist.is_main:
            return
        self.tracker = self.tracker_factory(
            run_id=self.resumed_run_id,
            run_name=self.cfg.run_name,
            params=self.cfg.flat_params(),
            tags={
                **{k: str(v) for k, v in info.items() if k != "fingerprint"},
                "rspo.fingerprint": info["fingerprint"],
            },
        )

    def _stop_for_time_limit(self, info: dict[str, Any], progress: Progress) -> dict[str, Any]:
        """Save (unless this step's checkpoint exists) and return before the job's time limit."""
        saved = self.folder.latest_checkpoint()
        if saved is None or saved != self.folder.step_dir(self.step):
            self.save_checkpoint()
        progress.write(
            f"[train {self.cfg.run_name}] stopped at step {self.step} before the job's time limit; resubmit to resume"
        )
        progress.close()
        account = self._record_time()
        if self.tracker:
            self.tracker.set_tag("stopped", "time limit")
            self.tracker.set_tag("stopped_at_step", self.step)
            self.tracker.end("KILLED")
        if self.dist.is_main:  # the next job counts this one up to here, its last save included
            self.folder.write_time_account(self.step, self.account.state())
        # no rank exits before rank 0 has ended its MLflow run: under torchrun the first rank out with
        # exit 75 makes the agent SIGTERM the others, which left the run RUNNING when rank 0 was still
        # inside the tracker's end
        self.dist.barrier()
        return {**info, "stopped": "time limit", "steps": self.step, "time_account": account}

    def run(self) -> dict[str, Any]:
        """The whole run: steps, validation, logging, checkpoints, the final checkpoint and final.json."""
        cfg, sc, main = self.cfg, self.cfg.schedule, self.dist.is_main
        info = self.run_info()
        self._start_tracking(info)
        info["mlflow_run_id"] = self.tracker.run_id if self.tracker else None
        if self.dist.enabled:
            info["world_size"] = self.dist.world_size
        if main:
            self.folder.write_identity({**info, "collapsed": self.collapse.fired}, cfg.to_dict())
        if self.tracker:
            self.tracker.log_artifact(self.out / "config.json")
        # rank 0 shows a bar on a terminal, one line per step in a log (rspo.progress)
        progress = Progress(
            f"train {cfg.run_name}", sc.total_steps, initial=self.step, quiet=self.quiet, enabled=main, every=1
        )
        val_names = list(self.rollouts.val_records)
        self.account.loop_started()
        try:
            if self.step == 0 and sc.val_every and self.rollouts.val_records:
                val0 = self.validate()
                self.log(val0, 0)
                progress.update(0, train_progress_metrics(val0, val_names), force=True)
            first = self.step
            while self.step < sc.total_steps:
                # the next step and a save would overrun the job's limit (each job makes one step at least)
                if self.step > first and self.time_limit.must_stop():
                    return self._stop_for_time_limit(info, progress)
                t_step = time.perf_counter()
                metrics = self.train_step()
                self.account.add_step(metrics)
                self._after_step(metrics, progress)
                if (
                    self.rollouts.val_records
                    and sc.val_every
                    and (self.step % sc.val_every == 0 or self.step == sc.total_steps)
                ):
                    metrics.update(self.validate())
                self.log(metrics, self.step)
                progress.update(
                    self.step,
                    train_progress_metrics(metrics, val_names),
                    force=any(k.startswith("val/") for k in metrics),
                )
                self.time_limit.record_step(time.perf_counter() - t_step)
                if sc.ckpt_every and (self.step % sc.ckpt_every == 0) and self.step < sc.total_steps:
                    self.save_checkpoint()
            self.save_final({**read_meta(cfg.model.path), "run": info})
        except BaseException as e:
            progress.close()
            if self.tracker:
                self.tracker.end("KILLED" if isinstance(e, KeyboardInterrupt) else "FAILED")
            raise
        progress.close()
        return self._finish(info)

    def _record_time(self) -> dict:
        """The run's time account (rspo.train.time_account), also as MLflow metrics ``time/<part>_s``."""
        account = self.account.summary()
        if self.tracker:
            values = {f"time/{k}_s": float(v) for k, v in account.items() if k not in ("jobs", "non_step_share")}
            if account["non_step_share"] is not None:
                values["time/non_step_share"] = float(account["non_step_share"])
            self.tracker.log_metrics(values, step=self.step)
        return account

    def _after_step(self, metrics: dict[str, float], progress: Progress) -> None:
        """Collapse detection on the step's metrics (``train/collapse``; tagged in MLflow when it fires)."""
        fired = self.collapse.update(self.step, metrics)
        metrics["train/collapse"] = float(self.collapse.fired)
        if fired:
            progress.write(f"[train {self.cfg.run_name}] collapse detected at step {self.collapse.step}")
            if self.tracker:
                self.tracker.set_tag("collapse", "true")
                self.tracker.set_tag("collapse_step", self.collapse.step)

    def _finish(self, info: dict[str, Any]) -> dict[str, Any]:
        """final.json (the whole metrics file's last values: a resumed run's earlier steps are in it,
        not in memory), the identity's collapse flag, the MLflow run ended."""
        main = self.dist.is_main
        last = self.folder.last_metrics() if main else dict(self._last_logged)
        account = self._record_time()
        final = {
            **info,
            "collapsed": self.collapse.fired,
            "collapse_step": self.collapse.step,
            "collapse_kind": self.collapse.kind,
            "steps": self.step,
            "final_metrics": last,
            "time_account": account,
        }
        if main:
            self.folder.write_identity({**info, "collapsed": self.collapse.fired})
            path = self.folder.write_final(final)
            if self.tracker:
                self.tracker.log_artifact(path)
        if self.tracker:
            self.tracker.end("FINISHED")
        self.dist.barrier()  # final.json exists before any rank returns
        return final
