"""LeetCode problems' tests as functional cases (rspo.data.code.normalise_leetcode): the test is a
Python program, ``def check(candidate): assert candidate(...) == expected``, read with ``ast``
(never run), or, when it is absent, the ``input_output`` examples (``"a = 1, b = [2]"`` -> ``3``).
Keyword arguments are put in the order of the starter code's signature; a case whose values are
not plain literals (ListNode / TreeNode helpers, inf) is skipped."""

from __future__ import annotations

import ast
from typing import Any


def signature_params(starter_code: str, fn_name: str) -> list[str] | None:
    """Parameter names (without self) of ``fn_name`` in a LeetCode starter, or None."""
    src = starter_code.rstrip() + "\n" if starter_code.rstrip().endswith(("pass", "...")) else starter_code + "pass\n"
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == fn_name:
            names = [a.arg for a in node.args.posonlyargs + node.args.args]
            return names[1:] if names and names[0] == "self" else names
    return None


def order_args(args: list, kwargs: dict, params: list[str] | None) -> list | None:
    """Positional args + keyword args in signature order (None if they cannot be ordered)."""
    if not kwargs:
        return args
    if params is None:
        return args + list(kwargs.values())  # keyword order as written (follows the signature)
    rest = params[len(args) :]
    if set(kwargs) != set(rest):
        return None
    return args + [kwargs[p] for p in rest]


def cases_from_test(test_src: str, params: list[str] | None) -> list[dict]:
    """``def check(candidate): assert candidate(...) == expected`` -> functional cases."""
    tree = ast.parse(test_src)
    checks = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    if not checks:
        raise ValueError("no 'def check(candidate)' in test")
    cases = []
    for st in checks[0].body:
        if not (
            isinstance(st, ast.Assert)
            and isinstance(st.test, ast.Compare)
            and len(st.test.ops) == 1
            and isinstance(st.test.ops[0], ast.Eq)
            and isinstance(st.test.left, ast.Call)
            and isinstance(st.test.left.func, ast.Name)
            and st.test.left.func.id == "candidate"
        ):
            continue
        call = st.test.left
        try:
            args = [ast.literal_eval(a) for a in call.args]
            kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
            expected = ast.literal_eval(st.test.comparators[0])
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            continue  # not plain literals (ListNode/TreeNode helpers, inf, ...)
        ordered = order_args(args, kwargs, params)
        if ordered is not None:
            cases.append({"input": ordered, "output": expected})
    return cases


LEETCODE_NAMES = {"true": True, "false": False, "null": None, "True": True, "False": False, "None": None}


def literal(node: ast.AST) -> Any:
    if isinstance(node, ast.Name) and node.id in LEETCODE_NAMES:
        return LEETCODE_NAMES[node.id]
    if isinstance(node, ast.List):
        return [literal(e) for e in node.elts]
    return ast.literal_eval(node)


def cases_from_io(input_output: list, params: list[str] | None) -> list[dict]:
    """``input_output`` fallback: ``{"input": "a = 1, b = [2]", "output": "3"}``."""
    cases = []
    for io in input_output:
        out = io.get("output", "")
        if not isinstance(out, str) or out.startswith("Error") or out.startswith("Execution timed out"):
            continue
        try:
            call = ast.parse(f"f({io['input']})", mode="eval").body
            args = [literal(a) for a in call.args]  # type: ignore[attr-defined]
            kwargs = {k.arg: literal(k.value) for k in call.keywords}  # type: ignore[attr-defined]
            expected = ast.literal_eval(out)
        except (ValueError, TypeError, SyntaxError, KeyError, AttributeError):
            continue
        ordered = order_args(args, kwargs, params)
        if ordered is not None:
            cases.append({"input": ordered, "output": expected})
    return cases
