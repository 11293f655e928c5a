"""rspo.eval_config: the typed evaluation sections of a preset (eval.countdown, eval.math,
eval.code): defaults stated once, constraints checked with the key named, the schema generated
from them, the flags of `rspo evaluate` on top."""

import pytest

from rspo.config import ConfigError
from rspo.eval_config import (
    CODE_BENCHMARK_NAMES,
    MATH_BENCHMARK_NAMES,
    PAPER_MATH_BENCHMARKS,
    CountdownEval,
    build_eval,
    eval_schema,
)


def test_defaults_are_the_dataclasses_and_flags_override_the_preset():
    cd = build_eval("countdown", None)
    assert cd == CountdownEval() and cd.splits == ("val", "val_target") and cd.max_new_tokens == 64
    assert build_eval("math", {}).max_new_tokens == 512 == build_eval("code", {}).max_new_tokens
    cd = build_eval("countdown", {"size": 2000, "n": 4}, {"size": 10})
    assert cd.problems == 10 and cd.samples == 1  # greedy: one sample whatever n says
    assert build_eval("countdown", {"limit": 7}).problems == 7  # the earlier spelling
    assert build_eval("countdown", {"temperature": 0.7, "n": 4}).samples == 4
    assert build_eval("math", None).benchmarks == PAPER_MATH_BENCHMARKS


def test_math_samples_default_to_the_papers_avg_at_32_only_when_nothing_is_set():
    assert build_eval("math", {}).samples_per_benchmark() == {"aime24": 32}
    assert build_eval("math", {"n": 2}).samples_per_benchmark() == {}
    assert build_eval("math", {"aime_samples": 8}).samples_per_benchmark() == {"aime24": 8}
    assert build_eval("math", {"samples": {"amc23": 4}}).samples_per_benchmark() == {"amc23": 4}
    assert build_eval("code", {}).samples_per_benchmark() == {}
    with pytest.raises(ConfigError, match="eval.math: aime_samples and samples.aime24 both given"):
        build_eval("math", {"aime_samples": 8, "samples": {"aime24": 4}})


@pytest.mark.parametrize(
    "family, data, message",
    [
        ("countdown", {"splits": ["train"]}, r"eval.countdown.splits: unknown split 'train'"),
        ("countdown", {"splits": []}, r"eval.countdown.splits: must not be empty"),
        ("countdown", {"splits": ["val", "val"]}, r"eval.countdown.splits: lists an item twice"),
        ("countdown", {"max_new_tokens": 0}, r"eval.countdown.max_new_tokens: must be >= 1, got 0"),
        ("countdown", {"tensor_parallel_size": "all"}, r"eval.countdown.tensor_parallel_size: expected"),
        ("countdown", {"tensor_parallel_size": 0}, r"eval.countdown.tensor_parallel_size: must be >= 1"),
        ("countdown", {"seed": 1}, r"eval.countdown.seed: unknown key"),
        ("math", {"benchmarks": ["humaneval"]}, r"eval.math.benchmarks: unknown math benchmark 'humaneval'"),
        ("math", {"top_p": 2}, r"eval.math.top_p: must lie in \(0, 1\], got 2"),
        ("math", {"samples": {"aime24": 0}}, r"eval.math.samples.aime24: must be >= 1, got 0"),
        ("math", {"template": "chatty"}, r"eval.math.template: unknown template 'chatty'"),
        ("math", {"backend": "sglang"}, r"eval.math.backend: unknown backend 'sglang'"),
        ("code", {"data_paths": {"apps": "x.jsonl"}}, r"eval.code.data_paths.apps: unknown key"),
        ("code", {"revisions": {"mbpp": ""}}, r"eval.code.revisions.mbpp: must not be empty"),
        ("code", {"enable_thinking": "yes"}, r"eval.code.enable_thinking: expected"),
        ("nothing", {}, r"eval.nothing: unknown evaluation family"),
    ],
)
def test_a_bad_setting_is_refused_naming_its_key(family, data, message):
    with pytest.raises(ConfigError, match=message):
        build_eval(family, data)


def test_tensor_parallel_size_is_auto_or_a_count():
    assert build_eval("code", {}).tensor_parallel_size == "auto"
    assert build_eval("code", {"tensor_parallel_size": 4}).tensor_parallel_size == 4


def test_the_benchmark_names_are_those_the_evaluation_can_load():
    from rspo.evaluate import benchmarks as B
    from rspo.report import reference as ref

    assert MATH_BENCHMARK_NAMES == ("aime24", "amc23", "amc22_23", "math500", "minerva", "olympiadbench")
    assert MATH_BENCHMARK_NAMES == tuple(B.MATH_BENCHMARKS)
    assert PAPER_MATH_BENCHMARKS == B.PAPER_MATH_BENCHMARKS == ref.paper_benchmarks("math")
    assert set(CODE_BENCHMARK_NAMES) == set(ref.paper_benchmarks("code")) <= set(B.CODE_BENCHMARKS)
    assert tuple(CODE_BENCHMARK_NAMES) == ("humaneval", "mbpp", "livecodebench")


def test_the_schema_carries_each_constraint():
    props = eval_schema()["properties"]
    cd, math, code = props["countdown"]["properties"], props["math"]["properties"], props["code"]["properties"]
    assert cd["splits"] == {
        "type": "array",
        "uniqueItems": True,
        "items": {"enum": ["val", "val_target"]},
        "minItems": 1,
        "description": "Held-out splits scored",
    }
    assert cd["tensor_parallel_size"]["anyOf"] == [{"type": "integer", "minimum": 1}, {"const": "auto"}]
    samples = {k: v for k, v in math["samples"].items() if k != "description"}  # unset: left out (never null)
    assert samples == {"type": "object", "additionalProperties": {"type": "integer", "minimum": 1}}
    assert math["top_p"]["exclusiveMinimum"] == 0 and math["top_p"]["maximum"] == 1
    assert "aime_samples" in math and "aime_samples" not in code  # math only
    assert code["data_paths"]["additionalProperties"] is False
    assert code["revisions"]["properties"]["mbpp"]["minLength"] == 1
    assert all(p.get("description") for section in props.values() for p in section["properties"].values())
