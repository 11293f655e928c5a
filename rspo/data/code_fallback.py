"""The offline fallback of the code training set: templated problems (stdin programs and functions)
with reference solutions and outputs, in the DeepCoder TACO schema, deterministic in the seed.
``rspo prepare code --source fallback`` normalises them like a hub row (rspo.data.code); they
exercise the pipeline offline and are not a substitute for the real mix."""

from __future__ import annotations

import json
import random
from typing import Any


def _fallback_problem(rng: random.Random) -> dict:
    """One problem in the DeepCoder/TACO schema (tests as a JSON string)."""
    k = rng.randint(2, 9)
    kind = rng.randrange(8)
    ins: list[Any] = []
    outs: list[Any] = []
    fn_name = None
    starter = ""
    if kind == 0:
        text = f"Read an integer n and then n integers. Print the sum of the integers multiplied by {k}."
        sol = f"n = int(input())\nxs = list(map(int, input().split()))\nprint({k} * sum(xs))\n"
        for _ in range(5):
            xs = [rng.randint(-50, 50) for _ in range(rng.randint(1, 6))]
            ins.append(f"{len(xs)}\n{' '.join(map(str, xs))}\n")
            outs.append(f"{k * sum(xs)}\n")
    elif kind == 1:
        text = "Read an integer n and then n integers. Print the largest of them."
        sol = "n = int(input())\nxs = list(map(int, input().split()))\nprint(max(xs))\n"
        for _ in range(5):
            xs = [rng.randint(-99, 99) for _ in range(rng.randint(1, 6))]
            ins.append(f"{len(xs)}\n{' '.join(map(str, xs))}\n")
            outs.append(f"{max(xs)}\n")
    elif kind == 2:
        text = "Read a word and print it reversed."
        sol = "print(input()[::-1])\n"
        for _ in range(5):
            w = "".join(rng.choice("abcdefghij") for _ in range(rng.randint(1, 8)))
            ins.append(f"{w}\n")
            outs.append(f"{w[::-1]}\n")
    elif kind == 3:
        text = f"Read two integers a and b on one line. Print a * b + {k}."
        sol = f"a, b = map(int, input().split())\nprint(a * b + {k})\n"
        for _ in range(5):
            a, b = rng.randint(-20, 20), rng.randint(-20, 20)
            ins.append(f"{a} {b}\n")
            outs.append(f"{a * b + k}\n")
    elif kind == 4:
        text = f"Read an integer n. Print YES if n is divisible by {k}, otherwise print NO."
        sol = f"n = int(input())\nprint('YES' if n % {k} == 0 else 'NO')\n"
        for _ in range(5):
            n = rng.randint(0, 100)
            ins.append(f"{n}\n")
            outs.append("YES\n" if n % k == 0 else "NO\n")
    elif kind == 5:
        fn_name = "add_k"
        starter = "def add_k(nums, k):\n    "
        text = "Write a function add_k(nums, k) that returns a new list with k added to every element of nums."
        sol = "def add_k(nums, k):\n    return [x + k for x in nums]\n"
        for _ in range(5):
            xs = [rng.randint(-9, 9) for _ in range(rng.randint(0, 5))]
            ins.append([xs, k])
            outs.append([[x + k for x in xs]])
    elif kind == 6:
        fn_name = "count_char"
        starter = "def count_char(s, c):\n    "
        text = "Write a function count_char(s, c) that returns how many times the character c occurs in s."
        sol = "def count_char(s, c):\n    return s.count(c)\n"
        for _ in range(5):
            s = "".join(rng.choice("abc") for _ in range(rng.randint(0, 8)))
            c = rng.choice("abc")
            ins.append([s, c])
            outs.append([s.count(c)])
    else:
        fn_name = "sum_of_multiples"
        starter = "def sum_of_multiples(n):\n    "
        text = (
            f"Write a function sum_of_multiples(n) that returns the sum of the positive multiples of {k} "
            "not greater than n."
        )
        sol = f"def sum_of_multiples(n):\n    return sum(range({k}, n + 1, {k}))\n"
        for _ in range(5):
            n = rng.randint(0, 60)
            ins.append([n])
            outs.append([sum(range(k, n + 1, k))])
    tests: dict[str, Any] = {"inputs": ins, "outputs": outs}
    if fn_name:
        tests["fn_name"] = fn_name
    return {
        "problem": text,
        "solutions": [sol],
        "starter_code": starter,
        "tests": json.dumps(tests),
        "metadata": {"func_name": fn_name},
    }


def generate_code_problems(n: int, seed: int = 0) -> list[dict]:
    """``n`` templated code problems in the DeepCoder TACO schema (deterministic in ``seed``)."""
    if n <= 0:
        raise ValueError(f"n must be positive, got {n}")
    rng = random.Random(seed)
    return [_fallback_problem(rng) for _ in range(n)]
