"""The math task in one place: its training data (rspo.data.math: DeepScaleR from the hub, a local
file or the offline fallback, `rspo prepare math`), its prompt (rspo.prompts, in the run's prompt
format: the model's chat template or a hand-written one, rspo.chat), its verifier (rspo.rewards.math:
math-verify in worker processes, shared by the RL reward and evaluation) and its pretraining pairs.
The benchmarks (AIME24, AMC23, MATH500, Minerva, OlympiadBench) are rspo.evaluate.suites.evaluate_math's."""

from __future__ import annotations

from typing import Any

from rspo.tasks import Task


def task(fmt) -> Task:
    """Normalised math records; prompts in ``fmt`` (rspo.chat.PromptFormat); the verifier grades the
    answer after the thinking block (an unfinished thought scores 0)."""
    from rspo import prompts
    from rspo.data import math as data

    def score_batch(completions, records, workers):
        from rspo.rewards import math as reward

        answers = [fmt.answer(c)[0] for c in completions]
        return reward.score_batch(answers, [r["answer"] for r in records], workers=workers)

    return Task("math", data.load_math_file, lambda r: prompts.math_item_prompt(r["prompt"], fmt), score_batch)


def prepare(
    source: str, *, limit: int | None = None, seed: int = 0, n_fallback: int = 2000, revision: str | None = None
) -> list[dict[str, Any]]:
    """The training records of ``source`` (hub | fallback | a local file), each validated."""
    from rspo.data import math as data

    records = data.load_math_train(
        source, limit=limit, seed=seed, n_fallback=n_fallback, revision=revision or data.DEEPSCALER_REVISION
    )
    for i, r in enumerate(records):
        data.validate_math_record(r, f"record {i}")
    return records


def sft_pairs(t: Task, records: list[dict[str, Any]], thinking: bool) -> list[tuple[str, str]]:
    """(prompt, completion): the reference answer boxed, after a short thought under a thinking
    template."""
    pairs = []
    for r in records:
        ans = r["answer"][0] if isinstance(r["answer"], list) else r["answer"]
        think = f"<think>\nThe answer is {ans}.\n</think>\n\n" if thinking else ""
        pairs.append((t.prompt(r), f"{think} The answer is \\boxed{{{ans}}}."))
    return pairs
