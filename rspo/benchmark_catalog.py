"""The benchmarks the suite evaluates, one registered entry each: what the configuration, the loaders
and the report know of a benchmark by its name (torch-free, so the preset's schema reads it).

An entry states its family (math or code), its label in tables, how many problems the suite scores,
where its data comes from (a math benchmark: a split of the vendored Dr. GRPO suite, ``suite:<split>``,
or a JSONL file of ``problem``/``answer`` rows, ``file:<path>``; a code benchmark: its loader in
rspo.evaluate.benchmarks), the hub revision it is read at, its column in the paper's Table 1 (None: a
benchmark the paper's table has no column for, shown after Avg.) and the paper's values in that
column. A new math benchmark is one ``register_benchmark(Benchmark(...))``: the preset accepts its
name, ``rspo evaluate math`` loads and scores it, and table_main shows it (tests/test_new_benchmark.py
registers a toy one in one file). A new code benchmark also needs its prompt and program in
rspo.evaluate.suites.

The paper's Table 1 (tab:main_results, Pass@1 %, Qwen3-30B-A3B, mean of 3 seeds) is kept here per
benchmark (``reference``); its Avg. column in rspo.report.reference.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rspo.registry import Registry

__all__ = ["BENCHMARKS", "Benchmark", "names", "paper_columns", "register_benchmark"]

FAMILIES = ("math", "code")
_VENDORED = Path(__file__).resolve().parent / "evaluate" / "data"


@dataclass(frozen=True)
class Benchmark:
    name: str
    family: str
    label: str
    problems: int | None
    """Problems the suite scores (None: it depends on a date window, LiveCodeBench)."""
    source: str = ""
    """math: ``suite:<split>`` or ``file:<path>`` (an absolute path, or relative to this package's
    evaluate/data); code: empty (its loader in rspo.evaluate.benchmarks)."""
    column: int | None = None
    """Its place among the paper's Table 1 columns of its family; None: outside the paper's table."""
    reference: Mapping[str, float] = field(default_factory=dict)
    """The paper's Table 1 value per method key (base, grpo, gspo, gmpo, gmpo+rs)."""
    revision: str | None = None
    """The hub commit its data is read at (a benchmark read from the hub)."""
    preset: bool = True
    """Whether a preset may name it in eval.<family>.benchmarks (the evalplus variants are asked by
    `rspo evaluate code --benchmarks` only)."""

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"benchmark {self.name!r}: family must be one of {FAMILIES}, got {self.family!r}")
        if self.family == "math" and not self.source.startswith(("suite:", "file:")):
            raise ValueError(f"benchmark {self.name!r}: a math benchmark's source is suite:<split> or file:<path>")

    @property
    def file(self) -> Path | None:
        """A ``file:`` source's path (None for a suite split)."""
        if not self.source.startswith("file:"):
            return None
        path = Path(self.source[len("file:") :])
        return path if path.is_absolute() else _VENDORED / path

    @property
    def split(self) -> str | None:
        """A ``suite:`` source's split of the Dr. GRPO suite."""
        return self.source[len("suite:") :] if self.source.startswith("suite:") else None


BENCHMARKS: Registry = Registry("benchmark")
register_benchmark = BENCHMARKS.register  # add a benchmark (a name registered twice is refused)


def names(family: str, *, preset_only: bool = True) -> Sequence[str]:
    """A live view of one family's benchmark names (those a preset may name, or all), in registration
    order: a setting whose choices it is accepts a benchmark registered after it was defined."""
    return BENCHMARKS.names(lambda b: b.family == family and (b.preset or not preset_only))


def paper_columns(family: str) -> tuple[str, ...]:
    """The benchmarks of the paper's Table 1 for a family, in its column order."""
    cols = [b for b in BENCHMARKS.values() if b.family == family and b.column is not None]
    return tuple(b.name for b in sorted(cols, key=lambda b: b.column))


def _t1(base: float, grpo: float, gspo: float, gmpo: float, rspo: float) -> dict[str, float]:
    return {"base": base, "grpo": grpo, "gspo": gspo, "gmpo": gmpo, "gmpo+rs": rspo}


# The math benchmarks: the Dr. GRPO suite's splits (vendored, rspo/evaluate/data/math_eval_suite) and
# the 40-problem AMC23 the paper's numbers imply (vendored file); Dr. GRPO's 83-problem AMC set beside.
register_benchmark(Benchmark("aime24", "math", "AIME24", 30, "suite:aime", 0, _t1(80.4, 77.0, 80.4, 80.1, 80.1)))
register_benchmark(
    Benchmark("amc23", "math", "AMC23", 40, "file:amc23/test.jsonl", 1, _t1(90.0, 82.5, 95.0, 92.5, 95.0))
)
register_benchmark(Benchmark("amc22_23", "math", "AMC22-23 (83)", 83, "suite:amc"))
register_benchmark(Benchmark("math500", "math", "MATH500", 500, "suite:math", 2, _t1(90.7, 91.8, 93.6, 94.2, 94.2)))
register_benchmark(Benchmark("minerva", "math", "Minerva", 272, "suite:minerva", 3, _t1(47.7, 48.2, 48.9, 49.3, 50.7)))
register_benchmark(
    Benchmark(
        "olympiadbench", "math", "OlympiadBench", 675, "suite:olympiad_bench", 4, _t1(62.0, 58.1, 64.0, 65.9, 65.8)
    )
)
# The code benchmarks (loaders, prompts and programs in rspo.evaluate); hub ones at pinned commits.
MBPP_REVISION = "4bb6404fdc6cacfda99d4ac4205087b89d32030c"
LCB_REVISION = "0fe84c3912ea0c4d4a78037083943e8f0c4dd505"
register_benchmark(
    Benchmark("humaneval", "code", "HumanEval", 164, column=2, reference=_t1(83.5, 89.6, 95.1, 95.7, 97.0))
)
register_benchmark(Benchmark("humaneval_plus", "code", "HumanEval+", 164, preset=False))
register_benchmark(
    Benchmark(
        "mbpp", "code", "MBPP", 500, column=1, reference=_t1(86.4, 81.4, 87.2, 87.2, 88.2), revision=MBPP_REVISION
    )
)
register_benchmark(Benchmark("mbpp_plus", "code", "MBPP+", None, preset=False))
register_benchmark(
    Benchmark(
        "livecodebench",
        "code",
        "LCB",
        None,
        column=0,
        reference=_t1(52.9, 41.2, 58.8, 64.7, 70.5),
        revision=LCB_REVISION,
    )
)
