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
            "rspo.registry",
            "rspo.method",
            "rspo.benchmark_catalog",
            "rspo.backend_capabilities",
            "rspo.jsonl",
            "rspo.run_record",
            "rspo.subcommand",
            "rspo.seeding",
            "rspo.progress",
            "rspo.distributed",
            "rspo.hub",
            "rspo.chat",
            "rspo.gpu_memory",
            "rspo.phase_memory",
        ],
    ),
    (
        "configuration and the planner (no torch)",
        [
            "rspo.constraints",
            "rspo.config",
            "rspo.eval_config",
            "rspo.pretrain_config",
            "rspo.study_config",
            "rspo.preset",
            "rspo.base_pin",
            "rspo.sweep_file",
            "rspo.grid",
            "rspo.plan",
        ],
    ),
    ("prompt templates and verifiers", ["rspo.prompts", "rspo.rewards", "rspo.rewards.*"]),
    ("data sets and tokenizers", ["rspo.data", "rspo.data.*", "rspo.tokenizer"]),
    (
        "models and the method",
        ["rspo.models", "rspo.router_shift", "rspo.router", "rspo.losses", "rspo.rollout", "rspo.rollout.*"],
    ),
    ("plug-ins for other trainers (TRL)", ["rspo.integrations", "rspo.integrations.*"]),
    (
        "tasks and tracking, and the memory plan, shared by the programs",
        [
            "rspo.tasks",
            "rspo.tasks.*",
            "rspo.tracking",
            "rspo.gpu_memory.shape",
            "rspo.gpu_memory.plan",
            "rspo.gpu_memory.verdict",
            "rspo.gpu_memory.advice",
            "rspo.gpu_memory.budget",
            "rspo.gpu_memory.rollout_time",
            "rspo.gpu_memory.flops",
            "rspo.gpu_memory.driver",
        ],
    ),
    (
        "the library's programs: what each command does",
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
            "rspo.regime_gates",
            "rspo.mlflow_sync",
            "rspo.archive",
            "rspo.archive_pieces",
            "rspo.fetch_data",
            "rspo.gpu_memory.simulate",
            "rspo.gpu_memory.preflight",
        ],
    ),
    ("the commands: parse, load, call the library", ["rspo.commands", "rspo.commands.*"]),
    ("the command dispatcher", ["rspo.cli", "rspo.__main__"]),
]

ENTRY_POINTS = {"rspo.cli", "rspo.__main__", "rspo.rewards.harness", "rspo.gpu_memory.simulate"}
"""Modules outside rspo.commands that hold a `main()`: the dispatcher, the program the code sandbox
runs (rspo.rewards.harness, a standalone script inside the sandbox) and the simulation's worker that
the memory plan launches under torchrun (`python -m rspo.gpu_memory.simulate`)."""


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


# The pure method modules: what they import stays on the lowest floor (the method's vocabulary,
# rspo.method), never the configuration or a command, so a reader of the loss reads only the loss.
PURE = ("rspo.losses", "rspo.router", "rspo.router_shift")


@pytest.mark.parametrize("module", PURE)
def test_the_method_modules_import_only_the_lowest_floor(module):
    bad = {t: line for t, line in GRAPH[module].items() if t in MODULES and floor(t) > 0 and t not in PURE}
    assert not bad, f"{module} imports {bad}: move what it needs into rspo.method (or a pure helper)"


def private_names_used_across(module: str) -> list[str]:
    """`from rspo.x import _name` and `x._name` on an imported rspo module x, in ``module``
    (a leading underscore means: this module's own; dunders aside)."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), filename=str(path))
    aliases: dict[str, str] = {}  # local name -> rspo module it is bound to
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rspo") and not node.level:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                if sub in MODULES:
                    aliases[alias.asname or alias.name] = sub
                elif node.module != module and alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.module}.{alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("rspo.") and alias.asname:
                    aliases[alias.asname] = alias.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and aliases[node.value.id] != module
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {aliases[node.value.id]}.{node.attr}")
    return found


def test_no_module_uses_another_modules_private_names():
    found = [hit for m in sorted(MODULES) for hit in private_names_used_across(m)]
    assert not found, "private names used outside their module (make them public or move the code):\n" + "\n".join(
        found
    )


def commands_defined_in(module: str) -> list[str]:
    """A top-level `main` function and `argparse.ArgumentParser(...)` calls in ``module`` (worker
    loops of the library's own processes, such as rspo.rewards.pool's, are not command lines)."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), filename=str(path))
    found = [
        f"{path.relative_to(ROOT)}:{node.lineno}: def {node.name}"
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name == "main"
    ]
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "ArgumentParser":
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: argparse.ArgumentParser")
    return found


