"""`python -m rspo pretrain`: next-token SFT of a small MoE from scratch (paper Appendix A: the
small-scale model is pretrained on Countdown before RL).

Text of an example = prompt + completion + EOS (Countdown: ``rspo.data.countdown.format_prompt``
/ ``format_completion`` in the preset's ``pretrain.format``). The loss is the mean next-token
cross-entropy over completion tokens and EOS only (the prompt's numbers are random draws, so
predicting them only adds noise), plus ``router_aux_loss_coef`` x the load-balancing loss.
AdamW, linear warmup then cosine decay to ``min_lr_ratio`` x lr, fp32 on CPU / bf16 autocast on
GPU. Periodic checkpoints are atomic (temp folder + rename) and a rerun of the same command
resumes from the last one; held-out accuracy (greedy, scored by the task's verifier) and the loss
go to MLflow and to ``<out>.work/metrics.jsonl``.

Progress (``--quiet`` turns it off): a bar on a terminal, else a line every ~1% of the steps (and
at each held-out evaluation) in the log, ``[pretrain countdown] step 370/3750 (9%) elapsed ...
s/step 0.21 loss 0.412 loss_ema 0.45 lr 0.00098 acc -`` (rspo.progress; ``acc`` is the held-out
accuracy, shown at evaluation steps). The MLflow run records the data files as dataset inputs.

Output: a standard Hugging Face folder (safetensors, config, tokenizer, rspo_meta.json with the
tokenizer fingerprint) that ``AutoModelForCausalLM.from_pretrained`` and vLLM load; the marker
``pretrain.json`` (summary: steps, wall time, final loss, held-out accuracy) is written last.

For math/code presets (smoke only) the same loop fits a tiny model on the prepared records with
a byte-level BPE tokenizer trained on them (completion: "\\boxed{answer}" for math, the reference
program for code), so the Table 1 path runs end to end offline. The tokenizer carries Qwen3's chat
template (rspo/data/text_tokenizer.py), and the prompts are written in the prompt format the
task's RL runs use (``tasks.<task>.data`` over ``rl.data``: ``template``, ``enable_thinking``;
rspo.chat); with thinking on, the completion is a short thinking block, then the answer.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from rspo.chat import resolve_format
from rspo.config import parse_override, set_by_path
from rspo.preset import Preset
from rspo.pretrain_config import PretrainConfig, build_pretrain


def pretrain_settings(preset: Preset, overrides: list[str]) -> PretrainConfig:
    """The preset's ``pretrain:`` section with ``--set`` overrides applied, typed and checked
    (rspo.pretrain_config: its defaults where the preset sets none).

    An override is ``key=value`` (``examples=120000``) or, inside the architecture mappings,
    ``model.key=value`` (``model.num_experts=64``, ``text_model.max_position_embeddings=512``); an
    unknown key is an error that names it and its valid siblings."""
    p = {"pretrain": preset.section("pretrain") or {}}
    for text in overrides:
        k, v = parse_override(text)
        set_by_path(p, f"pretrain.{k.removeprefix('pretrain.')}", v)
    return build_pretrain(p.get("pretrain"))


def sft_pairs(
    task: str,
    records: list[dict[str, Any]],
    fmt: str,
    solution: str = "first",
    seed: int = 0,
    prompt_format: Any = None,
) -> list[tuple[str, str]]:
    """(prompt, completion) texts of the task's records (rspo.tasks.<task>.sft_pairs): Countdown in
    format ``fmt`` with ``solution`` first or any (seeded by ``seed``); math and code in
    ``prompt_format``, with a short thought under a thinking chat template."""
    if task == "countdown":
        from rspo.tasks import countdown

        return countdown.sft_pairs(records, fmt, solution, seed)
    import importlib

    from rspo.tasks import get_task

    thinking = bool(prompt_format is not None and prompt_format.chat and prompt_format.enable_thinking)
    module = importlib.import_module(f"rspo.tasks.{task}")
    pairs = module.sft_pairs(get_task(task, fmt=prompt_format), records, thinking)
    if not pairs:
        raise ValueError(f"no {task} record has a reference completion to pretrain on")
    return pairs


def encode_pairs(tok, pairs: list[tuple[str, str]], max_len: int) -> tuple[list[list[int]], list[int]]:
    """Token ids of prompt+completion+EOS and the number of prompt tokens (loss starts after)."""
    p_ids = tok([p for p, _ in pairs], add_special_tokens=True)["input_ids"]
    c_ids = tok([c for _, c in pairs], add_special_tokens=False)["input_ids"]
    seqs, starts = [], []
    for a, b in zip(p_ids, c_ids):
        s = list(a) + list(b) + [tok.eos_token_id]
        if len(s) > max_len:
            continue
        seqs.append(s)
        starts.append(len(a))
    if not seqs:
        raise ValueError(f"every example is longer than max_position_embeddings={max_len}")
    return seqs, starts


def collate(seqs, starts, rows, pad_id: int):
    L = max(len(seqs[i]) for i in rows)
    ids = torch.full((len(rows), L), pad_id, dtype=torch.long)
    loss_mask = torch.zeros(len(rows), L, dtype=torch.bool)
    attn = torch.zeros(len(rows), L, dtype=torch.long)
    for j, i in enumerate(rows):
        s = seqs[i]
        ids[j, : len(s)] = torch.tensor(s)
        attn[j, : len(s)] = 1
        loss_mask[j, starts[i] : len(s)] = True  # predict completion tokens and EOS
    return ids, attn, loss_mask


def lr_factor(step: int, total: int, warmup: int, min_ratio: float) -> float:
    if warmup and step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


@torch.no_grad()
def heldout_accuracy(
    model, tok, task: str, records: list[dict], fmt: str, max_new_tokens: int, prompt_format: Any = None
) -> dict[str, Any]:
    from rspo.rollout import Sampling
    from rspo.rollout.hf import HFBackend
    from rspo.tasks import generate_and_score, get_task, reason_counts

    greedy = Sampling(temperature=0.0, max_new_tokens=max_new_tokens)
    scored = generate_and_score(HFBackend(model, tok), get_task(task, fmt, prompt_format), records, greedy)
    return {
        "accuracy": sum(s for s, _ in scored) / max(1, len(scored)),
        "n": len(scored),
        "reasons": reason_counts(scored),
    }


def task_prompt_format(preset: Preset, task: str, tok) -> Any:
    """The prompt format of the task's RL runs (``tasks.<task>.data`` over ``rl.data``), or None
    for Countdown."""
    if task == "countdown":
        return None

    data = preset.rl(task).data
    return resolve_format(task, data.template, data.enable_thinking, tok, f"tasks.{task}.data")


def _load_task_data(task: str, data: str, fmt: str, seed: int):
    if task == "countdown":
        from rspo.tasks import countdown

        return countdown.pretraining_records(data)
    from rspo.tasks import get_task, load_records

    records = load_records(get_task(task), data)
    rng = random.Random(seed)
    records = rng.sample(records, len(records))
    n_val = max(1, min(64, len(records) // 10))
    return records[n_val:], records[:n_val]


@dataclass(frozen=True)
class PretrainJob:
    """What one `rspo pretrain` job trains and where: beside the preset's ``pretrain`` settings."""

    task: str
    """countdown, math or code."""
    data: str
    """Countdown: the generated folder; math/code: the training JSONL."""
    out: str
    """The checkpoint folder (its ``.work`` sibling holds checkpoints and metrics while training)."""
    tokenizer: str | None = None
    """Countdown's tokenizer folder (math/code train their own)."""
    threads: int = 0
    mlflow: bool = True
    quiet: bool = False
    max_steps: int = 0
    """> 0: stop after this many steps (testing resume)."""


