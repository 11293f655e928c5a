"""`python -m rspo speed`: our RL step side by side with TRL's GRPOTrainer, a plain training loop
and plain ``generate``, on the same model, prompts and verifier, in ONE process.

Contenders, each given the same work per RL step (``prompts_per_step`` Countdown prompts x G
responses, temperature 1, ``max_new_tokens``, ``prompts_per_step / mini_batch_prompts``
optimiser updates per rollout, no KL, lr 1e-5):

- ``rspo``: ``Trainer.train_step`` (GRPO, router diagnostics on: the suite's default for every
  run), phases rollout / reward / old pass / update;
- ``rspo old=rollout``: the same with ``rollout.old_values=rollout`` (the hf backend records the
  old log-probs, entropy and router cache while it samples; no old pass), a second trainer from
  the same weights;
- ``trl``: TRL's ``GRPOTrainer`` (loss_type grpo, beta 0, per_device_train_batch_size = rows of
  a mini-batch, steps_per_generation = updates per rollout, so it computes old log-probs like we
  do; gradient checkpointing off and router aux loss 0, as in our run); its rollout phase is the
  time inside ``_generate_and_score_completions`` (generation, reward, old log-probs), its update
  phase the rest of the cycle;
- ``raw train``: the model's own training speed on our step's rows: per mini-batch, the rows
  (prompt + response tokens) right-padded to the longest, ``model(..., labels=...)`` mean
  cross-entropy, backward, grad-norm clip, AdamW step, as an SFT loop would do;
- ``generate``: ``model.generate(do_sample=True, temperature=1, top_k=0)`` on the same prompts
  repeated G times (the batch our rollout samples).

The step schedule alternates: TRL's trainer runs its loop and, after each of its RL steps (one
generation and its updates), a callback runs one step of each other contender, timed
separately, so machine noise hits all of them alike. The first step of each is a warm-up and
is not counted; figures are medians over the measured steps.

Token counts: ``update tokens/s`` counts the non-padding tokens (prompt + response) of the
step's rows times the updates that process them, for both our update phase and the raw loop
(the same rows, the same count); ``rollout tokens/s`` counts sampled response tokens (up to and
including the stop token) for both our rollout and ``generate``.

Printed: one table per model (the preset's pretrained base, and a random-init model of the
paper's depth, 12 layers, same width), then as the LAST line one JSON object with
``step_time_ratio_vs_trl`` (ours / TRL's step time: the median of the per-round ratios, rspo.bench's
RATIO_DEFINITION; ``spread``: the same median and its quartiles over the rounds of the alternation;
``ratio_of_medians``: the earlier headline, for comparison), ``update_tokens_per_s_vs_raw_training``
and ``rollout_tokens_per_s_vs_generate`` for the first model, and the same for every model
under ``models``. TRL is an optional dependency (``pip install -e '.[bench]'``; ``make bench``
installs it). Run it alone on the machine.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from rspo.bench import RATIO_DEFINITION, ratio_spread, spread_text

COLUMNS = ("rollout_s", "old_pass_s", "update_s", "step_s", "rollout_tok_s", "update_tok_s")
ROLLOUT_OLD = "rspo old=rollout"
# what the old values from the rollout change, read on the step's first (on-policy) mini-batch, where
# the old pass's values give |ppo_kl| = 0 and gamma = 1 exactly
EXACTNESS = {"onpolicy_abs_ppo_kl": "actor/onpolicy_ppo_kl", "onpolicy_gamma": "router/onpolicy_shift_ratio_mean"}
# (ratio, the contender divided, the contender it is divided by, the column): of the medians, and per
# round (``spread``)
RATIOS = (
    ("step_time_ratio_vs_trl", "rspo", "trl", "step_s"),
    ("update_tokens_per_s_vs_raw_training", "rspo", "raw train", "update_tok_s"),
    ("rollout_tokens_per_s_vs_generate", "rspo", "generate", "rollout_tok_s"),
    ("rollout_old_step_time_ratio_vs_trl", ROLLOUT_OLD, "trl", "step_s"),
    ("rollout_old_step_time_ratio_vs_recompute", ROLLOUT_OLD, "rspo", "step_s"),
)


def _deep_model(src: Path, dst: Path, layers: int) -> Path:
    """A random-init copy of ``src``'s architecture with ``layers`` decoder layers (same tokenizer)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from rspo.models import META_FILE, save_checkpoint

    cfg = AutoConfig.from_pretrained(src)
    cfg.num_hidden_layers = layers
    if hasattr(cfg, "layer_types") and cfg.layer_types is not None:
        cfg.layer_types = [cfg.layer_types[0]] * layers
    import torch

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    meta = json.loads((src / META_FILE).read_text()) if (src / META_FILE).is_file() else {}
    save_checkpoint(model, AutoTokenizer.from_pretrained(src), dst, meta=meta)
    return dst


