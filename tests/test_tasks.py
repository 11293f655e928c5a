"""rspo.tasks: each task's module wires its loader, prompt and verifier; `get_task` refuses an unknown
task by name; math and code prepare validated training records; Countdown's pretraining pairs are
the DFS's first solution or, with `any`, a seeded draw among the valid ones."""

from __future__ import annotations

import pytest

from rspo.config import TASKS
from rspo.tasks import code, countdown, get_task, math


@pytest.mark.parametrize("name", TASKS)
def test_every_task_of_the_config_has_its_module(name):
    t = get_task(name)
    assert t.name == name and callable(t.load) and callable(t.prompt) and callable(t.score_batch)


def test_an_unknown_task_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown task 'chess'"):
        get_task("chess")


def test_math_and_code_prepare_validated_records_and_their_verifier_accepts_the_references():
    recs = math.prepare("fallback", limit=6, seed=1)
    assert len(recs) == 6 and recs == math.prepare("fallback", limit=6, seed=1)
    t = get_task("math")
    answers = [
        f"The answer is \\boxed{{{r['answer'][0] if isinstance(r['answer'], list) else r['answer']}}}." for r in recs
    ]
    assert [s for s, _ in t.score_batch(answers, recs, 1)] == [1.0] * 6
    crecs = code.prepare("fallback", limit=4, seed=2)
    assert len(crecs) == 4 and all(r["tests"] for r in crecs)
    pairs = code.sft_pairs(get_task("code"), crecs, thinking=False)
    assert len(pairs) == 4 and all(c.startswith("```python\n") for _, c in pairs)


def test_countdown_pretraining_pairs_first_or_any_valid_solution():
    rec = {"nums": [1, 2, 3], "target": 6, "solution": ["1+2=3", "3+3=6"]}
    (first,) = countdown.sft_pairs([rec], "steps")
    draws = {countdown.sft_pairs([rec], "steps", "any", seed=s)[0][1] for s in range(12)}
    assert "1+2=3" in first[1] and "3+3=6" in first[1]  # the record's own solution
    assert len(draws) > 1  # several valid solutions drawn (1+2+3, 1*2*3, in several orders)
    assert countdown.sft_pairs([rec], "steps", "any", seed=3) == countdown.sft_pairs([rec], "steps", "any", seed=3)
