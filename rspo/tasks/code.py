"""The code task in one place: its training data (rspo.data.code: the DeepCoder mix from the hub, a
local file or the offline fallback, `rspo prepare code`), its prompt (rspo.prompts, in the run's
prompt format, rspo.chat), its verifier (rspo.rewards.code: the program run on the record's tests in
a sandbox, shared by the RL reward and evaluation) and its pretraining pairs. The benchmarks
(HumanEval(+), MBPP(+), LiveCodeBench) are rspo.evaluate.suites.evaluate_code's."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from rspo.tasks import Task


def task(fmt) -> Task:
    """Normalised code records; prompts in ``fmt`` (rspo.chat.PromptFormat); the verifier runs the
    first Python block of the answer after the thinking block."""
    from rspo import prompts
    from rspo.data import code as data

    def score_batch(completions, records, workers):
        from rspo.rewards import code as reward

        programs = [reward.extract_code(fmt.answer(c)[0]) for c in completions]
        return reward.score_batch(programs, [r["tests"] for r in records], workers=workers)

    return Task("code", data.load_code_file, lambda r: prompts.code_record_prompt(r, fmt), score_batch)


def prepare(
    source: str,
    *,
    limit: int | None = None,
    seed: int = 0,
    n_fallback: int = 2000,
    sources: Sequence[str] | None = None,
    cutoff: str | None = None,
    max_cases: int | None = None,
    stats: Counter | None = None,
) -> list[dict[str, Any]]:
    """The training records of ``source`` (hub: the mix, or ``sources`` of it | fallback | a local
    file), problems dated before ``cutoff`` (default LiveCodeBench's), each validated; ``stats``
    counts what was kept and dropped per source."""
    from rspo.data import code as data

    kw = {"sources": tuple(sources)} if sources is not None else {}
    records = data.load_code_train(
        source,
        limit=limit,
        seed=seed,
        n_fallback=n_fallback,
        cutoff=cutoff or data.LCB_TRAIN_CUTOFF,
        max_cases=max_cases,
        stats=stats,
        **kw,
    )
    for i, r in enumerate(records):
        data.validate_code_record(r, f"record {i}")
    return records


def sft_pairs(t: Task, records: list[dict[str, Any]], thinking: bool) -> list[tuple[str, str]]:
    """(prompt, completion): the record's reference solution in a Python block (records without one
    are skipped)."""
    pairs = []
    for r in records:
        sol = r.get("solution") or ""
        if sol:
            think = "<think>\nA program.\n</think>\n\n" if thinking else ""
            pairs.append((t.prompt(r), f"{think}```python\n{sol}\n```"))
    return pairs
