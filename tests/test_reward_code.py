"""Code reward (rspo.rewards.code) on the sandbox's default backend."""

from __future__ import annotations

import threading

import pytest

from rspo.rewards.code import extract_code, outputs_match, score, score_batch, score_completion
from rspo.rewards.sandbox import BACKENDS, Limits, run_python, sandbox_backend, sandbox_info


def stdin_tests(*pairs, timeout=2.0, memory_mb=256):
    return {
        "kind": "stdin",
        "cases": [{"input": i, "output": o} for i, o in pairs],
        "timeout": timeout,
        "memory_mb": memory_mb,
    }


def fn_tests(fn_name, *pairs, timeout=2.0):
    return {
        "kind": "functional",
        "fn_name": fn_name,
        "cases": [{"input": i, "output": o} for i, o in pairs],
        "timeout": timeout,
        "memory_mb": 256,
    }


ADD_PAIRS = [("1 2\n", "3\n"), ("10 -4\n", "6"), ("0 0", "0\n")]
ADD = stdin_tests(*ADD_PAIRS)


def test_backend_is_reported():
    assert sandbox_backend() in BACKENDS
    info = sandbox_info()
    assert info["backend"] == sandbox_backend() and info["python"]


# ------------------------------------------------------------------------------ stdin
def test_stdin_pass_with_input_and_sys_stdin_variants():
    assert score("a, b = map(int, input().split())\nprint(a + b)", ADD) == (1.0, "ok")
    assert score("import sys\nprint(sum(map(int, sys.stdin.buffer.read().split())))", ADD) == (1.0, "ok")
    assert score("print(sum(map(int, open(0).read().split())))", ADD) == (1.0, "ok")
    # LCB's prelude provides `stdin` (from sys import *) and the common modules.
    assert score("print(sum(map(int, stdin.readline().split())))", ADD) == (1.0, "ok")
    assert score(
        "def main():\n    print(sum(map(int, input().split())))\n\nif __name__ == '__main__':\n    main()\n", ADD
    ) == (1.0, "ok")


def test_stdin_wrong_answer_names_the_case():
    prog = "a, b = map(int, input().split())\nprint(a + b if a != 10 else 0)"
    reward, reason = score(prog, ADD)
    assert reward == 0.0
    assert reason == "wrong answer on case 2: expected 6, got 0"


def test_stdin_exit_codes():
    assert score("import sys\nprint(sum(map(int, input().split())))\nsys.exit(0)", ADD) == (1.0, "ok")
    assert score("print(sum(map(int, input().split())))\nexit()", ADD) == (1.0, "ok")
    reward, reason = score("import sys\nprint(3)\nsys.exit(2)", ADD)
    assert (reward, reason) == (0.0, "runtime error on case 1: SystemExit: 2")
    reward, reason = score("import os\nos._exit(3)", ADD)
    assert reward == 0.0 and reason.startswith("runtime error on case 1: exit code 3")


def test_stdin_timeout_runtime_and_syntax_errors():
    prog = "a, b = map(int, input().split())\nwhile a == 10:\n    pass\nprint(a + b)"
    assert score(prog, stdin_tests(*ADD_PAIRS, timeout=0.5)) == (0.0, "timeout on case 2")
    reward, reason = score("a, b = map(int, input().split())\nprint(a + b + 0 // b)", ADD)
    assert reward == 0.0 and reason == "runtime error on case 3: ZeroDivisionError: integer division or modulo by zero"
    reward, reason = score("print(1/0)", ADD)
    assert reason == "runtime error on case 1: ZeroDivisionError: division by zero"
    reward, reason = score("def f(:\n  pass", ADD)
    assert reward == 0.0 and reason.startswith("syntax error: SyntaxError: ") and "(line 1)" in reason
    reward, reason = score("import sys\nsys.setrecursionlimit(10**6)\ndef f(n):\n    return f(n + 1)\nf(0)", ADD)
    assert reward == 0.0 and reason.endswith(
        ("on case 1", "on case 1: RecursionError: maximum recursion depth exceeded")
    )


def test_memory_and_output_limits():
    reward, reason = score("x = bytearray(2 * 1024**3)", stdin_tests(("", "")))
    assert (reward, reason) == (0.0, "memory limit exceeded on case 1")
    reward, reason = score("while True:\n    print('x' * 100000)", stdin_tests(("", "")))
    assert (reward, reason) == (0.0, "output limit exceeded on case 1")


def test_cases_do_not_share_state():
    prog = "import collections\ncounter = globals().setdefault('counter', [])\ncounter.append(1)\nprint(len(counter))"
    assert score(prog, stdin_tests(("", "1"), ("", "1"), ("", "1"))) == (1.0, "ok")


