"""Presets, the preset JSON schema and the conda environments: every preset validates and resolves,
the schema does not drift from the dataclasses and key sets of the library, the paper presets
carry the paper's hyperparameters with a comment naming the section, bad values name the key."""

from __future__ import annotations

import copy
import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from rspo import config as rcfg
from rspo.grid import BEYOND_PAPER_ROWS
from rspo.plan import Plan, validate_preset
from rspo.preset import Preset
from rspo.study_config import GRID_FAMILIES

ROOT = Path(__file__).resolve().parents[1]
SCHEMA_FILE = ROOT / "workflow" / "schemas" / "preset.schema.yaml"
SCHEMA = yaml.safe_load(SCHEMA_FILE.read_text())
PRESETS = ["smoke", "small", "paper_small", "paper_large_math", "paper_large_code"]


def load(name: str) -> dict:
    return yaml.safe_load((ROOT / "configs" / f"{name}.yaml").read_text())


@pytest.mark.parametrize("name", PRESETS)
def test_preset_validates_and_every_run_resolves(name):
    preset = load(name)
    assert preset["preset"] == name
    validate_preset(preset, SCHEMA_FILE, where=name)
    plan = Plan(preset)
    plan.check()
    assert plan.runs and plan.targets()


# ---------------------------------------------------------------------------- schema drift


@pytest.mark.parametrize("section", sorted(rcfg.SECTIONS))
def test_schema_rl_sections_match_dataclasses(section):
    props = SCHEMA["$defs"]["rl"]["properties"][section]["properties"]
    fields = {f.name for f in dataclasses.fields(rcfg.SECTIONS[section])}
    assert set(props) == fields


_JSON_TYPES = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    type(None): "null",
    dict: "object",
    tuple: "array",
    list: "array",
}


def _resolve(prop: dict) -> dict:
    """A schema property with its $ref (into $defs) followed."""
    while "$ref" in prop:
        prop = {**SCHEMA["$defs"][prop["$ref"].rsplit("/", 1)[-1]], **{k: v for k, v in prop.items() if k != "$ref"}}
    return prop


def _schema_types(prop: dict) -> set[str]:
    """The JSON types a schema property admits (from type, enum or const)."""
    prop = _resolve(prop)
    if "type" in prop:
        return set([prop["type"]] if isinstance(prop["type"], str) else prop["type"])
    values = prop.get("enum", [prop["const"]] if "const" in prop else None)
    assert values is not None, f"schema property without type, enum or const: {prop}"
    return {_JSON_TYPES[type(v)] for v in values}


def _check_compatible(key: str, tp, prop: dict) -> None:
    """The schema property admits exactly the JSON types of the annotation tp (an integer schema
    fits a float field: JSON integers are numbers), recursing into dict values and tuple items."""
    import types
    import typing

    args = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)
    wanted = {_JSON_TYPES[typing.get_origin(a) or a] for a in args}
    got = _schema_types(prop)
    widened = got | ({"number"} if "integer" in got else set())
    assert got <= wanted | ({"integer"} if "number" in wanted else set()), f"{key}: schema {got} vs field {tp}"
    assert wanted <= widened, f"{key}: field {tp} admits {wanted - widened}, the schema does not"
    prop = _resolve(prop)
    origin = typing.get_origin(tp)
    if origin is dict:
        _check_compatible(f"{key}.*", typing.get_args(tp)[1], prop["additionalProperties"])
    elif origin is tuple:
        items = typing.get_args(tp)
        assert prop.get("minItems") == prop.get("maxItems") == len(items), f"{key}: expected {len(items)} items"
        for i, item in enumerate(items):
            _check_compatible(f"{key}[{i}]", item, prop["items"])


@pytest.mark.parametrize("section", sorted(rcfg.SECTIONS))
def test_schema_rl_types_match_dataclass_fields(section):
    """Every field of the section's dataclass is in the schema with a compatible type, and the
    schema has no key without a field: the schema file cannot drift from rspo/config.py (its `rl`
    sections are generated: scripts/preset_schema.py)."""
    import typing

    cls = rcfg.SECTIONS[section]
    props = SCHEMA["$defs"]["rl"]["properties"][section]["properties"]
    hints = typing.get_type_hints(cls)
    fields = [f.name for f in dataclasses.fields(cls)]
    assert not set(props) - set(fields), f"schema keys without a field: {sorted(set(props) - set(fields))}"
    assert not set(fields) - set(props), f"fields missing from the schema: {sorted(set(fields) - set(props))}"
    for name in fields:
        _check_compatible(f"rl.{section}.{name}", hints[name], props[name])


def test_dataclass_defaults_pass_the_schema():
    import json

    rl = json.loads(json.dumps({name: dataclasses.asdict(cls()) for name, cls in rcfg.SECTIONS.items()}))
    validate_preset({"preset": "defaults", "rl": rl}, SCHEMA_FILE, where="defaults")


