"""`python -m rspo parity`: TRL's GRPOTrainer on the same base, prompts and verifier as a study's GRPO
runs, as an outside anchor for what GRPO reaches in that regime.

    python -m rspo parity --preset configs/small.yaml --base-model results/small/models/base \
        --data results/small/data/countdown --out results/small/parity/trl-grpo-s0 --seed 0

The preset's natural ``rl`` section is mapped onto TRL 1.16's ``GRPOConfig`` (``trl_grpo_args``):
the same learning rate with the same linear warmup then constant, ``prompts_per_step`` prompts x
G responses per generation, ``prompts_per_step / mini_batch_prompts`` optimiser updates per
generation (``steps_per_generation``; TRL then computes old log-probs as we do), temperature,
top-p 1, no top-k, ``max_new_tokens``, token-level PPO clip 0.2 with ``loss_type="grpo"`` (mean
over a response's tokens, then over responses), group-normalised advantages, no KL (beta 0),
grad-norm clip, router aux loss 0, AdamW with the preset's betas / eps / weight decay,
``total_steps`` generations. The reward is ``rspo.rewards.countdown.score``, the verifier of the
study's runs, on the prompts of ``rspo.data.countdown.format_prompt`` in the preset's format.

Differences that remain (TRL's, not ours to change): TRL samples with ``model.generate``, draws
its own prompt order, and normalises advantages with a 1e-4 std floor (ours 1e-6).

The final model is evaluated exactly like the study's runs (``rspo.evaluate.run.evaluate_countdown``
with the preset's ``eval.countdown`` settings: greedy, the same splits and problems), and so is
the base model, into ``<out>/countdown.json`` and ``<out>/base_countdown.json``; ``<out>/parity.json``
holds both, TRL's per-step log (reward, ``frac_reward_zero_std``, entropy) and the wall time.
TRL is the optional ``bench`` extra (``pip install -e '.[bench]'``).

``--trainer trl-rspo`` trains RSPO through TRL instead: TRL's ``GMPOTrainer`` with the router-shift
plug-in (``rspo.integrations.trl.RSPOTrainer``), the same mapping with GMPO's log-space clip at the
preset's GMPO values (default 0.4, ``rspo.method.OBJECTIVES``) and the preset's ``gamma_min`` and
``stop_gradient``; its per-step log adds ``router/shift_ratio_mean`` and ``router/shift_clipfrac``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rspo.run_record import GAMMA, GAMMA_UNDER

TRAINERS = {
    "trl-grpo": "trl.GRPOTrainer",
    "trl-rspo": "rspo.integrations.trl.RSPOTrainer (TRL GMPOTrainer + RS)",
}
RUN_OVERRIDES = {"trl-grpo": [], "trl-rspo": ["algorithm.algo=gmpo", "algorithm.router_shift=true"]}


def trl_grpo_args(cfg, output_dir: Path, *, generations: int, lr: float, warmup: int, seed: int, **extra):
    """TRL's GRPOConfig for the work of one of our RL steps per generation (module docstring)."""
    from trl import GRPOConfig

    kw = _common_args(cfg, output_dir, generations=generations, lr=lr, warmup=warmup, seed=seed)
    kw.update(epsilon=0.2, loss_type="grpo", **extra)
    return GRPOConfig(**kw)


def trl_rspo_args(cfg, output_dir: Path, *, generations: int, lr: float, warmup: int, seed: int, **extra):
    """The plug-in's RSPOConfig (TRL's GMPOConfig + gamma_min, stop_gradient) for the same work."""
    from rspo.integrations.trl import RSPOConfig
    from rspo.method import OBJECTIVES

    a = cfg.algorithm
    low, high = OBJECTIVES["gmpo"].clip
    kw = _common_args(cfg, output_dir, generations=generations, lr=lr, warmup=warmup, seed=seed)
    kw.update(
        epsilon=low if a.clip_low is None else a.clip_low,
        epsilon_high=high if a.clip_high is None else a.clip_high,
        gamma_min=a.gamma_min,
        stop_gradient=a.stop_gradient,
        **extra,
    )
    return RSPOConfig(**kw)


def _common_args(cfg, output_dir: Path, *, generations: int, lr: float, warmup: int, seed: int) -> dict[str, Any]:
    sc, G, o = cfg.schedule, cfg.rollout.group_size, cfg.optim
    updates = sc.prompts_per_step // sc.mini_batch_prompts
    kw: dict[str, Any] = dict(
        output_dir=str(output_dir),
        per_device_train_batch_size=sc.mini_batch_prompts * G,
        num_generations=G,
        steps_per_generation=updates,
        max_completion_length=cfg.rollout.max_new_tokens,
        temperature=cfg.rollout.temperature,
        top_p=1.0,
        top_k=0,
        learning_rate=lr,
        warmup_steps=warmup,
        lr_scheduler_type="constant_with_warmup" if warmup else "constant",
        adam_beta1=o.betas[0],
        adam_beta2=o.betas[1],
        adam_epsilon=o.eps,
        weight_decay=o.weight_decay,
        beta=0.0,
        scale_rewards="group",
        num_iterations=1,
        max_grad_norm=o.grad_clip,
        max_steps=generations * updates,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        router_aux_loss_coef=0.0,
        disable_tqdm=True,
        seed=seed,
        data_seed=seed,
        dataloader_num_workers=0,
    )
    return kw