def test_the_command_lines_live_in_rspo_commands():
    """A command's `main()` and parser are in rspo/commands/; the library defines neither (the
    entry points in ENTRY_POINTS aside), and every command of the dispatcher is a module there."""
    from rspo.cli import COMMANDS

    found = [
        hit
        for m in sorted(MODULES)
        if not (m == "rspo.commands" or m.startswith("rspo.commands.")) and m not in ENTRY_POINTS
        for hit in commands_defined_in(m)
    ]
    assert not found, "command lines outside rspo/commands/ (move them there):\n" + "\n".join(found)
    outside = {name: target for name, target in COMMANDS.items() if not target.startswith("rspo.commands.")}
    assert not outside, f"commands dispatched outside rspo.commands: {outside}"
    assert commands_defined_in("rspo.bench") == [] and commands_defined_in("rspo.commands.bench")


ROOM_LINES = 650
"""About 600 lines: a module longer than this says in its docstring why it is one file."""


def test_a_module_over_about_600_lines_says_why_it_is_one_file():
    long = {}
    for m, path in MODULES.items():
        lines = len(path.read_text(encoding="utf-8").splitlines())
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        if lines > ROOM_LINES and "Why one file:" not in doc:
            long[m] = lines
    assert not long, f"split these along their concerns, or say in the docstring 'Why one file: ...': {long}"


