"""The evaluation settings of a preset (``eval.countdown``, ``eval.math``, ``eval.code``) as typed
sections: each setting's type, default, constraints and description stated once, on its dataclass
field (rspo.constraints.setting), read by ``rspo evaluate``, the tables, the memory plan and the
preset schema (``eval_schema``: workflow/schemas/preset.schema.yaml's ``$defs/eval`` is generated
from these classes by scripts/preset_schema.py).

A family's command-line flags override its section (``build_eval(family, data, overrides)``).
The engine, precision and device an evaluation runs with are the preset's runs' where the section
names no backend (rspo.evaluate.run.evaluation_engine).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from rspo import benchmark_catalog as catalog
from rspo.config import BACKENDS, TEMPLATES, ConfigError, build_checked
from rspo.constraints import Section, section_schema, setting

__all__ = [
    "CODE_BENCHMARK_NAMES",
    "COUNTDOWN_EVAL_SPLITS",
    "EVAL_SECTIONS",
    "MATH_BENCHMARK_NAMES",
    "CodeEval",
    "CountdownEval",
    "MathEval",
    "build_eval",
    "eval_schema",
]

# The held-out Countdown splits evaluated when `eval.countdown.splits` is not set (the generator
# writes train, val and val_target; rspo.data.countdown).
COUNTDOWN_EVAL_SPLITS: tuple[str, ...] = ("val", "val_target")
# The benchmarks a preset may name: live views of the registered ones (rspo.benchmark_catalog).
MATH_BENCHMARK_NAMES = catalog.names("math")
PAPER_MATH_BENCHMARKS = catalog.paper_columns("math")  # Table 1's columns, the default
CODE_BENCHMARK_NAMES = catalog.names("code")
DEFAULT_MATH_SAMPLES = {"aime24": 32}  # the paper's avg@32 of AIME24, asked when a preset sets no sampling


@dataclass(frozen=True)
class CountdownEval(Section):
    splits: tuple[str, ...] = setting(COUNTDOWN_EVAL_SPLITS, choices=COUNTDOWN_EVAL_SPLITS, noun="split", nonempty=True)
    """Held-out splits scored."""
    size: int = setting(0, ge=0)
    """Problems per split (0 = all)."""
    limit: int = setting(0, ge=0)
    """Earlier spelling of size (size wins when both are set)."""
    temperature: float = setting(0.0, ge=0)
    """Sampling temperature (0: greedy, one sample per problem)."""
    n: int = setting(1, ge=1)
    """Samples per problem when the temperature is above 0 (the score is their mean)."""
    max_new_tokens: int = setting(64, ge=1)
    """Response budget in tokens."""
    backend: str | None = setting(None, choices=BACKENDS, noun="backend")
    """hf or vllm (unset: the preset's rl.rollout.backend)."""
    tensor_parallel_size: int | Literal["auto"] = setting("auto", ge=1)
    """vLLM: GPUs of one evaluation engine (auto: every GPU the job holds)."""

    @property
    def problems(self) -> int:
        """Problems scored per split (0: all)."""
        return self.size or self.limit

    @property
    def samples(self) -> int:
        """Samples per problem: ``n`` when sampling, one when greedy."""
        return self.n if self.temperature > 0 else 1


@dataclass(frozen=True)
class SuiteEval(Section):
    """What the math and code suites share (rspo.evaluate.suites)."""

    limit: int = setting(0, ge=0)
    """Problems per benchmark (0 = all)."""
    template: str = setting("auto", choices=TEMPLATES, noun="template")
    """Math/code prompts (rspo.chat): chat (the model's chat template), a hand-written one, or auto."""
    enable_thinking: bool | None = None
    """The chat template's thinking switch: required (true/false) where the template has one."""
    temperature: float = setting(0.0, ge=0)
    """Sampling temperature (0: greedy)."""
    top_p: float = setting(1.0, gt=0, le=1)
    """Nucleus sampling mass (1: off)."""
    top_k: int = setting(0, ge=0)
    """Sample among the k most likely tokens (0 = off)."""
    max_new_tokens: int = setting(512, ge=1)
    """Response budget in tokens."""
    samples: dict[str, int] | None = setting(None, ge=1)
    """avg@k per benchmark: k samples per problem, run j = the j-th sample of every problem."""
    n: int | None = setting(None, ge=1)
    """Samples per problem of every benchmark not in samples (unset: 1)."""
    seed: int = setting(0, ge=0)
    """Sampling seed."""
    workers: int | None = setting(None, ge=1)
    """Verifier processes (unset: the suite's default)."""
    backend: str | None = setting(None, choices=BACKENDS, noun="backend")
    """hf or vllm (unset: the preset's rl.rollout.backend)."""
    tensor_parallel_size: int | Literal["auto"] = setting("auto", ge=1)
    """vLLM: GPUs of one evaluation engine (auto: every GPU the job holds)."""

    def samples_per_benchmark(self) -> dict[str, int]:
        """avg@k per benchmark as the suite reads it (``samples``; a benchmark not named: ``n``)."""
        return dict(self.samples or {})


@dataclass(frozen=True)
class MathEval(SuiteEval):
    benchmarks: tuple[str, ...] = setting(
        PAPER_MATH_BENCHMARKS, choices=MATH_BENCHMARK_NAMES, noun="math benchmark", nonempty=True
    )
    """Math benchmarks scored (default: the paper's five)."""
    aime_samples: int | None = setting(None, ge=1)
    """Earlier spelling of samples: {aime24: k}."""

    def checks(self, prefix: str) -> None:
        if self.aime_samples is not None and "aime24" in (self.samples or {}):
            raise ConfigError(f"{prefix}: aime_samples and samples.aime24 both given; keep samples")

    def samples_per_benchmark(self) -> dict[str, int]:
        """avg@k per benchmark; with neither samples nor n set, ``DEFAULT_MATH_SAMPLES``."""
        samples = dict(self.samples or {})
        if self.aime_samples is not None:
            samples["aime24"] = self.aime_samples
        if self.samples is None and self.aime_samples is None and self.n is None:
            samples = dict(DEFAULT_MATH_SAMPLES)
        return samples


@dataclass(frozen=True)
class CodePaths(Section):
    humaneval: str | None = None
    """A local HumanEval file."""
    mbpp: str | None = None
    """A local MBPP file."""
    livecodebench: str | None = None
    """A local LiveCodeBench file."""


@dataclass(frozen=True)
class CodeRevisions(Section):
    mbpp: str | None = setting(None, nonempty=True)
    """Hub commit of MBPP."""
    livecodebench: str | None = setting(None, nonempty=True)
    """Hub commit of LiveCodeBench."""


@dataclass(frozen=True)
class CodeEval(SuiteEval):
    benchmarks: tuple[str, ...] = setting(
        tuple(CODE_BENCHMARK_NAMES), choices=CODE_BENCHMARK_NAMES, noun="code benchmark", nonempty=True
    )
    """Code benchmarks scored."""
    data_paths: CodePaths = CodePaths()
    """Local copies of benchmark files (offline fixtures, or the hub files)."""
    revisions: CodeRevisions = CodeRevisions()
    """Hub commits of MBPP and LiveCodeBench (default the pins in rspo/evaluate/benchmarks.py)."""


EVAL_SECTIONS: dict[str, type[Section]] = {"countdown": CountdownEval, "math": MathEval, "code": CodeEval}


def build_eval(family: str, data: dict[str, Any] | None, overrides: dict[str, Any] | None = None) -> Any:
    """The family's section from a preset's ``eval.<family>`` mapping and the command's flags,
    checked; a ConfigError names the key (``eval.math.top_p: must lie in (0, 1], got 2``)."""
    if family not in EVAL_SECTIONS:
        raise ConfigError(f"eval.{family}: unknown evaluation family; choose one of {list(EVAL_SECTIONS)}")
    return build_checked(EVAL_SECTIONS[family], {**(data or {}), **(overrides or {})}, f"eval.{family}")


def eval_schema() -> dict[str, Any]:
    """The JSON schema of a preset's ``eval`` mapping: what workflow/schemas/preset.schema.yaml holds
    under ``$defs/eval``."""
    props = {name: section_schema(cls) for name, cls in EVAL_SECTIONS.items()}
    return {
        "description": "Settings of `rspo evaluate <family>` (flags of that command override them).",
        "type": "object",
        "additionalProperties": False,
        "properties": props,
    }