def countdown_dataset(data_dir: Path, prompt_format: str, limit: int | None = None):
    from datasets import Dataset

    from rspo.data.countdown import format_prompt, load_split

    records = load_split(Path(data_dir) / "train.jsonl")
    if limit:
        records = records[:limit]
    return Dataset.from_list(
        [{"prompt": format_prompt(r, prompt_format), "nums": r["nums"], "target": r["target"]} for r in records]
    )


def countdown_reward(completions, nums, target, **_):
    from rspo.rewards.countdown import score

    return [score(c, n, t)[0] for c, n, t in zip(completions, nums, target)]


def run_parity(
    preset_path: str,
    base: str,
    data: str,
    out: str,
    *,
    seed: int = 0,
    threads: int = 1,
    overrides: list[str] = (),
    trainer: str = "trl-grpo",
) -> dict[str, Any]:
    if trainer not in TRAINERS:
        raise ValueError(f"--trainer: unknown trainer {trainer!r}; choose one of {list(TRAINERS)}")
    from rspo.integrations import require_trl

    require_trl("rspo parity")
    import torch
    from trl import GRPOTrainer

    from rspo.evaluate.run import evaluate_countdown, evaluation_settings
    from rspo.grid import load_train_config
    from rspo.jsonl import write_json_atomic
    from rspo.models import load_model, load_tokenizer_checked, save_checkpoint, set_threads
    from rspo.preset import Preset

    set_threads(threads)
    preset = Preset.load(preset_path)
    run_sets = [*RUN_OVERRIDES[trainer], *overrides]
    cfg = load_train_config(preset_path, None, [f"model.path={json.dumps(base)}", *run_sets])
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    settings, engine = evaluation_settings(preset, "countdown")
    fmt = cfg.data.prompt_format
    t0 = time.time()
    base_eval = evaluate_countdown(base, data, settings, engine, fmt)
    write_json_atomic(base_eval, out_dir / "base_countdown.json")
    tok = load_tokenizer_checked(base)
    make_args = trl_rspo_args if trainer == "trl-rspo" else trl_grpo_args
    args = make_args(
        cfg,
        out_dir / "trl",
        generations=cfg.schedule.total_steps,
        lr=cfg.optim.lr,
        warmup=cfg.optim.warmup_steps,
        seed=seed,
        logging_steps=cfg.schedule.prompts_per_step // cfg.schedule.mini_batch_prompts,
    )
    torch.manual_seed(seed)
    if trainer == "trl-rspo":
        from rspo.integrations.trl import RSPOTrainer as trainer_cls
    else:
        trainer_cls = GRPOTrainer
    trl_trainer = trainer_cls(
        model=load_model(base, device="cpu"),
        reward_funcs=countdown_reward,
        args=args,
        train_dataset=countdown_dataset(Path(data), fmt),
        processing_class=tok,
    )
    trl_trainer.train()
    t_train = time.time() - t0
    final = out_dir / "final"
    save_checkpoint(trl_trainer.model, tok, final, meta={"trainer": TRAINERS[trainer], "seed": seed})
    result = evaluate_countdown(str(final), data, settings, engine, fmt)
    write_json_atomic(result, out_dir / "countdown.json")
    keys = ("reward", "frac_reward_zero_std", "entropy", "clip_ratio/region_mean", "learning_rate")
    keys += (GAMMA, GAMMA_UNDER)
    log = [{k: row[k] for k in ("step", *keys) if k in row} for row in trl_trainer.state.log_history if "reward" in row]
    summary = {
        "trainer": TRAINERS[trainer],
        "trl_version": __import__("trl").__version__,
        "preset": preset.name,
        "seed": seed,
        "generations": cfg.schedule.total_steps,
        "base_accuracy": {s: r["accuracy"] for s, r in base_eval["splits"].items()},
        "final_accuracy": {s: r["accuracy"] for s, r in result["splits"].items()},
        "log": log,
        "wall_time_s": time.time() - t0,
        "train_wall_time_s": t_train,
        "threads": threads,
        "overrides": list(overrides),
        "run_overrides": RUN_OVERRIDES[trainer],
    }
    write_json_atomic(summary, out_dir / "parity.json")
    return summary