def run_pretraining(preset: Preset, p: PretrainConfig, job: PretrainJob) -> dict[str, Any]:
    from rspo.models import build_model, load_balancing_loss, save_checkpoint, set_threads
    from rspo.progress import Progress
    from rspo.router import capture_router_logits, router_spec
    from rspo.tokenizer import tokenizer_fingerprint
    from rspo.tracking import Tracker, default_tracking_uri

    set_threads(job.threads)
    out = Path(job.out)
    work = out.with_name(out.name + ".work")  # checkpoints and metrics while training
    work.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    fmt = p.format
    train, val = _load_task_data(job.task, job.data, fmt, p.seed)
    if job.task == "countdown":
        from rspo.tokenizer import load_tokenizer

        if not job.tokenizer:
            raise SystemExit("rspo pretrain: --tokenizer is required for countdown")
        tok = load_tokenizer(job.tokenizer)
    else:
        from rspo.data.text_tokenizer import train_text_tokenizer

        pairs0 = sft_pairs(job.task, train, fmt)
        tok_dir = work / "tokenizer"
        if not (tok_dir / "tokenizer.json").is_file():
            train_text_tokenizer([a + b for a, b in pairs0], p.vocab_size, tok_dir)
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(tok_dir))
    prompt_format = task_prompt_format(preset, job.task, tok)
    arch = p.architecture(job.task)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = build_model(arch, tok, seed=p.seed).to(device)
    use_aux = p.router_aux_loss_coef > 0
    max_len = arch.max_position_embeddings
    pairs = sft_pairs(job.task, train, fmt, p.solution, p.seed, prompt_format)
    seqs, starts = encode_pairs(tok, pairs, max_len)
    n = len(seqs)
    bs = p.batch_size
    total_steps = max(1, p.examples // bs)
    opt = torch.optim.AdamW(model.parameters(), lr=p.lr, weight_decay=p.weight_decay, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, total_steps, p.warmup_steps, p.min_lr_ratio))
    step = 0
    run_id = None
    metrics_path = work / "metrics.jsonl"
    ckpt = work / "ckpt"
    fp = tokenizer_fingerprint(tok)
    if (ckpt / "state.pt").is_file():
        try:
            from safetensors.torch import load_model

            load_model(model, str(ckpt / "model.safetensors"))
            state = torch.load(ckpt / "state.pt", map_location="cpu", weights_only=False)
        except Exception as e:
            raise RuntimeError(f"pretraining checkpoint {ckpt} is corrupt: {e}; delete it to restart") from e
        if state.get("tokenizer_fingerprint") != fp:
            raise RuntimeError(f"pretraining checkpoint {ckpt} was made with another tokenizer; delete {work}")
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        step, run_id = state["step"], state.get("mlflow_run_id")
        torch.set_rng_state(state["rng"])
        print(f"rspo pretrain: resuming from step {step}", file=sys.stderr)
        if metrics_path.is_file():
            keep = [ln for ln in metrics_path.read_text().splitlines() if ln and json.loads(ln)["step"] <= step]
            metrics_path.write_text("".join(x + "\n" for x in keep))
    else:
        metrics_path.unlink(missing_ok=True)
    tracker = None
    if job.mlflow:
        from rspo.tracking import experiment_name

        name = preset.name
        experiment = experiment_name(preset)
        tracker = Tracker(
            default_tracking_uri(name),
            experiment,
            f"pretrain-{job.task}",
            run_id=run_id,
            params={f"pretrain/{k}": json.dumps(v) for k, v in p.to_dict().items()},
            tags={"kind": "pretrain", "task": job.task, "preset": name},
            source="rspo pretrain",
            key=f"pretrain/{out.name}",
            preset=name,
        )
        if job.task == "countdown":
            files = [(Path(job.data) / "train.jsonl", "training"), (Path(job.data) / "val.jsonl", "validation")]
        else:  # the held-out records are a seeded sample of the same file
            files = [(Path(job.data), "training")]
        tracker.log_datasets([(f, c) for f, c in files if f.is_file()])

    def log(m: dict[str, float], s: int) -> None:
        with open(metrics_path, "a") as fh:
            fh.write(json.dumps({"step": s, **m}) + "\n")
        if tracker:
            tracker.log_metrics(m, s)

    def save_ckpt() -> None:
        from safetensors.torch import save_model

        tmp = work / "ckpt.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        save_model(model, str(tmp / "model.safetensors"))
        torch.save(
            {
                "optimizer": opt.state_dict(),
                "scheduler": sched.state_dict(),
                "step": step,
                "rng": torch.get_rng_state(),
                "mlflow_run_id": tracker.run_id if tracker else None,
                "tokenizer_fingerprint": fp,
            },
            tmp / "state.pt",
        )
        shutil.rmtree(ckpt, ignore_errors=True)
        tmp.rename(ckpt)

    spec = router_spec(model)
    model.train()
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast("cpu", enabled=False)
    )
    epoch_perm: dict[int, list[int]] = {}
    t_loop = time.time()
    last_logged = step
    loss_ema = None
    progress = Progress(f"pretrain {job.task}", total_steps, initial=step, quiet=job.quiet)
    while step < total_steps:
        if job.max_steps and step >= job.max_steps:
            break
        idx = []
        for i in range(step * bs, (step + 1) * bs):
            epoch, pos = divmod(i, n)
            if epoch not in epoch_perm:
                epoch_perm = {epoch: random.Random(p.seed * 1000 + epoch).sample(range(n), n)}
            idx.append(epoch_perm[epoch][pos])
        ids, attn, lmask = collate(seqs, starts, idx, tok.pad_token_id)
        ids, attn, lmask = ids.to(device), attn.to(device), lmask.to(device)
        with autocast, capture_router_logits(model, raw=True) as cap:
            outp = model(input_ids=ids, attention_mask=attn, use_cache=False)
        logits = outp.logits[:, :-1].float()
        target = ids[:, 1:]
        m = lmask[:, 1:]
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="none").view_as(target)
        loss = (ce * m).sum() / m.sum()
        total = loss
        if use_aux:
            aux = load_balancing_loss(cap.logits, spec.top_k, attn)
            total = loss + p.router_aux_loss_coef * aux
        opt.zero_grad(set_to_none=True)
        total.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        step += 1
        loss_ema = loss.item() if loss_ema is None else 0.98 * loss_ema + 0.02 * loss.item()
        if step % 50 == 0 or step == total_steps or step == 1:
            log(
                {
                    "pretrain/loss": loss.item(),
                    "pretrain/loss_ema": loss_ema,
                    "pretrain/grad_norm": float(gn),
                    "pretrain/lr": sched.get_last_lr()[0],
                    "pretrain/examples_per_s": (step - last_logged) * bs / max(1e-9, time.time() - t_loop),
                },
                step,
            )
            t_loop, last_logged = time.time(), step
        shown = {"loss": loss.item(), "loss_ema": loss_ema, "lr": sched.get_last_lr()[0], "acc": None}
        if p.eval_every and step % p.eval_every == 0 and step < total_steps:
            model.eval()
            acc = heldout_accuracy(model, tok, job.task, val[: p.eval_size], fmt, p.max_new_tokens, prompt_format)
            model.train()
            log({"pretrain/val_accuracy": acc["accuracy"]}, step)
            shown["acc"] = acc["accuracy"]
        progress.update(step, shown, force=shown["acc"] is not None)
        if step % p.ckpt_every == 0 and step < total_steps:
            save_ckpt()
    if job.max_steps and step < total_steps:
        progress.close()
        save_ckpt()
        if tracker:
            tracker.end("KILLED")
        return {"stopped_at": step}
    model.eval()
    acc = heldout_accuracy(model, tok, job.task, val[: p.eval_size], fmt, p.max_new_tokens, prompt_format)
    log({"pretrain/val_accuracy": acc["accuracy"]}, step)
    progress.update(step, {**progress.metrics, "acc": acc["accuracy"]}, force=True)
    progress.close()
    wall = time.time() - t_start
    summary = {
        "task": job.task,
        "steps": step,
        "examples": step * bs,
        "final_loss_ema": loss_ema,
        "heldout": acc,
        "wall_time_s": wall,
        "tokenizer_fingerprint": fp,
        "params_total": sum(q.numel() for q in model.parameters()),
        "format": fmt,
    }
    save_checkpoint(
        model, tok, out, meta={"tokenizer_fingerprint": fp, "task": job.task, "format": fmt, "pretrain": p.to_dict()}
    )
    if tracker:
        tracker.log_metrics({"pretrain/wall_time_s": wall}, step)
        tracker.end("FINISHED")
    tmp = out / "pretrain.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2))
    tmp.rename(out / "pretrain.json")
    print(json.dumps({k: summary[k] for k in ("steps", "wall_time_s")} | {"heldout_accuracy": acc["accuracy"]}))
    return summary
