"""Countdown traces and text formats: Qin et al.'s heuristic DFS trace (``search_path``), the
optimal path, the rating, a full record, and the prompt/completion texts for training (see the
package docstring, rspo.data.countdown, for the formats)."""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence

from rspo.data.countdown.solver import raw_results

STYLES = ("steps", "optimal_path", "search_path")
HEURISTICS = ("sum_heuristic", "mult_heuristic")


def _factors(target: int) -> list[int]:
    """Factors >= 2 of target (their `mult_heuristic`); [1] for target 1 (theirs crashes)."""
    return [i for i in range(2, target + 1) if target % i == 0] or [1]


def _distance_fn(heuristic: str, target: int):
    """Per-number term of Qin et al.'s heuristics (both are sums of a per-number distance).

    sum_heuristic(nums)  = sum_x |x - target| / len(nums)   (just |x - target| for one number)
    mult_heuristic(nums) = sum_x min_f |x - f|, f over the factors >= 2 of target
    """
    if heuristic == "sum_heuristic":
        return lambda x: abs(x - target)
    if heuristic == "mult_heuristic":
        factors = _factors(target)
        nf = len(factors)

        def nearest(x: int) -> int:  # min_f |x - f| by bisection on the sorted factors
            k = bisect.bisect_left(factors, x)
            if k == 0:
                return factors[0] - x
            if k == nf:
                return x - factors[-1]
            return min(factors[k] - x, x - factors[k - 1])

        return nearest
    raise ValueError(f"unknown heuristic {heuristic!r}; choose one of {HEURISTICS}")


def heuristic_value(heuristic: str, nums: Sequence[int], target: int) -> float:
    """Qin et al.'s `sum_heuristic(nums, target)` / `mult_heuristic(nums, target)`."""
    d = _distance_fn(heuristic, target)
    total = sum(d(x) for x in nums)
    if heuristic == "sum_heuristic" and len(nums) > 1:
        return total / len(nums)
    return total


def dfs_search_path(target: int, nums: Sequence[int], heuristic: str) -> str:
    """Qin et al.'s DFS trace (`countdown_dfs.dfs(target, nums, heuristic, threshold=target)`).

    At each node: list all children (pairs in combinations order, operations in
    `combine_nums` order, child = other numbers + [result]), drop those whose heuristic
    exceeds the target, visit the rest in stable heuristic order (their tuple sort: nodes
    compare equal on ties); stop at the first leaf equal to the target. A child's
    heuristic is computed incrementally: parent's distance sum - the two operands' + the
    result's (then / len for sum_heuristic), which equals `heuristic_value(child)`.
    """
    d = _distance_fn(heuristic, target)
    mean = heuristic == "sum_heuristic"
    lines: list[str] = []
    emit = lines.append

    def visit(idx: str, cur: list[int], ops: list[str]) -> bool:
        state = f"Current State: {target}:{cur}, Operations: {ops}"
        emit(state)
        n = len(cur)
        dist = [d(x) for x in cur]
        total = sum(dist)
        m = n - 1  # numbers in a child
        children = []
        for i, j in itertools.combinations(range(n), 2):
            rest = [cur[k] for k in range(n) if k != i and k != j]
            base = total - dist[i] - dist[j]
            for r, x, sym, y in raw_results(cur[i], cur[j]):
                hv = base + d(r)
                if mean and m > 1:
                    hv = hv / m
                if hv <= target:  # threshold = target: prune the rest
                    children.append((hv, rest, r, x, sym, y))
        children.sort(key=lambda c: c[0])  # stable
        last = len(children) - 1
        for g, (_, rest, r, x, sym, y) in enumerate(children):
            new = rest + [r]
            op = f"{x}{sym}{y}={r}"
            new_s = repr(new)
            emit(f"Exploring Operation: {op}, Resulting Numbers: {new_s}")
            if m == 1:
                if r == target:
                    emit(f"{r},{target} equal: Goal Reached")
                    return True
                emit(f"{r},{target} unequal: No Solution")
            else:
                child = f"{idx},{g}"
                emit(f"Generated Node #{child}: {target}:{new_s} Operation: {op}")
                emit(f"Moving to Node #{child}")
                if visit(child, new, ops + [op]):
                    return True
            if g < last:  # back to the parent before its next child
                emit(f"Moving to Node #{idx}")
                emit(state)
        return False

    visit("0", [int(x) for x in nums], [])
    return "\n".join(lines) + "\n"


