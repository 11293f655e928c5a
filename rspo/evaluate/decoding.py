"""Decoding settings of an evaluation and the calls that use them.

``Decoding`` holds what a family's preset section (``eval.math``, ``eval.code``) says about
decoding: temperature, top-p, top-k, the token budget, samples per benchmark (avg@k) and the seed.
Both backends take every setting (rspo.rollout.load_generator: the hf backend's sampling loop
applies top-k, then top-p, to the temperature-scaled logits, as transformers' warpers and vLLM's
sampler do; vLLM gets them in its SamplingParams); a generator that cannot take a sampling setting
it is given is refused (``generate``), never silently run without it.

avg@k: a benchmark with k samples (``samples: {aime24: 32}``, or ``n`` for every benchmark) draws k
responses per problem in one call, all seeded from the recorded call seed (the hf backend: response
j of problem i from the row stream ``(seed, i*k + j)``; vLLM: problem i's request seeded with
``row_seed(seed, i*k)``). Run j is the j-th response of every problem: the result keeps each run's
Pass@1 (``runs``), their mean (= Pass@1, the mean over problems of the mean over samples) and the
sample standard deviation over runs. With temperature 0 the k responses would be one response k
times: one is drawn and ``samples_requested`` records what was asked (the paper states both
temperature 0 and "averaged over 32 runs" for AIME24; its numbers fit only sampling, see
docs/evaluation.md).
"""

from __future__ import annotations

import inspect
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rspo.rollout.base import Sampling

GenerateFn = Callable[..., list[list[str]]]
OFF: dict[str, float | int] = {"top_p": 1.0, "top_k": 0}  # values that leave the distribution as it is


@dataclass(frozen=True)
class Decoding:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    """0: off (every token); else sample among the k most likely (ties at the k-th kept)."""
    max_new_tokens: int | None = None
    samples: Mapping[str, int] = field(default_factory=dict)
    """avg@k per benchmark (a benchmark not named: ``n``)."""
    n: int = 1
    seed: int = 0

    def check(self, where: str) -> None:
        if self.temperature < 0:
            raise ValueError(f"{where}.temperature: must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"{where}.top_p: must be in (0, 1], got {self.top_p}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"{where}.top_k: must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError(f"{where}.max_new_tokens: must be >= 1, got {self.max_new_tokens}")
        if self.n < 1:
            raise ValueError(f"{where}.n: must be >= 1, got {self.n}")
        for name, k in self.samples.items():
            if isinstance(k, bool) or not isinstance(k, int) or k < 1:
                raise ValueError(f"{where}.samples.{name}: must be an integer >= 1, got {k!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def sampling(self) -> Sampling:
        """The generator's sampling (rspo.rollout.Sampling: the same temperature, top-p, top-k, budget
        and seed; checked when built); the samples per benchmark stay here."""
        if self.max_new_tokens is None:
            raise ValueError("decoding.max_new_tokens: unset; a generator built for it needs a budget")
        from rspo.rollout.base import Sampling  # torch: reading and checking settings does without it

        return Sampling(self.temperature, self.top_p, self.top_k, self.max_new_tokens, self.seed)

    def requested(self, benchmark: str) -> int:
        return int(self.samples.get(benchmark, self.n))

    def samples_for(self, benchmark: str) -> int:
        """Responses drawn per problem: the requested k, or 1 under greedy decoding."""
        return 1 if self.greedy else self.requested(benchmark)

    def record(self) -> dict[str, Any]:
        d = asdict(self)
        d["samples"] = dict(self.samples)
        d["decoding"] = "greedy" if self.greedy else "sampled"
        return d


def _accepted(fn: GenerateFn) -> set[str] | None:
    """Keyword names ``fn`` takes (None: any, it has **kwargs)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return set()
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return None
    return set(params)


def generate(
    generate_fn: GenerateFn,
    prompts: Sequence[str],
    n: int,
    decoding: Decoding,
    batch_size: int | None = None,
) -> list[list[str]]:
    """``generate_fn(prompts, n, temperature, **settings)`` in chunks of ``batch_size`` prompts,
    with the settings it takes (token budget, top-p, top-k, seed); its output's shape checked.

    A sampling setting that changes the distribution (top-p < 1, top-k > 0) and that the generator
    does not take is refused; a budget or seed it does not take is its own (and only recorded)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    accepted = _accepted(generate_fn)
    wanted = {
        "max_new_tokens": decoding.max_new_tokens,
        "top_p": decoding.top_p,
        "top_k": decoding.top_k,
        "seed": decoding.seed,
    }
    kw: dict[str, Any] = {}
    for key, value in wanted.items():
        if value is None:
            continue
        if accepted is None or key in accepted:
            kw[key] = value
        elif key in OFF and value != OFF[key] and not decoding.greedy:
            raise ValueError(f"the generator takes no {key}: it cannot sample with {key}={value}")
    step = batch_size or max(1, len(prompts))
    out: list[list[str]] = []
    for s in range(0, len(prompts), step):
        chunk = list(prompts[s : s + step])
        res = generate_fn(chunk, n, decoding.temperature, **kw)
        if not isinstance(res, (list, tuple)) or len(res) != len(chunk):
            size = len(res) if hasattr(res, "__len__") else "?"
            raise ValueError(
                f"generate_fn returned {type(res).__name__} of length {size} for {len(chunk)} prompts; "
                f"expected a list of {len(chunk)} lists"
            )
        for i, comps in enumerate(res):
            if not isinstance(comps, (list, tuple)) or len(comps) != n or not all(isinstance(c, str) for c in comps):
                raise ValueError(f"generate_fn output for prompt {s + i} is not a list of {n} strings")
        out += [list(c) for c in res]
    return out


def run_scores(scores: Sequence[Sequence[float]], n: int) -> dict[str, Any]:
    """Per-run Pass@1 of a (problems, n) score table: run j = the j-th sample of every problem."""
    if n < 2 or not scores:
        return {}
    runs = [statistics.fmean(row[j] for row in scores) for j in range(n)]
    return {"runs": [round(r, 6) for r in runs], "std_over_runs": round(statistics.stdev(runs), 6)}
