"""A new math benchmark is one registered entry (rspo.benchmark_catalog): a toy benchmark read from a
JSONL file, registered here and nowhere else, is accepted by a preset, loaded (its problem count
checked), scored by `evaluate_math`, and shown by table_main after Avg. (the paper has no column for it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from test_benchmarks import fake_generator
from test_report import _table, write_fake_results

from rspo import benchmark_catalog as catalog
from rspo import prompts as P
from rspo.eval_config import MATH_BENCHMARK_NAMES, build_eval
from rspo.evaluate import benchmarks as B
from rspo.evaluate import suites as S
from rspo.plan import Plan

ROOT = Path(__file__).resolve().parents[1]
PROBLEMS = [("What is 2+3?", "5"), ("What is 7*6?", "42"), ("What is 10-4?", "6")]


@pytest.fixture
def toy(tmp_path):
    data = tmp_path / "toy.jsonl"
    data.write_text("".join(json.dumps({"problem": p, "answer": a}) + "\n" for p, a in PROBLEMS))
    bench = catalog.register_benchmark(catalog.Benchmark("toy", "math", "Toy (3)", 3, f"file:{data}"))
    yield bench
    del catalog.BENCHMARKS["toy"]


def test_a_benchmark_registered_twice_or_without_a_source_is_refused():
    with pytest.raises(ValueError, match="already registered"):
        catalog.register_benchmark(catalog.Benchmark("aime24", "math", "AIME24", 30, "suite:aime"))
    with pytest.raises(ValueError, match="suite:<split> or file:<path>"):
        catalog.Benchmark("x", "math", "X", 3, "aime")


def test_a_registered_benchmark_is_named_loaded_and_scored(toy, tmp_path):
    assert "toy" in MATH_BENCHMARK_NAMES and build_eval("math", {"benchmarks": ["toy"]}).benchmarks == ("toy",)
    items = B.load_math_benchmark("toy")
    assert [it["id"] for it in items] == ["toy/0", "toy/1", "toy/2"] and items[1]["answer"] == "42"
    gold = {P.math_prompt(p, "qwen_math"): f"So \\boxed{{{a}}}." for p, a in PROBLEMS[:2]}
    res = S.evaluate_math(fake_generator(gold), benchmarks=["toy"], workers=1)
    assert res["benchmarks"]["toy"]["n_problems"] == 3 and res["benchmarks"]["toy"]["pass@1"] == pytest.approx(2 / 3)
    # the file lost a row: refused by the registered count, not scored on fewer problems
    toy.file.write_text(toy.file.read_text().splitlines(keepends=True)[0])
    with pytest.raises(ValueError, match="1 rows, Toy \\(3\\) has 3"):
        B.load_math_benchmark("toy")


def test_a_registered_benchmark_gets_a_column_in_table_main(toy, tmp_path):
    data = yaml.safe_load((ROOT / "configs" / "smoke.yaml").read_text())
    data["preset"] = "toy_study"
    data["grid"] = {"main": {"tasks": ["math"], "methods": ["grpo", "gmpo+rs"]}}
    data.pop("stress", None), data.pop("mismatch", None)
    data["eval"]["math"]["benchmarks"] = ["aime24", "math500", "toy"]
    preset = tmp_path / "toy_study.yaml"
    preset.write_text(yaml.safe_dump(data))
    plan = Plan.from_file(preset)
    write_fake_results(tmp_path / "results", plan)
    md, _ = _table("table_main", preset, tmp_path / "results", tmp_path)
    header = next(line for line in md.splitlines() if line.startswith("| Method") or "Avg." in line)
    assert header.index("AIME24") < header.index("MATH500") < header.index("Avg.") < header.index("Toy (3)")
    assert "Toy (3) has no column in the paper's table" in md
