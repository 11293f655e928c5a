"""The Countdown task in one place: its data (rspo.data.countdown: generated splits, text formats),
its prompt and verifier (rspo.rewards.countdown, shared by the RL reward and evaluation), and its
pretraining pairs. `rspo generate` makes the data; evaluation scores the preset's held-out splits
(``eval.countdown``) with this task's verifier."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from rspo.tasks import Task


def task(prompt_format: str = "steps") -> Task:
    """Records of a generated split; prompts in ``prompt_format`` (steps | optimal_path | search_path)."""
    from rspo.data import countdown as cd
    from rspo.rewards import countdown as reward

    def score_batch(completions, records, workers):
        return [reward.score(c, r["nums"], r["target"]) for c, r in zip(completions, records)]

    return Task("countdown", cd.load_split, lambda r: cd.format_prompt(r, prompt_format), score_batch)


def pretraining_records(data: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, held-out) records of the generated folder ``data``: its train and val splits."""
    from rspo.data.countdown import load_split

    d = Path(data)
    return load_split(d / "train.jsonl"), load_split(d / "val.jsonl")


def sft_pairs(records: list[dict[str, Any]], fmt: str, solution: str = "first", seed: int = 0) -> list[tuple[str, str]]:
    """(prompt, completion) texts in format ``fmt``. With ``solution: any`` each example's completion
    is one of its problem's valid solutions (every path of the exhaustive search that reaches the
    target, so also the same operations in another order), drawn uniformly with a stream seeded by
    (seed, example index); ``first`` is the one Qin et al.'s DFS finds first (the record's)."""
    from rspo.data.countdown import format_completion, format_prompt

    if solution == "first":
        return [(format_prompt(r, fmt), format_completion(r, fmt)) for r in records]
    from rspo.data.countdown.solver import all_solutions

    pairs = []
    for i, r in enumerate(records):
        sols = all_solutions(int(r["target"]), r["nums"])
        pick = sols[random.Random(f"{seed}:{i}").randrange(len(sols))]
        pairs.append((format_prompt(r, fmt), format_completion({**r, "solution": pick}, fmt)))
    return pairs