class _Raw:
    """A plain SFT-style training loop on the rows of our last step (see the module docstring)."""

    def __init__(self, model_dir: Path, lr: float, grad_clip: float):
        import torch

        from rspo.models import load_model

        self.model = load_model(model_dir, device="cpu")
        self.model.train()
        self.opt = torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad], lr=lr, foreach=True)
        self.grad_clip = grad_clip

    def step(self, batch, mini_batches, pad_id: int) -> tuple[float, int]:
        import torch

        rows_tok = [batch.input_ids[i][batch.attention_mask[i].bool()] for i in range(batch.input_ids.shape[0])]
        t0 = time.perf_counter()
        n_tok = 0
        for mb in mini_batches:
            seqs = [rows_tok[int(i)] for i in mb]
            width = max(len(s) for s in seqs)
            ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
            attn = torch.zeros_like(ids)
            for k, s in enumerate(seqs):
                ids[k, : len(s)] = s
                attn[k, : len(s)] = 1
            labels = ids.masked_fill(attn == 0, -100)
            self.opt.zero_grad(set_to_none=True)
            loss = self.model(input_ids=ids, attention_mask=attn, labels=labels, use_cache=False).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
            self.opt.step()
            n_tok += int(attn.sum())
        return time.perf_counter() - t0, n_tok


class _Generate:
    """``model.generate`` sampling on the same prompts, G rows each."""

    def __init__(self, model_dir: Path, tokenizer):
        from rspo.models import load_model

        self.model = load_model(model_dir, device="cpu")
        self.model.eval()
        self.tok = tokenizer

    def step(self, prompts: list[str], n: int, max_new_tokens: int, seed: int) -> tuple[float, int]:
        import torch

        from rspo.rollout.base import response_mask_from_ids, stop_token_ids

        enc = self.tok(prompts, return_tensors="pt", padding=True, padding_side="left")
        ids = enc["input_ids"].repeat_interleave(n, dim=0)
        attn = enc["attention_mask"].repeat_interleave(n, dim=0)
        torch.manual_seed(seed)
        t0 = time.perf_counter()
        with torch.no_grad():
            out = self.model.generate(
                input_ids=ids,
                attention_mask=attn,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=max_new_tokens,
                pad_token_id=self.tok.pad_token_id,
                eos_token_id=self.tok.eos_token_id,
            )
        wall = time.perf_counter() - t0
        resp = out[:, ids.shape[1] :]
        return wall, int(response_mask_from_ids(resp, stop_token_ids(self.tok)).sum())


CONTENDERS = ("rspo", ROLLOUT_OLD, "trl", "raw train", "generate")


