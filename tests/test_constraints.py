"""rspo.constraints: a setting's constraints are stated once, on its field, and both the config check
and the preset schema enforce exactly them: for every constrained field of every rl section, a
value just outside its bounds (or not among its choices) is refused by `train_config_from_dict` and
by the schema, each naming the key, and the value at an inclusive bound is accepted by both."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest

from rspo import config as rcfg
from rspo.constraints import GENERATED, REQUIRED, Section, field_docs, schema_file_text, section_schema, setting
from rspo.method import ConfigError
from rspo.plan import validate_preset

ROOT = Path(__file__).resolve().parents[1]
SCHEMA_FILE = ROOT / "workflow" / "schemas" / "preset.schema.yaml"


def constrained() -> list[tuple[str, str, dict]]:
    return [
        (section, f.name, dict(f.metadata))
        for section, cls in rcfg.SECTIONS.items()
        for f in dataclasses.fields(cls)
        if f.metadata
    ]


def outside(meta: dict, tp) -> object:
    """A value the constraint refuses."""
    if "choices" in meta:
        return "no-such-choice"
    if meta.get("nonempty"):
        return ""
    integer = tp is int
    if "ge" in meta:
        return meta["ge"] - (1 if integer else 0.5)
    if "gt" in meta:
        return meta["gt"] - (0 if integer else 0.0)
    if "le" in meta:
        return meta["le"] + 1
    return meta["lt"]


def as_rl(section: str, name: str, value, tp) -> dict:
    if typing.get_origin(tp) is tuple:  # a bound applies to each item
        value = [value] * len(typing.get_args(tp))
    return {section: {name: value}}


@pytest.mark.parametrize("section,name,meta", constrained(), ids=[f"{s}.{n}" for s, n, _ in constrained()])
def test_a_value_outside_a_fields_constraint_is_refused_by_the_config_and_the_schema(section, name, meta):
    tp = typing.get_type_hints(rcfg.SECTIONS[section])[name]
    base = (
        typing.get_args(tp)[0]
        if typing.get_origin(tp) in (tuple, typing.Union) or type(None) in typing.get_args(tp)
        else tp
    )
    rl = as_rl(section, name, outside(meta, base), tp)
    key = f"rl.{section}.{name}"
    with pytest.raises(ConfigError, match=rf"^{key}(\[0\])?: "):
        rcfg.train_config_from_dict(rl)
    with pytest.raises(ConfigError, match=rf"{key}"):
        validate_preset({"preset": "p", "rl": rl}, SCHEMA_FILE, where="p")


INCLUSIVE = [
    (section, name, meta)
    for section, name, meta in constrained()
    if ("ge" in meta or "le" in meta) and (section, name) != ("rollout", "top_p")  # top_p: 1 only, its own check
]


@pytest.mark.parametrize("section,name,meta", INCLUSIVE, ids=[f"{s}.{n}" for s, n, _ in INCLUSIVE])
def test_the_inclusive_bound_is_accepted_by_both(section, name, meta):
    tp = typing.get_type_hints(rcfg.SECTIONS[section])[name]
    rl = as_rl(section, name, meta.get("ge", meta.get("le")), tp)
    if (section, name) == ("schedule", "prompts_per_step"):  # 1 prompt: a mini-batch of 1 divides it
        rl["schedule"]["mini_batch_prompts"] = 1
    rcfg.train_config_from_dict(rl)
    validate_preset({"preset": "p", "rl": rl}, SCHEMA_FILE, where="p")


def test_messages_name_the_key_the_bound_and_the_value():
    with pytest.raises(ConfigError, match=r"^rl\.rollout\.group_size: must be >= 2, got 1$"):
        rcfg.train_config_from_dict({"rollout": {"group_size": 1}})
    with pytest.raises(ConfigError, match=r"^rl\.optim\.betas\[1\]: must lie in \[0, 1\), got 1\.0$"):
        rcfg.train_config_from_dict({"optim": {"betas": [0.9, 1.0]}})
    with pytest.raises(ConfigError, match=r"^rl\.algorithm\.algo: unknown algorithm 'ppo'; choose one of "):
        rcfg.train_config_from_dict({"algorithm": {"algo": "ppo"}})
    with pytest.raises(ConfigError, match=r"^rl\.tracking\.experiment: must not be empty$"):
        rcfg.train_config_from_dict({"tracking": {"experiment": ""}})
    rcfg.train_config_from_dict({"algorithm": {"clip_low": None}})  # an optional setting left unset


def test_field_docs_are_first_sentences():
    docs = field_docs(rcfg.ScheduleConfig)
    assert docs["total_steps"] == "Rollout steps"
    assert (
        docs["micro_batch_size"] == "Responses per forward/backward for gradient accumulation; 0 = the whole mini-batch"
    )
    assert "clip_high" not in field_docs(rcfg.AlgorithmConfig)  # no docstring, no description


@dataclasses.dataclass(frozen=True)
class _Overlays(Section):
    name: str = setting(REQUIRED, pattern=r"^[a-z]+$")
    """A name."""
    over: dict | None = setting(None, ref="rl")
    """An overlay of rl."""
    many: tuple[str, ...] | None = setting(None, choices=("a", "b"), nonempty=True)
    """Some of a and b."""


def test_a_required_key_a_pattern_a_reference_and_an_optional_list():
    schema = section_schema(_Overlays)
    assert schema["required"] == ["name"]
    props = schema["properties"]
    assert props["name"] == {"type": "string", "pattern": "^[a-z]+$", "description": "A name"}
    assert props["over"] == {"$ref": "#/$defs/rl", "description": "An overlay of rl"}
    assert props["many"]["items"] == {"enum": ["a", "b"]} and props["many"]["minItems"] == 1  # unset: absent, not null
    with pytest.raises(TypeError):
        _Overlays()  # the required key
    _Overlays("x", many=("a",)).validate("s")
    with pytest.raises(ConfigError, match=r"s.name: 'X1' does not match \^\[a-z\]\+\$"):
        _Overlays("X1").validate("s")
    with pytest.raises(ConfigError, match=r"s.many: unknown value 'c'"):
        _Overlays("x", many=("a", "c")).validate("s")
    with pytest.raises(ConfigError, match=r"s.many: must not be empty"):
        _Overlays("x", many=()).validate("s")
    assert schema_file_text({"a": [1, 2]}) == GENERATED + "\na: [1, 2]\n"