def test_cycle_and_floor_checks_catch_offenders():
    assert find_cycle({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b": 1}, "b": {}, "c": {"a": 1, "b": 1}}) is None
    assert (
        floor("rspo.jsonl")
        < floor("rspo.tasks")
        < floor("rspo.evaluate.run")
        < floor("rspo.commands.evaluate")
        < floor("rspo.cli")
    )


def test_docs_architecture_lists_the_floors_of_this_file():
    """docs/architecture.md's floors table is LAYERS: the same floors in the same order, each with
    the same modules."""
    import re

    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- floors: tests/test_layers.py LAYERS -->\n(.*?)<!-- end floors -->", page, re.S)
    assert block, "docs/architecture.md has no floors table"
    rows = [line for line in block.group(1).splitlines() if re.match(r"\| \d+ \|", line)]
    documented = [re.findall(r"`([^`]+)`", row.split("|")[3]) for row in rows]
    assert documented == [patterns for _, patterns in LAYERS], "update docs/architecture.md's floors table"


def test_the_sandboxs_parts_are_reached_through_the_package_only():
    """rspo.rewards.sandbox is one isolation argument split by concern into submodules whose names
    are public to each other (uid leases, the backends' argv, launch and teardown); no module outside
    the package imports them, so none can call around the checks (rspo/rewards/sandbox/__init__.py)."""
    inside = "rspo.rewards.sandbox."
    found = [
        f"{m} imports {target}"
        for m in sorted(MODULES)
        if not m.startswith(inside) and m != "rspo.rewards.sandbox"
        for target in rspo_imports(m)
        if target.startswith(inside)
    ]
    assert not found, found
    assert any(m.startswith(inside) for m in MODULES)  # the package exists: the rule checks something


FOREIGN_WRITES: dict[tuple[str, str], str] = {
    # objects of other libraries, configured where this package builds or wraps them
    ("rspo/archive.py", "info.size"): "tarfile.TarInfo of a member being written",
    ("rspo/archive.py", "info.mtime"): "tarfile.TarInfo of a member being written",
    ("rspo/archive.py", "info.mode"): "tarfile.TarInfo of a member being written",
    ("rspo/commands/launch.py", "config.training_script_args"): "torchrun's LaunchConfig arguments",
    ("rspo/commands/mlflow.py", "args.results"): "the command's own argparse namespace",
    ("rspo/commands/preflight.py", "args.task"): "the command's own argparse namespace",
    ("rspo/gpu_memory/preflight.py", "args.out"): "the program's own argparse namespace",
    ("rspo/data/text_tokenizer.py", "tok.pre_tokenizer"): "a tokenizers.Tokenizer being built",
    ("rspo/data/text_tokenizer.py", "tok.decoder"): "a tokenizers.Tokenizer being built",
    ("rspo/data/text_tokenizer.py", "tok.post_processor"): "a tokenizers.Tokenizer being built",
    ("rspo/data/text_tokenizer.py", "hf.chat_template"): "a transformers tokenizer being built",
    ("rspo/tokenizer.py", "core.pre_tokenizer"): "a tokenizers.Tokenizer being built",
    ("rspo/tokenizer.py", "core.decoder"): "a tokenizers.Tokenizer being built",
    ("rspo/tokenizer.py", "core.post_processor"): "a tokenizers.Tokenizer being built",
    ("rspo/distributed.py", "p.data"): "a torch parameter's storage, swapped in place",
    ("rspo/rollout/fp8.py", "p.data"): "a torch parameter's storage, swapped while the FP8 engine decodes",
    ("rspo/rollout/fp8.py", "params[name].data"): "a torch parameter's storage, restored",
    ("rspo/gpu_memory/simulate.py", "config.architectures"): "a transformers config of the cut model",
    ("rspo/gpu_memory/simulate.py", "config.num_hidden_layers"): "a transformers config of the cut model",
    ("rspo/speed.py", "cfg.num_hidden_layers"): "a transformers config of the benchmark's deep model",
    ("rspo/speed.py", "cfg.layer_types"): "a transformers config of the benchmark's deep model",
    ("rspo/train/checkpoint.py", "config.dtype"): "the transformers config written with the final checkpoint",
    ("rspo/train/policy.py", "model.config.use_cache"): "the transformers config of the model it loads",
    ("rspo/train/chunked_logprobs.py", "head.forward"): "a transformers lm_head wrapped for chunked log-probs",
    ("rspo/train/chunked_logprobs.py", "seen.weight"): "the same wrapper's record of the head's weight",
    ("rspo/report/figures.py", "df.index.name"): "a pandas frame being drawn",
    ("rspo/rollout/vllm.py", "method.moe_kernel"): "vLLM's quantization method object, its kernel chosen",
    ("rspo/speed.py", "trainer._generate_and_score_completions"): "TRL's GRPOTrainer method, timed",
    # this package's own objects, each written by the code that owns it
    ("rspo/rewards/pool.py", "w.task"): "the pool's own record of a worker",
    ("rspo/rewards/pool.py", "w.deadline"): "the pool's own record of a worker",
    ("rspo/rewards/pool.py", "w.done"): "the pool's own record of a worker",
    ("rspo/rewards/pool.py", "w.ready"): "the pool's own record of a worker",
    ("rspo/rewards/sandbox/backends.py", "UidLease._next"): "the class's own counter",
    ("rspo/rollout/__init__.py", "generate_fn.settings"): "a function it defines, labelled",
    ("rspo/rollout/__init__.py", "generate_fn.tokenizer"): "a function it defines, labelled",
    ("rspo/train/time_limit.py", "tl.counted_from"): "the classmethod constructor's new instance",
    ("rspo/train/time_limit.py", "tl.deadline"): "the classmethod constructor's new instance",
    (
        "rspo/gpu_memory/simulate.py",
        "trainer.policy.optimizer.zero_grad",
    ): "the keep-grads fault the simulation injects",
}
"""Every assignment to an attribute of an object other than ``self`` in rspo/, with why it is
allowed. A module changes another object of this package through that object's methods."""


def attribute_writes(path: Path) -> set[str]:
    """``x.attr = ...`` (also augmented and annotated) in ``path`` whose object is not self/cls."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for target in targets:
            for e in ast.walk(target):
                if isinstance(e, ast.Attribute) and isinstance(e.ctx, ast.Store):
                    if isinstance(e.value, ast.Name) and e.value.id in ("self", "cls"):
                        continue
                    found.add(ast.unparse(e))
    return found


def test_no_module_assigns_to_another_objects_attributes():
    found = {(str(p.relative_to(ROOT)), w) for p in MODULES.values() for w in attribute_writes(p)}
    new = sorted(found - FOREIGN_WRITES.keys())
    assert not new, "attribute writes to another object (call a method of its owner instead):\n" + "\n".join(
        f"{f}: {w}" for f, w in new
    )
    assert not FOREIGN_WRITES.keys() - found, f"stale entries: {sorted(FOREIGN_WRITES.keys() - found)}"


def test_the_attribute_write_check_catches_an_offender(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f(t):\n    t.step += 1\n    t.tracker = None\n    self.x = 1\n    self.a.b = 2\n")
    assert attribute_writes(bad) == {"t.step", "t.tracker", "self.a.b"}


def test_the_rl_step_reads_on_one_screen():
    """Trainer.train_step: rollout -> advantages -> old pass -> update -> sync -> metrics, in at most
    25 lines (the parts it calls hold the rest: rspo.train.policy, .update, .step_metrics)."""
    tree = ast.parse(MODULES["rspo.train.trainer"].read_text(encoding="utf-8"))
    (fn,) = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "train_step"]
    assert fn.end_lineno - fn.lineno + 1 <= 25, f"train_step is {fn.end_lineno - fn.lineno + 1} lines"