def test_schema_enums_match_library_constants():
    defs = SCHEMA["$defs"]
    grid = defs["grid"]["properties"]
    assert tuple(grid["plugin"]["properties"]["algos"]["items"]["enum"]) == rcfg.ALGOS
    for family in ("countdown", "math", "code"):
        assert tuple(defs["eval"]["properties"][family]["properties"]["backend"]["enum"]) == rcfg.BACKENDS
    rl = defs["rl"]["properties"]
    assert tuple(rl["algorithm"]["properties"]["routing"]["enum"]) == rcfg.ROUTING_MODES
    assert tuple(rl["data"]["properties"]["task"]["enum"]) == rcfg.TASKS
    assert tuple(grid) == GRID_FAMILIES
    modes = set(grid["routing"]["properties"]["modes"]["items"]["enum"])
    assert modes == set(rcfg.ROUTING_MODES) | set(BEYOND_PAPER_ROWS)  # the paper's controls and the rows beyond it


def test_schema_countdown_pretrain_model_keys_match_library():
    from rspo.data.countdown import CountdownConfig
    from rspo.pretrain_config import ArchConfig, PretrainConfig

    props, defs = SCHEMA["properties"], SCHEMA["$defs"]
    assert props["countdown"]["$ref"] == "#/$defs/countdown"  # generated from the class (scripts/preset_schema.py)
    assert set(defs["countdown"]["properties"]) == {f.name for f in dataclasses.fields(CountdownConfig)}
    assert set(props["pretrain"]["properties"]) == {f.name for f in dataclasses.fields(PretrainConfig)}
    assert props["pretrain"]["properties"]["model"]["$ref"] == props["pretrain"]["properties"]["text_model"]["$ref"]
    assert set(defs["arch"]["properties"]) == {f.name for f in dataclasses.fields(ArchConfig)}


def test_every_reference_of_the_schema_names_one_of_its_defs():
    def refs(node):
        if isinstance(node, dict):
            yield from ([node["$ref"]] if "$ref" in node else [])
            for v in node.values():
                yield from refs(v)
        elif isinstance(node, list):
            for v in node:
                yield from refs(v)

    found = set(refs(SCHEMA))
    assert found == {f"#/$defs/{name}" for name in SCHEMA["$defs"]}, found  # every def is used, every ref resolves


# ---------------------------------------------------------------------------- bad values name the key


@pytest.mark.parametrize(
    "edit,key",
    [
        (lambda d: d.update(sedes=[0]), "sedes: unknown key"),
        (lambda d: d["rl"]["algorithm"].update(algo="ppo"), "rl.algorithm.algo: 'ppo' is not one of"),
        (lambda d: d["rl"]["algorithm"].update(gamma_min=0), "rl.algorithm.gamma_min: 0 is less than or equal"),
        (lambda d: d["rl"]["optim"].update(lr="1e-6"), "rl.optim.lr: '1e-6' is not of type 'number'"),
        (lambda d: d["grid"].update(sweep={}), "grid.sweep: unknown key"),
        (lambda d: d["grid"]["routing"].update(modes=["freeze", "replay"]), "grid.routing.modes[1]"),
        (lambda d: d.update(seeds=[]), "seeds: [] should be non-empty"),
        (lambda d: d["countdown"].update(num_numbers=7), "countdown.num_numbers: 7 is greater than the maximum of 5"),
        (lambda d: d["pretrain"]["model"].update(experts=8), "pretrain.model.experts: unknown key"),
        (lambda d: d.update(resources={"train": {"gpus": 1}}), "resources.train.gpus: unknown key"),
    ],
)
def test_schema_errors_name_the_key(edit, key):
    preset = copy.deepcopy(load("small"))
    edit(preset)
    with pytest.raises(rcfg.ConfigError) as e:
        validate_preset(preset, SCHEMA_FILE, where="configs/small.yaml")
    assert str(e.value).startswith("configs/small.yaml: ")
    assert key in str(e.value)


def test_cross_field_errors_are_caught_before_jobs(tmp_path):
    preset = copy.deepcopy(load("small"))
    preset["rl"]["schedule"]["mini_batch_prompts"] = 5  # does not divide prompts_per_step = 32
    validate_preset(preset, SCHEMA_FILE)  # the schema alone accepts it
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(preset))
    with pytest.raises(rcfg.ConfigError, match="rl.schedule.mini_batch_prompts"):
        Plan(preset).check()


# ---------------------------------------------------------------------------- the paper presets


def _commented(name: str, pattern: str) -> str:
    """The preset line matching `pattern`; it must carry a comment naming a paper section."""
    for line in (ROOT / "configs" / f"{name}.yaml").read_text().splitlines():
        if re.search(pattern, line.split("#")[0]):
            return line
    raise AssertionError(f"{name}: no line matches {pattern!r}")


SECTION = re.compile(r"#.*\b(Sec\.|App\.)")


