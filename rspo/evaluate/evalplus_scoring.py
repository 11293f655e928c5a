"""HumanEval+ / MBPP+ verdicts as evalplus gives them (expected outputs of the canonical solution,
the solution's outputs compared in the trusted evaluator). See rspo.evaluate.suites for the protocol
and rspo/rewards/verdict.py for the trust boundary."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

_GT_CACHE: dict[str, dict] = {}


def _problem_key(dataset: str, problem: dict) -> str:
    h = hashlib.md5(
        repr(
            (
                problem["task_id"],
                problem["prompt"],
                problem["canonical_solution"],
                problem["base_input"],
                problem["plus_input"],
            )
        ).encode()
    ).hexdigest()
    return f"{dataset}:{h}"


def evalplus_ground_truth(dataset: str, problem: dict) -> dict:
    """Expected outputs and reference times of the canonical solution (evalplus get_groundtruth)."""
    key = _problem_key(dataset, problem)
    if key not in _GT_CACHE:
        from evalplus.eval._special_oracle import MBPP_OUTPUT_NOT_NONE_TASKS
        from evalplus.gen.util import trusted_exec

        not_none = dataset == "mbpp" and problem["entry_point"] in MBPP_OUTPUT_NOT_NONE_TASKS
        code = problem["prompt"] + problem["canonical_solution"]
        oracle: dict[str, Any] = {}
        oracle["base"], oracle["base_time"] = trusted_exec(
            code, problem["base_input"], problem["entry_point"], record_time=True, output_not_none=not_none
        )
        oracle["plus"], oracle["plus_time"] = trusted_exec(
            code, problem["plus_input"], problem["entry_point"], record_time=True, output_not_none=not_none
        )
        _GT_CACHE[key] = oracle
    return _GT_CACHE[key]


def _evalplus_one(args: tuple) -> tuple[float, str]:
    dataset, problem, solution, expected = args
    from rspo.rewards.verdict import check_evalplus

    return check_evalplus(dataset, problem, solution, expected)


def score_evalplus(
    dataset: str, problems: Sequence[dict], solutions: Sequence[str], workers: int | None = None
) -> list[tuple[float, str]]:
    """Score (problem, solution) pairs as evalplus does (pass iff base and plus both pass).

    The solution runs in our sandbox and is only called; its outputs are compared with the
    canonical solution's in the trusted evaluator (``rspo.rewards.verdict.check_evalplus``)."""
    jobs = [(dataset, p, s, evalplus_ground_truth(dataset, p)) for p, s in zip(problems, solutions)]
    if not jobs:
        return []
    if not workers or workers <= 1:
        return [_evalplus_one(j) for j in jobs]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=workers) as ex:
        return list(ex.map(_evalplus_one, jobs))