def bench_model(
    preset_path: str,
    model_dir: Path,
    data_dir: Path,
    work: Path,
    *,
    steps: int,
    threads: int,
    label: str,
    contenders: tuple[str, ...] = CONTENDERS,
    quiet: bool = False,
    profile: bool = False,
) -> dict[str, Any]:
    """One table: every contender on one model, alternating step by step; ``profile``: then one more
    step of ours under the profiler (``profile_step``)."""
    import torch

    from rspo.grid import load_train_config
    from rspo.progress import Progress
    from rspo.train.trainer import Trainer

    overrides = [
        f"model.path={json.dumps(str(model_dir))}",
        f"data.train_path={json.dumps(str(data_dir / 'train.jsonl'))}",
        "data.val_paths={}",
        f"model.threads={threads}",
        "schedule.ckpt_every=0",
        "optim.lr=1e-5",
        "optim.warmup_steps=0",
        'algorithm.algo="grpo"',
        "algorithm.router_shift=false",
        "tracking.router_diagnostics=true",
    ]
    cfg = load_train_config(preset_path, None, overrides)
    ours = Trainer(cfg, work / f"rspo-{label}")
    rollout_old = None
    if ROLLOUT_OLD in contenders:
        cfg_old = load_train_config(preset_path, None, [*overrides, 'rollout.old_values="rollout"'])
        rollout_old = Trainer(cfg_old, work / f"rspo-rollout-old-{label}")
    torch.set_num_threads(threads)
    sc, G = cfg.schedule, cfg.rollout.group_size
    updates = sc.prompts_per_step // sc.mini_batch_prompts
    raw = _Raw(model_dir, 1e-5, cfg.optim.grad_clip) if "raw train" in contenders else None
    gen = _Generate(model_dir, ours.tokenizer) if "generate" in contenders else None
    rows: dict[str, list[dict[str, float]]] = {k: [] for k in CONTENDERS if k in contenders}
    progress = Progress(f"speed {label}", total=steps + 1, unit="round", quiet=quiet, every=1)

    def phases(m: dict[str, float]) -> dict[str, float]:
        return {
            "rollout_s": m["perf/rollout_s"],
            "old_pass_s": m["perf/old_pass_s"],
            "update_s": m["perf/update_s"],
            "step_s": m["perf/step_s"],
            "rollout_tok_s": m["perf/rollout_tokens_per_s"],
            "update_tok_s": m["perf/update_tokens_per_s"],
        }

    def other_steps() -> None:
        """One step of every contender but TRL, each timed on its own."""
        m = ours.train_step()
        rows["rspo"].append(phases(m))
        if rollout_old is not None:  # and how far its old values are from the old pass's: on-policy
            m_old = rollout_old.train_step()  # the first mini-batch's ratio is 1 and gamma 1 with the old pass
            exact = {k: abs(m_old[metric]) for k, metric in EXACTNESS.items()}
            rows[ROLLOUT_OLD].append({**phases(m_old), **exact})
        if raw is not None:
            mbs = ours.policy.mini_batches(ours.step - 1, 0)
            wall, n_tok = raw.step(ours.last_batch, mbs, ours.tokenizer.pad_token_id)
            rows["raw train"].append({"update_s": wall, "update_tok_s": n_tok / wall})
        if gen is not None:
            prompts = [ours.task.prompt(r) for r in ours.rollouts.sample_prompts(ours.step - 1)]
            wall, n_tok = gen.step(prompts, G, cfg.rollout.max_new_tokens, seed=ours.step)
            rows["generate"].append({"rollout_s": wall, "rollout_tok_s": n_tok / wall})
        progress.update(len(rows["rspo"]), {"s/step": m["perf/step_s"]})

    if "trl" in contenders:
        _run_with_trl(cfg, model_dir, data_dir, work, label, steps, threads, updates, ours.tokenizer, rows, other_steps)
    else:
        for _ in range(steps + 1):
            other_steps()
    progress.close()
    prof = None
    if profile:  # ours, and ours with the old values from the rollout
        prof = {"rspo": profile_step(ours)}
        if rollout_old is not None:
            prof[ROLLOUT_OLD] = profile_step(rollout_old)
    med = {k: {c: statistics.median(r[c] for r in v[1:]) for c in v[0]} for k, v in rows.items()}
    out = {
        "label": label,
        "layers": ours.model.config.num_hidden_layers,
        "steps_measured": len(rows["rspo"]) - 1,
        "median": med,
    }
    if prof is not None:
        out["profile"] = prof
    out["spread"], out["ratio_of_medians"], out["ratio_definition"] = {}, {}, RATIO_DEFINITION
    for key, ours_name, other, column in RATIOS:
        if ours_name in med and other in med:
            per_round = [a[column] / b[column] for a, b in zip(rows[ours_name][1:], rows[other][1:])]
            out["spread"][key] = ratio_spread(per_round)
            out[key] = out["spread"][key]["median"]
            out["ratio_of_medians"][key] = med[ours_name][column] / med[other][column]
    return out