def test_paper_small_is_the_papers_countdown_setting():
    p = load("paper_small")
    m = p["pretrain"]["model"]
    assert (m["arch"], m["num_layers"], m["num_experts"], m["top_k"]) == ("qwen2_moe", 12, 8, 1)  # App. A
    s = p["rl"]["schedule"]
    assert (s["prompts_per_step"], s["mini_batch_prompts"]) == (256, 64)  # App. A
    assert p["rl"]["rollout"]["group_size"] == 8 and p["rl"]["rollout"]["max_new_tokens"] == 8192
    assert p["rl"]["algorithm"]["gamma_min"] == 0.8 and p["rl"]["algorithm"]["stop_gradient"] is True
    assert p["countdown"]["num_numbers"] == 4 and p["seeds"] == [0, 1, 2]
    assert p["grid"]["gamma_min"]["values"] == [0.2, 0.5, 0.8]
    for pat in (
        r"num_layers: 12",
        r"num_experts: 8",
        r"top_k: 1",
        r"prompts_per_step: 256",
        r"mini_batch_prompts: 64",
        r"group_size: 8",
        r"max_new_tokens: 8192",
        r"gamma_min: 0\.8",
        r"seeds:",
    ):
        assert SECTION.search(_commented("paper_small", pat)), pat
    assert Plan(p).uses_gpu and Plan(p).resources("train")["gpu"] >= 1


@pytest.mark.parametrize("name,task", [("paper_large_math", "math"), ("paper_large_code", "code")])
def test_paper_large_is_the_papers_qwen3_setting(name, task):
    p = load(name)
    plan = Plan(p)
    assert plan.hub_model(task) == "Qwen/Qwen3-30B-A3B"
    assert p["grid"] == {"main": {"tasks": [task], "methods": ["grpo", "gspo", "gmpo", "gmpo+rs"]}}
    s = p["rl"]["schedule"]
    assert (s["prompts_per_step"], s["mini_batch_prompts"]) == (128, 64)  # App. A
    assert p["rl"]["rollout"]["group_size"] == 8 and p["rl"]["rollout"]["max_new_tokens"] == 8192
    assert p["rl"]["rollout"]["backend"] == "vllm" and plan.resources("train")["gpu"] > 1
    assert plan.prepare_source(task) == "hub"
    for pat in (
        r"path: Qwen/Qwen3-30B-A3B",
        r"prompts_per_step: 128",
        r"mini_batch_prompts: 64",
        r"group_size: 8",
        r"max_new_tokens: 8192",
        r"gamma_min: 0\.8",
        r"seeds:",
    ):
        assert SECTION.search(_commented(name, pat)), pat
    # no pretraining and no Countdown in the large presets; Table 1 and Fig. 2 (+ Figs. 6/7 from main)
    assert set(plan.targets()) == {"fig2_reward_large", "fig6_mechanism", "fig7_entropy", "table_main"}


SOURCED = re.compile(r"#.*(\b(Sec\.|App\.)|Qwen3 card|not in the paper)")


@pytest.mark.parametrize("name,task", [("paper_large_math", "math"), ("paper_large_code", "code")])
def test_paper_large_evaluates_table1_as_its_numbers_were_measured(name, task):
    """Chat template, thinking on, Qwen3's thinking-mode sampling, the paper's / card's budget,
    AIME24 over 32 runs, AMC23's 40 problems; each value's line says where it comes from, and the
    runs train in the same template and mode."""
    p = load(name)
    e = p["eval"][task]
    assert (e["template"], e["enable_thinking"]) == ("chat", True)
    assert (e["temperature"], e["top_p"], e["top_k"]) == (0.6, 0.95, 20)
    assert e["max_new_tokens"] == {"math": 38912, "code": 32768}[task]
    if task == "math":
        assert e["benchmarks"] == ["aime24", "amc23", "math500", "minerva", "olympiadbench"]
        assert e["samples"] == {"aime24": 32}
    for key in ("template", "enable_thinking", "temperature", "top_p", "top_k", "max_new_tokens", "seed"):
        assert SOURCED.search(_commented(name, rf"^    {key}:")), key
    assert (p["rl"]["data"]["template"], p["rl"]["data"]["enable_thinking"]) == ("chat", True)
    from rspo.evaluate.run import decoding_of

    d = decoding_of(Preset(p).evaluation(task))
    assert d.samples_for("aime24") == (32 if task == "math" else 1) and not d.greedy


def test_cpu_presets_use_no_gpu():
    for name in ("smoke", "small"):
        plan = Plan(load(name))
        assert not plan.uses_gpu
        assert all(plan.resources(k)["gpu"] == 0 for k in ("pretrain", "train", "evaluate"))


# The conda environments, the GPU stack's pins and its resolution on the public index are the locks'
# (tests/test_locks.py).


def test_the_schema_file_is_generated_whole_from_the_dataclasses():
    """workflow/schemas/preset.schema.yaml is what scripts/preset_schema.py writes from the sections'
    dataclasses (types, constraints, docstrings; no hand-written block): run it after changing a setting."""
    import subprocess
    import sys

    check = subprocess.run(
        [sys.executable, "scripts/preset_schema.py", "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert check.returncode == 0, check.stderr