def test_large_input_and_unicode():
    n = 200_000
    data = " ".join(str(i) for i in range(n))
    tests = stdin_tests((data, str(n * (n - 1) // 2)), ("héllo wörld ∑", "HÉLLO WÖRLD ∑"))
    prog = "import sys\ns = sys.stdin.read()\nprint(sum(map(int, s.split())) if s[0].isdigit() else s.upper())"
    assert score(prog, tests) == (1.0, "ok")


def test_run_stops_at_the_first_failure():
    seen = []
    res = run_python(
        "print(int(input()) * 2)",
        "stdin",
        ["1", "x", "3", "4"],
        limits=Limits(timeout=2.0, memory_mb=256),
        on_case=lambda c: seen.append(c.index) or c.status == "ok",
    )
    assert res.stopped and seen == [0, 1] and [c.status for c in res.cases] == ["ok", "error"]


# ------------------------------------------------------------------------------ comparison
@pytest.mark.parametrize(
    "got,expected,same",
    [
        ("3\n", "3", True),
        ("  1 2  \n3 4\n\n", "1 2\n3 4", True),
        ("1.0", "1", True),
        ("3.50 2", "3.5 2.00", True),
        ("1e3", "1000", True),
        ("-0", "0", True),
        ("0.30000000000000004", "0.3", False),  # exact Decimal equality, as LCB
        ("abc", "abd", False),
        ("1\n2", "1 2", False),  # line structure matters
        ("1 2", "1\n2", False),
        ("YES", "yes", False),
        ("1 2 3", "1 2", False),
        ("", "", True),
        ("\n\n", "", True),
    ],
)
def test_outputs_match_lcb_rules(got, expected, same):
    assert outputs_match(got, expected) is same


# ------------------------------------------------------------------------------ functional
def test_functional_top_level_and_solution_class():
    tests = fn_tests("twoSum", ([[2, 7, 11, 15], 9], [0, 1]), ([[3, 2, 4], 6], [1, 2]))
    top = "def twoSum(nums, target):\n    seen = {}\n    for i, x in enumerate(nums):\n        if target - x in seen:\n            return [seen[target - x], i]\n        seen[x] = i\n"  # noqa: E501
    cls = (
        "class Solution:\n    def twoSum(self, nums: List[int], target: int) -> List[int]:\n"
        "        seen = {}\n        for i, x in enumerate(nums):\n"
        "            if target - x in seen:\n                return (seen[target - x], i)\n"
        "            seen[x] = i\n"
    )
    assert score(top, tests) == (1.0, "ok")
    assert score(cls, tests) == (1.0, "ok")  # List from LCB's prelude; tuple == list
    both = "def twoSum(nums, target):\n    return [0, 1]\n" + cls
    assert score(both, tests)[1] == "wrong answer on case 2: expected [1, 2], got [0, 1]"


def test_functional_failures():
    tests = fn_tests("f", ([1, 2], 3), ([0, 0], 0))
    assert score("def g(a, b):\n    return a + b", tests)[1].startswith(
        "runtime error on case 1: NameError: function 'f' not found"
    )
    assert score("def f(a, b):\n    return a / b", fn_tests("f", ([1, 0], 0)))[1] == (
        "runtime error on case 1: ZeroDivisionError: division by zero"
    )
    assert score("def f(a, b):\n    while True:\n        pass", fn_tests("f", ([1, 2], 3), timeout=0.5)) == (
        0.0,
        "timeout on case 1",
    )
    assert score("def f(a, b):\n    return {a, b}", tests)[1].startswith("runtime error on case 1: TypeError")
    assert score("def f(a, b):\n    return str(a + b)", tests)[1] == 'wrong answer on case 1: expected 3, got "3"'
    assert score("import sys\ndef f(a, b):\n    sys.exit(0)", tests)[1].startswith(
        "runtime error on case 1: SystemExit"
    )
    assert score("def f(a, b):\n    return True", fn_tests("f", ([1, 2], 1))) == (1.0, "ok")  # Python ==, as LCB
    nested = fn_tests("f", ([[1, 2]], {"a": [[1, 2], [3]]}))
    assert score("def f(x):\n    return {'a': (tuple(x), (3,))}", nested) == (1.0, "ok")


# ------------------------------------------------------------------------------ markdown
def test_extract_code():
    md = "Idea...\n```python\nprint(1)\n```\nbetter:\n```python\nprint(2)\n```\nDone."
    assert extract_code(md) == "print(2)\n"
    assert extract_code("```py\nx = 1\n```\n```text\nnot code\n```") == "x = 1\n"
    assert extract_code("```\nprint(3)\n```") == "print(3)\n"
    assert extract_code("print(4)") == "print(4)"
    assert extract_code("text\n```python\nprint(5)\n") == "print(5)\n"  # cut-off block
    assert extract_code("```Python3 \nprint(6)\n```") == "print(6)\n"
    tests = stdin_tests(("", "2"))
    assert score_completion(md, tests) == (1.0, "ok")


# ------------------------------------------------------------------------------ API
def test_bad_tests_are_clear_errors():
    with pytest.raises(ValueError, match="kind"):
        score("print(1)", {"kind": "other", "cases": [{"input": "", "output": ""}]})
    with pytest.raises(ValueError, match="non-empty"):
        score("print(1)", {"kind": "stdin", "cases": []})
    with pytest.raises(ValueError, match="fn_name"):
        score("print(1)", {"kind": "functional", "cases": [{"input": [], "output": 1}]})
    with pytest.raises(ValueError, match="must be strings"):
        score("print(1)", {"kind": "stdin", "cases": [{"input": 1, "output": "1"}]})
    with pytest.raises(ValueError, match="list of arguments"):
        score("print(1)", {"kind": "functional", "fn_name": "f", "cases": [{"input": "1", "output": 1}]})
    with pytest.raises(ValueError, match="timeout"):
        score("print(1)", {"kind": "stdin", "cases": [{"input": "", "output": ""}], "timeout": 0})
    with pytest.raises(ValueError, match="differ in length"):
        score_batch(["print(1)"], [])
    with pytest.raises(ValueError, match="backend"):
        score("print(1)", stdin_tests(("", "1")), backend="docker")


def test_score_batch_in_order_and_from_a_thread():
    progs = [
        "print(sum(map(int, input().split())))",
        "print(0)",
        "```python\nprint(sum(map(int, input().split())))\n```",
    ]
    out = score_batch(progs[:2], [ADD, ADD], workers=2)
    assert out[0] == (1.0, "ok") and out[1][0] == 0.0 and out[1][1].startswith("wrong answer on case 1")
    results = []
    th = threading.Thread(target=lambda: results.extend(score_batch(progs[2:], [ADD], workers=2, extract=True)))
    th.start()
    th.join(60)
    assert results == [(1.0, "ok")]