def _run_with_trl(
    cfg,
    model_dir: Path,
    data_dir: Path,
    work: Path,
    label: str,
    steps: int,
    threads: int,
    updates: int,
    tokenizer,
    rows: dict[str, list[dict[str, float]]],
    other_steps,
) -> None:
    """TRL's trainer runs its loop; after each of its RL steps a callback runs ``other_steps``
    (timed apart), so the contenders alternate step by step."""
    import torch
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    from rspo.models import load_model
    from rspo.parity import countdown_dataset, countdown_reward, trl_grpo_args

    ds = countdown_dataset(data_dir, cfg.data.prompt_format, limit=4096)
    clock = {"mark": 0.0, "gen": 0.0}

    class Alternate(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % updates:
                return
            cycle = time.perf_counter() - clock["mark"]
            rows["trl"].append({"rollout_s": clock["gen"], "update_s": cycle - clock["gen"], "step_s": cycle})
            clock["gen"] = 0.0
            other_steps()
            clock["mark"] = time.perf_counter()

    # the same work per step as ours (rspo.parity.trl_grpo_args), lr 1e-5 constant as every contender
    args = trl_grpo_args(
        cfg, work / f"trl-{label}", generations=steps + 1, lr=1e-5, warmup=0, seed=0, logging_steps=10_000
    )
    trainer = GRPOTrainer(
        model=load_model(model_dir, device="cpu"),
        reward_funcs=countdown_reward,
        args=args,
        train_dataset=ds,
        processing_class=tokenizer,
        callbacks=[Alternate()],
    )
    inner = trainer._generate_and_score_completions

    def timed(*a, **kw):
        t0 = time.perf_counter()
        try:
            return inner(*a, **kw)
        finally:
            clock["gen"] += time.perf_counter() - t0

    trainer._generate_and_score_completions = timed
    torch.set_num_threads(threads)
    clock["mark"] = time.perf_counter()
    trainer.train()


PROFILE_LABELS = (
    "rollout.model",
    "rollout.sample",
    "rollout.routing",
    "forward.model",
    "forward.logprobs",
    "update.loss",
    "update.backward",
    "update.optimizer",
)
"""The ``torch.profiler.record_function`` labels in the step's code: the rollout's decoding forwards,
its sampling and its routing record (rspo.rollout.hf); the policy forwards of the old pass and the
updates and their log-probs (rspo.train.forward); the updates' loss with its diagnostics, backward,
and clip + optimizer step (rspo.train.update)."""


def profile_step(trainer, top: int = 20) -> dict[str, Any]:
    """One more step of ``trainer`` under the CPU profiler: where its time goes. -> the step's phases
    (``perf/*_s``), each label's total time (a label inside another counts in both: forward.model
    inside the old pass and the updates), and the ``top`` operators by self time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        m = trainer.train_step()
    events = prof.key_averages()
    total = {e.key: e.cpu_time_total / 1e6 for e in events}
    ops = sorted((e for e in events if e.key not in PROFILE_LABELS), key=lambda e: -e.self_cpu_time_total)
    return {
        "phases_s": {
            k.removeprefix("perf/"): m[k]
            for k in m
            if k.startswith("perf/") and k.endswith("_s") and not k.endswith("_per_s")
        },
        "labels_s": {k: total.get(k, 0.0) for k in PROFILE_LABELS},
        "top_ops_self_s": {e.key: e.self_cpu_time_total / 1e6 for e in ops[:top]},
    }


def format_profile(prof: dict[str, Any]) -> list[str]:
    step = prof["phases_s"].get("step_s", 0.0) or 1.0
    lines = [
        "profile of one step (one more, under torch.profiler; its overhead inflates it): seconds, share of the step"
    ]
    lines += [f"  {k:<24}{v:>9.3f}{v / step:>8.1%}" for k, v in prof["phases_s"].items()]
    lines += [f"  {k:<24}{v:>9.3f}{v / step:>8.1%}" for k, v in prof["labels_s"].items()]
    lines.append("  top operators by self time:")
    lines += [f"  {k[:40]:<42}{v:>9.3f}{v / step:>8.1%}" for k, v in prof["top_ops_self_s"].items()]
    return lines


def format_table(res: dict[str, Any]) -> list[str]:
    lines = [
        f"{res['label']}: {res['layers']} layers, median of {res['steps_measured']} steps after 1 warm-up",
        f"{'contender':<17}" + "".join(f"{c:>14}" for c in COLUMNS),
    ]
    for name, row in res["median"].items():
        cells = []
        for c in COLUMNS:
            v = row.get(c)
            cells.append(f"{'-':>14}" if v is None else f"{v:>14.0f}" if c.endswith("tok_s") else f"{v:>14.3f}")
        lines.append(f"{name:<17}" + "".join(cells))
    names = {
        "step_time_ratio_vs_trl": "ours / TRL step time",
        "update_tokens_per_s_vs_raw_training": "update tokens/s vs raw training",
        "rollout_tokens_per_s_vs_generate": "rollout tokens/s vs generate",
        "rollout_old_step_time_ratio_vs_trl": "old=rollout / TRL step time",
        "rollout_old_step_time_ratio_vs_recompute": "old=rollout / recompute step time",
    }
    exact = res["median"].get(ROLLOUT_OLD, {})
    if "onpolicy_gamma" in exact:
        lines.append(
            f"old=rollout on the on-policy mini-batch: |ppo_kl| {exact['onpolicy_abs_ppo_kl']:.2e}, "
            f"gamma {exact['onpolicy_gamma']:.6f} (the old pass: 0 and 1)"
        )
    for k, text in names.items():
        if k in res:
            spread = res.get("spread", {}).get(k)
            lines.append(f"{text} {res[k]:.3f}" + (f" ({spread_text(spread)})" if spread else ""))
    for name, prof in res.get("profile", {}).items():
        lines += [f"{name}:", *format_profile(prof)]
    return lines


def run_speed(
    preset_path: str,
    *,
    model: str | None = None,
    data: str | None = None,
    steps: int = 5,
    threads: int = 2,
    deep_layers: int = 12,
    out: str | None = None,
    contenders: tuple[str, ...] = CONTENDERS,
    quiet: bool = False,
    profile: bool = False,
) -> dict[str, Any]:
    if "rspo" not in contenders or not set(contenders) <= set(CONTENDERS):
        raise ValueError(f"contenders must include rspo and come from {CONTENDERS}, got {contenders}")
    if "trl" in contenders:
        from rspo.integrations import require_trl

        require_trl("rspo speed")
    from rspo.bench import prepare_inputs
    from rspo.models import set_threads

    set_threads(threads)
    results = []
    with tempfile.TemporaryDirectory(prefix="rspo-speed-") as tmp:
        work = Path(tmp)
        _, name, data_dir, model_dir, source = prepare_inputs(preset_path, model, data, work, threads)
        results.append(
            bench_model(
                preset_path,
                model_dir,
                data_dir,
                work,
                steps=steps,
                threads=threads,
                label=f"{name} base ({source})",
                contenders=contenders,
                quiet=quiet,
                profile=profile,
            )
        )
        print("\n".join(format_table(results[-1])), flush=True)
        if deep_layers:
            deep = _deep_model(model_dir, work / "deep", deep_layers)
            results.append(
                bench_model(
                    preset_path,
                    deep,
                    data_dir,
                    work,
                    steps=steps,
                    threads=threads,
                    label=f"{deep_layers}-layer random-init",
                    contenders=contenders,
                    quiet=quiet,
                    profile=profile,
                )
            )
            print("\n" + "\n".join(format_table(results[-1])), flush=True)
    first = results[0]
    summary = {k: first[k] for k, *_ in RATIOS if k in first}
    summary.update(preset=name, threads=threads, models=results)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary))
    return summary