def _parse_step(op: str) -> tuple[int, int, int]:
    """'a?b=r' -> (a, b, r) for the generator's own (well-formed) step strings."""
    lhs, r = op.split("=")
    for sym in "+-*/":
        if sym in lhs:
            a, b = lhs.split(sym)
            return int(a), int(b), int(r)
    raise ValueError(f"not a Countdown step: {op!r}")


def optimal_path(target: int, nums: Sequence[int], solution: Sequence[str]) -> str:
    """Qin et al.'s `convert_to_path`: the solution as a trace without dead ends."""
    cur = [int(x) for x in nums]
    lines = [f"Current State: {target}:{cur}, Operations: []"]
    explored: list[str] = []
    node = 1
    for op in solution:
        a, b, r = _parse_step(op)
        cur = list(cur)
        cur.remove(a)
        cur.remove(b)
        cur.append(r)
        lines.append(f"Exploring Operation: {op}, Resulting Numbers: {cur}")
        if len(cur) == 1:
            lines.append(f"{cur[0]},{target} equal: Goal Reached")
        else:
            node += 1
            lines.append(f"Generated Node #{node}: {cur} from Operation: {op}")
            explored.append(op)
            lines.append(f"Current State: {target}:{cur}, Operations: {explored}")
    return "\n".join(lines) + "\n"


def max_nodes(num_numbers: int) -> int:
    """Their rating denominator: prod_{k=2..n} C(k, 2) * 4 (4, 48, 1152, 46080)."""
    return math.prod(math.comb(k, 2) * 4 for k in range(2, num_numbers + 1))


def rating(search_path: str, num_numbers: int) -> float:
    """Their `rating`: 1 - (#explored + 1) / max_nodes, floored at 0; 0 if the goal is not reached."""
    if "Goal Reached" not in search_path:
        return 0.0
    return max(0.0, 1.0 - (search_path.count("Exploring Operation") + 1) / max_nodes(num_numbers))


def make_record(target: int, nums: Sequence[int], solution: Sequence[str], heuristic: str) -> dict:
    """One data record with Qin et al.'s fields (and their order)."""
    nums = [int(x) for x in nums]
    search_path = dfs_search_path(target, nums, heuristic)
    return {
        "nums": nums,
        "target": int(target),
        "solution": list(solution),
        "search_path": search_path,
        "rating": rating(search_path, len(nums)),
        "search_type": "dfs",
        "optimal_path": optimal_path(target, nums, solution),
        "heuristic": heuristic,
    }


# ---------------------------------------------------------------------------------------
# Text formats


def _check_style(style: str) -> None:
    if style not in STYLES:
        raise ValueError(f"unknown Countdown text style {style!r}; choose one of {STYLES}")


def _trace(record: dict, style: str) -> str:
    """The record's trace for `style`, recomputed from its problem when not stored."""
    trace = record.get(style)
    if trace is None:
        nums, target = record["nums"], record["target"]
        if style == "optimal_path":
            trace = optimal_path(target, nums, record["solution"])
        elif "heuristic" in record:
            trace = dfs_search_path(target, nums, record["heuristic"])
        else:
            raise ValueError("record has neither 'search_path' nor 'heuristic' to rebuild it from")
    if not isinstance(trace, str) or "\n" not in trace:
        raise ValueError(f"record's {style!r} is not a multi-line trace string")
    return trace


def format_prompt(record: dict, style: str = "steps") -> str:
    """The prompt text for `record` in `style` (see the module docstring)."""
    _check_style(style)
    nums, target = record["nums"], record["target"]
    if style == "steps":
        return f"nums {' '.join(str(x) for x in nums)} target {target}:"
    # The first trace line is the root state, identical in both traces; building it from
    # (nums, target) lets a bare problem without traces be prompted too.
    return f"START Current State: {target}:{[int(x) for x in nums]}, Operations: []\n"


def format_completion(record: dict, style: str = "steps") -> str:
    """The target completion for `record` in `style` (no EOS)."""
    _check_style(style)
    if style == "steps":
        return ",".join(record["solution"])
    return _trace(record, style).partition("\n")[2]
