"""Countdown search: the first solution of Qin et al.'s exhaustive DFS (``first_solution``) and a
vectorised solvability test for batches of candidate problems (``solvable_rows``); see the package
docstring (rspo.data.countdown) for the order of the search."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

ROW_BLOCK = 1 << 16
"""Rows per vectorised solvability call (bounds the temporaries' memory)."""


def combine_nums(a: int, b: int) -> list[tuple[int, str]]:
    """All (result, "x?y=r") from one pair, in Qin et al.'s order: +, *, -, / (exact only).

    `-` and `/` put the larger operand first; `/` needs a non-zero divisor dividing exactly.
    """
    out = [(a + b, f"{a}+{b}={a + b}"), (a * b, f"{a}*{b}={a * b}")]
    if a <= b:
        out.append((b - a, f"{b}-{a}={b - a}"))
        if a != 0 and b % a == 0:
            out.append((b // a, f"{b}/{a}={b // a}"))
    else:
        out.append((a - b, f"{a}-{b}={a - b}"))
        if b != 0 and a % b == 0:
            out.append((a // b, f"{a}/{b}={a // b}"))
    return out


def raw_results(a: int, b: int) -> list[tuple[int, int, str, int]]:
    """Like `combine_nums` but (result, x, sym, y) without formatting (the search's hot path)."""
    if a <= b:
        out = [(a + b, a, "+", b), (a * b, a, "*", b), (b - a, b, "-", a)]
        if a != 0 and b % a == 0:
            out.append((b // a, b, "/", a))
    else:
        out = [(a + b, a, "+", b), (a * b, a, "*", b), (a - b, a, "-", b)]
        if b != 0 and a % b == 0:
            out.append((a // b, a, "/", b))
    return out


def _search(nums: list[int], target: int) -> list[tuple[int, int, str, int]] | None:
    """First solution of the exhaustive DFS (Qin et al.'s `CountDown.search` order)."""
    n = len(nums)
    if n == 2:
        for res in raw_results(nums[0], nums[1]):
            if res[0] == target:
                return [res]
        return None
    for i, j in itertools.combinations(range(n), 2):
        rest = [nums[k] for k in range(n) if k != i and k != j]
        for res in raw_results(nums[i], nums[j]):
            sub = _search(rest + [res[0]], target)
            if sub is not None:
                return [res, *sub]
    return None


def all_solutions(target: int, nums: Sequence[int]) -> list[list[str]]:
    """Every solution of the exhaustive search (each path of the DFS that ends at ``target``), as
    step strings, in DFS order, without duplicates; the first is ``first_solution``."""
    found: list[list[str]] = []
    seen: set[tuple[str, ...]] = set()

    def rec(cur: list[int], path: list[str]) -> None:
        n = len(cur)
        for i, j in itertools.combinations(range(n), 2):
            rest = [cur[k] for k in range(n) if k != i and k != j]
            for r, x, sym, y in raw_results(cur[i], cur[j]):
                step = [*path, f"{x}{sym}{y}={r}"]
                if n > 2:
                    rec(rest + [r], step)
                elif r == target and tuple(step) not in seen:
                    seen.add(tuple(step))
                    found.append(step)

    rec(list(nums), [])
    return found


def first_solution(target: int, nums: Sequence[int]) -> list[str] | None:
    """The solution Qin et al.'s exhaustive DFS finds first, as step strings, or None."""
    found = _search(list(nums), target)
    if found is None:
        return None
    return [f"{x}{sym}{y}={r}" for r, x, sym, y in found]


def _solvable_batch(nums: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Vectorised exhaustive search: row b is solvable iff some full expression tree hits target[b].

    nums (B, n) int64, target (B,) int64 -> (B,) bool. Enumerates the same trees as
    `_search` (pair, operation, recurse) on whole columns; at the last pair (x, y) the four
    operations are tested against the target directly; exact division hi/lo == t is
    `lo != 0 and lo * t == hi`. Callers keep values below 2**62 (see `fits_int64`).
    """
    hit = np.zeros(nums.shape[0], dtype=bool)

    def rec(cols: list[np.ndarray], valid: np.ndarray | None) -> None:
        if len(cols) == 2:
            x, y = cols
            hi, lo = np.maximum(x, y), np.minimum(x, y)
            m = (x + y == target) | (x * y == target) | (hi - lo == target)
            m |= (lo != 0) & (lo * target == hi)
            if valid is not None:
                m &= valid
            hit[...] |= m
            return
        k = len(cols)
        for i, j in itertools.combinations(range(k), 2):
            rest = [cols[q] for q in range(k) if q != i and q != j]
            x, y = cols[i], cols[j]
            hi, lo = np.maximum(x, y), np.minimum(x, y)
            rec(rest + [x + y], valid)
            rec(rest + [x * y], valid)
            rec(rest + [hi - lo], valid)
            nonzero = lo != 0
            safe = np.where(nonzero, lo, 1)
            exact = nonzero & (hi % safe == 0)  # division only when exact
            rec(rest + [hi // safe], exact if valid is None else valid & exact)

    rec([nums[:, q] for q in range(nums.shape[1])], None)
    return hit


def fits_int64(n: int, max_number: int, max_target: int) -> bool:
    """Every intermediate value (<= max_number**n) and lo * target stay below 2**62."""
    return max_number**n * max(max_target, 1) < 2**62


def solvable_rows(nums: np.ndarray, target: np.ndarray, vectorised: bool) -> np.ndarray:
    """(B, n), (B,) -> (B,) bool, in blocks of `ROW_BLOCK` rows; Python fallback on overflow risk."""
    out = np.empty(nums.shape[0], dtype=bool)
    for a in range(0, nums.shape[0], ROW_BLOCK):
        b = min(a + ROW_BLOCK, nums.shape[0])
        if vectorised:
            out[a:b] = _solvable_batch(nums[a:b], target[a:b])
        else:
            out[a:b] = [
                _search([int(v) for v in row], int(t)) is not None
                for row, t in zip(nums[a:b], target[a:b], strict=True)
            ]
    return out
