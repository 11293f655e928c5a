"""A setting's constraints, stated once: on its dataclass field (``setting``), read both by the check
that runs when a config is built (``check_fields``) and by the JSON schema of the preset file
(``section_schema``: workflow/schemas/preset.schema.yaml is generated whole from the sections'
dataclasses, ``rspo.study_config.preset_schema``; ``scripts/preset_schema.py`` writes it and a test
compares).

A constraint is a bound (``ge``, ``gt``, ``le``, ``lt``; on each item of a tuple), a set of
``choices`` (of each item of a list: ``tuple[str, ...]``), ``nonempty`` for a string or a list, or a
``pattern`` a string must match. A list (``tuple[X, ...]``) has no repeated item; a field that is
itself a section (a dataclass) is a closed mapping of its own fields (absent: None, never ``null``
in the file), and a field without a default is required. An overlay (a mapping merged onto a section
later, such as a task's overlay of `rl`) names the schema it follows with ``ref``: its property is
``$ref: "#/$defs/<ref>"``. Checks that relate two fields, or that need to say why
(``rollout.top_p`` must be 1 for training), stay in each section's ``checks``. A field's schema
description is the first sentence of its docstring in the source.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import textwrap
import types
import typing
from typing import Any

import yaml

from rspo.method import ConfigError


def setting(
    default: Any,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    choices: tuple | None = None,
    noun: str = "value",
    nonempty: bool = False,
    pattern: str | None = None,
    ref: str | None = None,
) -> Any:
    """A dataclass field with its constraints (``noun`` names a choice in the error: "unknown
    backend 'x'; choose one of [...]"). ``default=REQUIRED``: the key must be given."""
    meta: dict[str, Any] = {"ge": ge, "gt": gt, "le": le, "lt": lt, "choices": choices, "nonempty": nonempty}
    meta.update(pattern=pattern, ref=ref)
    meta = {k: v for k, v in meta.items() if v is not None and v is not False}
    if choices is not None:
        meta["noun"] = noun
    if default is REQUIRED:
        return dataclasses.field(metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


REQUIRED: Any = object()  # setting(REQUIRED, ...): a field without a default, a required key


def _interval(m: dict[str, Any]) -> str:
    lo = f"[{m['ge']:g}" if "ge" in m else f"({m['gt']:g}" if "gt" in m else None
    hi = f"{m['le']:g}]" if "le" in m else f"{m['lt']:g})" if "lt" in m else None
    if lo and hi:
        return f"must lie in {lo}, {hi}"
    op, bound = next((op, m[k]) for k, op in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")) if k in m)
    return f"must be {op} {bound:g}"


def _outside(m: dict[str, Any], v: float) -> bool:
    return (
        ("ge" in m and not v >= m["ge"])
        or ("gt" in m and not v > m["gt"])
        or ("le" in m and not v <= m["le"])
        or ("lt" in m and not v < m["lt"])
    )


def check_fields(obj: Any, prefix: str) -> None:
    """Every field constraint of the dataclass instance ``obj``; ConfigError names the key
    (``rl.rollout.group_size: must be >= 2, got 1``). None passes (an optional setting left unset)."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        m, v, key = f.metadata, getattr(obj, f.name), f"{prefix}.{f.name}"
        if isinstance(v, Section):
            v.validate(key)
            continue
        if _is_list(hints[f.name]) and v is not None and len(set(v)) != len(v):
            raise ConfigError(f"{key}: lists an item twice: {list(v)}")
        if not m or v is None:
            continue
        if "choices" in m:
            for item in v if _is_list(hints[f.name]) else (v,):
                if item not in m["choices"]:
                    raise ConfigError(f"{key}: unknown {m['noun']} {item!r}; choose one of {list(m['choices'])}")
        if m.get("nonempty") and not v:
            raise ConfigError(f"{key}: must not be empty")
        if "pattern" in m and not re.search(m["pattern"], v):
            raise ConfigError(f"{key}: {v!r} does not match {m['pattern']}")
        items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, tuple) else [(None, v)]
        for i, item in items:
            if isinstance(item, (int, float)) and not isinstance(item, bool) and _outside(m, item):
                where = key if i is None else f"{key}.{i}" if isinstance(v, dict) else f"{key}[{i}]"
                raise ConfigError(f"{where}: {_interval(m)}, got {item}")


class Section:
    """Base of a config section (a frozen dataclass): ``validate`` checks every field's constraints,
    then the section's own checks across fields (``checks``)."""

    def validate(self, prefix: str) -> None:
        check_fields(self, prefix)
        self.checks(prefix)

    def checks(self, prefix: str) -> None:
        """Checks that relate fields, or that need to say why; none by default."""


# ----------------------------------------------------------------------------- the JSON schema

_JSON = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null"}
_BOUNDS = {"ge": "minimum", "gt": "exclusiveMinimum", "le": "maximum", "lt": "exclusiveMaximum"}


def _is_list(tp: Any) -> bool:
    """``tuple[X, ...]`` (or an optional one): a list of any length (a fixed tuple is a pair, a triple ...)."""
    tp = _optional(tp)
    return typing.get_origin(tp) is tuple and typing.get_args(tp)[-1:] == (Ellipsis,)


def _optional(tp: Any) -> Any:
    """``X`` of ``X | None`` where X is a list, a mapping or a section (unset: None; the file leaves the
    key out); any other type as it is (``int | None`` admits null in the file)."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and len(args) == 2 and type(None) in args:
        (inner,) = [a for a in args if a is not type(None)]
        if inner not in _JSON and typing.get_origin(inner) is not typing.Literal:
            return inner
    return tp


def _type_schema(tp: Any) -> dict[str, Any]:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if _optional(tp) is not tp:  # an optional list, mapping or section: absent, not null
        return _type_schema(_optional(tp))
    if origin in (typing.Union, types.UnionType):
        if all(a in _JSON for a in args):
            return {"type": [_JSON[a] for a in args]}
        return {"anyOf": [_type_schema(a) for a in args]}
    if origin is typing.Literal:
        return {"const": args[0]} if len(args) == 1 else {"enum": list(args)}
    if origin is dict:
        return {"type": "object", "additionalProperties": _type_schema(args[1])}
    if _is_list(tp):
        return {"type": "array", "uniqueItems": True, "items": _type_schema(args[0])}
    if origin is tuple:
        (item,) = set(args)
        return {"type": "array", "minItems": len(args), "maxItems": len(args), "items": _type_schema(item)}
    if dataclasses.is_dataclass(tp):
        return section_schema(tp)
    return {"type": _JSON[tp]}


def _bounded(p: dict[str, Any]) -> dict[str, Any]:
    """The part of a property schema that a bound applies to: an array's items, a mapping's values,
    the numeric branch of an alternative (``int | Literal["auto"]``)."""
    for branch in p.get("anyOf", ()):
        if branch.get("type") not in (None, "null"):
            return _bounded(branch)
    if p.get("type") == "array":
        return p["items"]
    if p.get("type") == "object" and isinstance(p.get("additionalProperties"), dict):
        return p["additionalProperties"]
    return p


def field_docs(cls: type) -> dict[str, str]:
    """The first sentence of each field's docstring (the string literal under it in the class body;
    a sentence ends at a full stop followed by a capital or a parenthesis)."""
    docs: dict[str, str] = {}
    for base in reversed(cls.__mro__[1:]):  # a section's fields inherited from another section
        if dataclasses.is_dataclass(base):
            docs.update(field_docs(base))
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    for node, nxt in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            text = " ".join(nxt.value.value.split())
            docs[node.target.id] = re.split(r"(?<=\.)\s+(?=[A-Z(])", text, maxsplit=1)[0].rstrip(".")
    return docs


def section_schema(cls: type) -> dict[str, Any]:
    """The JSON schema of one config section: a closed mapping, each field with its type, its
    constraints and the first sentence of its docstring."""
    hints, docs = typing.get_type_hints(cls), field_docs(cls)
    props: dict[str, Any] = {}
    required = [f.name for f in dataclasses.fields(cls) if _required(f)]
    for f in dataclasses.fields(cls):
        m = f.metadata
        if "ref" in m:
            props[f.name] = {"$ref": f"#/$defs/{m['ref']}", **({"description": docs[f.name]} if f.name in docs else {})}
            continue
        p = _type_schema(hints[f.name])
        if "choices" in m:
            enum = {"enum": list(m["choices"])}
            p = {**p, "items": enum} if _is_list(hints[f.name]) else enum
        _bounded(p).update({_BOUNDS[k]: m[k] for k in _BOUNDS if k in m})
        if m.get("nonempty"):
            p["minItems" if p.get("type") == "array" else "minLength"] = 1
        if "pattern" in m:
            p["pattern"] = m["pattern"]
        if f.name in docs:
            p["description"] = docs[f.name]
        props[f.name] = p
    return {
        "type": "object",
        "additionalProperties": False,
        **({"required": required} if required else {}),
        "properties": props,
    }


def _required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


GENERATED = "# Generated from the dataclasses by `python scripts/preset_schema.py`: do not edit by hand."


class _SchemaDumper(yaml.SafeDumper):
    """Mappings in block style, lists (enums, type pairs) on one line."""


_SchemaDumper.add_representer(
    list, lambda dumper, data: dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=True)
)


def schema_file_text(schema: dict[str, Any]) -> str:
    """A generated schema file: the ``GENERATED`` line, then ``schema`` in YAML (keys in order)."""
    body = yaml.dump(schema, Dumper=_SchemaDumper, sort_keys=False, width=100, allow_unicode=True)
    return GENERATED + "\n" + body
