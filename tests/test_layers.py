"""Import direction inside the library: every module of rspo/ sits on a floor, imports (module-level
and function-level alike) go to the same floor or lower, never up, and there is no import cycle.

The floors, lowest first, are LAYERS below. A new module must be placed on a floor here; moving
a module up or down is a change of this table, reviewed like any other."""

from __future__ import annotations

import ast
from fnmatch import fnmatchcase
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "rspo"

# Lowest floor first. A pattern ending in ".*" covers a subpackage and all its modules.
LAYERS: list[tuple[str, list[str]]] = [
    (
        "helpers without rspo imports",
        [
            "rspo",
            "rspo.jsonl",
            "rspo.seeding",
            "rspo.progress",
            "rspo.distributed",
            "rspo.hub",
            "rspo.chat",
            "rspo.gpu_memory",
            "rspo.gpu_memory.phases",
        ],
    ),
    ("configuration and the planner (no torch)", ["rspo.config", "rspo.plan"]),
    ("prompt templates and verifiers", ["rspo.prompts", "rspo.rewards", "rspo.rewards.*"]),
    ("data sets and tokenizers", ["rspo.data", "rspo.data.*", "rspo.tokenizer"]),
    ("models and the method", ["rspo.models", "rspo.router", "rspo.losses", "rspo.rollout", "rspo.rollout.*"]),
    ("plug-ins for other trainers (TRL)", ["rspo.integrations", "rspo.integrations.*"]),
    (
        "tasks and tracking, and the memory plan, shared by the programs",
        ["rspo.tasks", "rspo.tracking", "rspo.gpu_memory.shape", "rspo.gpu_memory.plan"],
    ),
    (
        "programs (one per command)",
        [
            "rspo.pretrain",
            "rspo.train",
            "rspo.train.*",
            "rspo.evaluate",
            "rspo.evaluate.*",
            "rspo.report",
            "rspo.report.*",
            "rspo.bench",
            "rspo.speed",
            "rspo.parity",
            "rspo.sweep",
            "rspo.mlflow_commands",
            "rspo.archive",
            "rspo.gpu_memory.simulate",
            "rspo.gpu_memory.preflight",
            "rspo.gpu_memory.cli",
        ],
    ),
    ("the command dispatcher", ["rspo.cli", "rspo.__main__"]),
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


VENDORED = PKG / "evaluate" / "data"  # the vendored math evaluation suite is not rspo code
MODULES: dict[str, Path] = {module_name(p): p for p in sorted(PKG.rglob("*.py")) if VENDORED not in p.parents}


def floor(module: str) -> int:
    for i, (_, patterns) in enumerate(LAYERS):
        if any(fnmatchcase(module, pat) for pat in patterns):
            return i
    raise KeyError(module)


def rspo_imports(module: str) -> dict[str, int]:
    """rspo modules imported anywhere in `module` (also inside functions) -> first line number."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), filename=str(path))
    out: dict[str, int] = {}

    def add(name: str, line: int) -> None:
        if name != module:
            out.setdefault(name, line)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "rspo" or alias.name.startswith("rspo."):
                    add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import
                base = module.split(".")
                if path.name != "__init__.py":
                    base = base[:-1]
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target != "rspo" and not target.startswith("rspo."):
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                add(sub if sub in MODULES else target, node.lineno)
    return out


GRAPH = {m: rspo_imports(m) for m in MODULES}


def test_every_module_has_a_floor():
    missing = []
    for m in MODULES:
        try:
            floor(m)
        except KeyError:
            missing.append(m)
    assert not missing, f"place these modules on a floor in tests/test_layers.py LAYERS: {missing}"


def test_every_import_names_an_existing_module():
    unknown = [f"{m}:{line} imports {t}" for m, deps in GRAPH.items() for t, line in deps.items() if t not in MODULES]
    assert not unknown, unknown


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_import_of_a_higher_floor(module):
    mine = floor(module)
    bad = [
        f"{MODULES[module].relative_to(ROOT)}:{line}: {module} (floor {mine}, {LAYERS[mine][0]}) imports "
        f"{target} (floor {floor(target)}, {LAYERS[floor(target)][0]})"
        for target, line in sorted(GRAPH[module].items())
        if target in MODULES and floor(target) > mine
    ]
    assert not bad, "\n".join(bad)


def find_cycle(graph: dict[str, dict[str, int]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None (iterative DFS, white/grey/black)."""
    state: dict[str, int] = {}
    for start in sorted(graph):
        if state.get(start):
            continue
        stack = [(start, iter(sorted(graph[start])))]
        path = [start]
        state[start] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                state[node] = 2
                stack.pop()
                path.pop()
                continue
            if child not in graph:
                continue
            if state.get(child) == 1:
                return path[path.index(child) :] + [child]
            if not state.get(child):
                state[child] = 1
                path.append(child)
                stack.append((child, iter(sorted(graph[child]))))
    return None


def test_no_import_cycle():
    cycle = find_cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_cycle_and_floor_checks_catch_offenders():
    assert find_cycle({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b": 1}, "b": {}, "c": {"a": 1, "b": 1}}) is None
    assert floor("rspo.jsonl") < floor("rspo.tasks") < floor("rspo.evaluate.cli") < floor("rspo.cli")
