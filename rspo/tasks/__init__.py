"""Tasks: how a training/validation record becomes a prompt and how a completion is scored, one
module per task holding its wiring (rspo.tasks.countdown, .math, .code: the task's data, prompt,
verifier, training-data preparation and pretraining pairs); this package holds what they share.

One verifier per task, shared by the RL reward and by evaluation:
countdown -> rspo.rewards.countdown, math -> rspo.rewards.math (math-verify in worker
processes), code -> rspo.rewards.code (sandboxed execution).

Math and code prompts follow a prompt format (rspo.chat.PromptFormat, from ``data.template`` and
``data.enable_thinking``): the model's chat template or a hand-written template (``qwen_math`` /
``chatml`` when none is given). Under a chat template the reward grades the text after the thinking
block, as evaluation does (an unfinished thought scores 0).

A new task: a module here with ``task(...) -> Task`` (and ``prepare`` / ``sft_pairs`` where it has
training data and pretraining), its name in rspo.config.TASKS.
"""

from __future__ import annotations

import importlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rspo.chat import HAND_DEFAULT, PromptFormat, resolve_format
from rspo.config import TASKS


@dataclass(frozen=True)
class Task:
    """A task as a run uses it: its records' loader, their prompt and the verifier of a batch of
    completions (-> (score, reason) per completion)."""

    name: str
    load: Callable[[str], list[dict[str, Any]]]
    prompt: Callable[[dict[str, Any]], str]
    score_batch: Callable[[list[str], list[dict[str, Any]], int], list[tuple[float, str]]]


def get_task(name: str, prompt_format: str = "steps", fmt=None) -> Task:
    """The task ``name``; ``fmt`` (rspo.chat.PromptFormat) is how math/code prompts are written
    (default: the hand-written qwen_math / chatml templates)."""

    if name not in TASKS:
        raise ValueError(f"data.task: unknown task {name!r}; choose countdown, math or code")
    module = importlib.import_module(f"rspo.tasks.{name}")
    if name == "countdown":
        return module.task(prompt_format)
    return module.task(fmt or PromptFormat(name, HAND_DEFAULT[name]))


def task_for(cfg_data, tokenizer) -> Task:
    """The task of a run's ``data`` section, its prompt format resolved against the tokenizer."""

    if cfg_data.task == "countdown":
        return get_task("countdown", cfg_data.prompt_format)
    fmt = resolve_format(cfg_data.task, cfg_data.template, cfg_data.enable_thinking, tokenizer, "rl.data")
    return get_task(cfg_data.task, fmt=fmt)


def generate_and_score(
    backend,
    task: Task,
    records: list[dict[str, Any]],
    sampling,
    *,
    workers: int = 1,
    batch_size: int = 128,
    row_offset: int = 0,
) -> list[tuple[float, str]]:
    """One response per record from a rollout backend, scored by the task's verifier, in chunks of
    ``batch_size``, sampled as ``sampling`` (rspo.rollout.Sampling) says. Record i is sampled from
    the row stream (sampling.seed, row_offset + i), whatever the chunking (a data-parallel rank
    passes the global index of its first record)."""
    from rspo.rollout import generate_chunks

    prompts = [task.prompt(r) for r in records]
    scored: list[tuple[float, str]] = []
    for i, batch in generate_chunks(backend, prompts, 1, batch_size, sampling, row_offset=row_offset):
        scored += task.score_batch(batch.responses, records[i : i + batch_size], workers)
    return scored


def reason_counts(scored: list[tuple[float, str]]) -> dict[str, int]:
    """How often each verifier reason occurs (the part before ':'), sorted by reason."""
    return dict(sorted(Counter(why.split(":")[0] for _, why in scored).items()))


def load_records(task: Task, path: str) -> list[dict[str, Any]]:
    if not path:
        raise ValueError(f"no data file given for task {task.name}")
    if not Path(path).is_file():
        raise FileNotFoundError(f"{task.name} data file not found: {path}")
    records = task.load(path)
    if not records:
        raise ValueError(f"{task.name} data file {path} holds no records")
    return records
