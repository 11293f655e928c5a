"""Countdown data: generator, split loader and text formats (`python -m rspo generate`).

The task (Qin et al. 2025, "To Backtrack or Not to Backtrack", code in
KempnerInstitute/Backtrack `countdown/src/`, itself adapted from Gandhi et al.'s
stream-of-search): given `num_numbers` integers and a target, combine two numbers at a
time with `+`, `*`, larger-minus-smaller, or exact division (larger/smaller, remainder 0)
until one number remains; it must equal the target. Every number is used exactly once.

Generation, as in their `countdown_generate.py` (run by `scripts/gen_task.sh` with
`--seed 4`, 4 numbers, `max_target=100`):
- Targets are the integers min_target..max_target, shuffled with `random.Random(seed)`
  (the same permutation as their `random.seed(seed); random.shuffle(...)`); the first
  `int(len * heldout_target_frac)` (theirs: `len // 10`) form split `val_target`, the
  others are used by `train` and `val`.
- Per problem: a target is drawn from the split's targets, then `num_numbers` numbers
  `randint(1, max_number)` are redrawn until an exhaustive DFS finds a solution
  (rejection sampling). `solution` is the first solution of that DFS in their order
  (index pairs i < j in `itertools.combinations` order; for each pair the operations
  `+`, `*`, `-`, `/` with operands ordered as in their `combine_nums`; the new state is
  the other numbers followed by the result), so for the same nums and target it equals
  their `solution`.
- `val` uses the train targets; a val problem whose solution (the list of step strings)
  occurs in train is redrawn (new target and numbers), as theirs.
- `search_path` is their heuristic DFS trace (`countdown_dfs.dfs` with
  `threshold=target`, heuristic drawn per problem from `sum_heuristic` /
  `mult_heuristic`): children whose heuristic exceeds the target are pruned, the rest are
  expanded in stable order of heuristic. Because of the pruning this search can fail on a
  solvable problem; the trace then has no "Goal Reached" line and `rating` is 0, exactly
  as in their data (the problem itself is solvable: see `solution`).
- `optimal_path` is their `CountDown.convert_to_path(target, nums, solution)`: the
  solution path with no dead ends. Its node lines are "Generated Node #k: [..] from
  Operation: op" with k = 2, 3, ... (their format; it differs from the DFS trace's
  "Generated Node #0,0: 73:[..] Operation: op"), and a new state's list is the previous
  list with the operands' first occurrences removed and the result appended.
- `rating` = max(0, 1 - (#"Exploring Operation" + 1) / max_nodes) when the trace reaches
  the goal, else 0; max_nodes = prod_{k=2..n} C(k,2) * 4 (1152 for 4 numbers), as theirs.
- Record fields and order are theirs: nums, target, solution, search_path, rating,
  search_type ("dfs"), optimal_path, heuristic.

Trace lines of `search_path` (each ends with "\\n"), e.g. nums [84, 9, 2, 4], target 73:
    Current State: 73:[84, 9, 2, 4], Operations: []
    Exploring Operation: 84+9=93, Resulting Numbers: [2, 4, 93]
    Generated Node #0,0: 73:[2, 4, 93] Operation: 84+9=93
    Moving to Node #0,0
    Current State: 73:[2, 4, 93], Operations: ['84+9=93']
    ...
    Exploring Operation: 93-8=85, Resulting Numbers: [85]
    85,73 unequal: No Solution
    Moving to Node #0
    Current State: 73:[84, 9, 2, 4], Operations: []
    ...
    Current State: 73:[75, 2], Operations: ['84-9=75', '4-2=2']
    Exploring Operation: 75-2=73, Resulting Numbers: [73]
    73,73 equal: Goal Reached

Deviations from their generator (documented, deliberate):
- Random streams: each chunk of `CHUNK` problems of a split draws from its own numpy
  `Generator(SeedSequence([tag, seed, split index, chunk]))`, so the output does not
  depend on the number of worker processes. Within a chunk: one target per problem,
  then candidate number tuples in rounds (see `_draw_problems`: each problem keeps the
  first solvable tuple of its own candidates, which is the same distribution as
  sequential rejection sampling), then one heuristic per problem. Solvability of the
  candidates is tested by a vectorised exhaustive search (`_solvable_batch`, checked
  against the scalar search in the tests); only accepted problems run the scalar search
  that yields `solution`. Their single global `random` stream (which also draws a start
  size per problem) is not reproduced, so the same seed gives different problems from
  theirs; only the target permutation (hence the held-out targets) matches.
- Their `optimal_path` for a redrawn `val` problem describes the problem drawn BEFORE the
  redraw (it is computed before their redraw loop); ours describes the final problem.
- Their `val`/`val_target` sizes are fixed at 1,000; ours are parameters. Numbers are
  drawn from 1..max_number (theirs: 1..max_target-1 = 1..99 by default; same default).
- `mult_heuristic` for target 1 (no factor >= 2; theirs would crash on `min([])`) uses
  the factor list [1]. num_numbers is limited to 2..5 (their rating table has 2..5).
- Output is JSONL (one record per line, one file per split) plus meta.json, each written
  atomically (temporary file + rename, meta.json last), instead of one JSON list per split.
- `--no-traces` (not in theirs) omits search_path, rating, search_type and optimal_path:
  the traces are pure functions of (target, nums, heuristic) and (target, nums, solution),
  and `format_completion` rebuilds them on demand. Records are then ~100x smaller.

Text formats for training (`format_prompt`, `format_completion`; EOS is added by the
tokenizer / trainer, never inside the strings):
- "steps" (compact, for the CPU presets): prompt `nums 67 34 12 target 89:`, completion
  `67+34=101,101-12=89` (the `solution` steps joined by ",").
- "optimal_path" (their `oft`) and "search_path" (their `sft`): prompt = "START " + the
  trace's first line + "\\n", completion = the rest of the trace (with its final "\\n"),
  as in their GRPO setup; prompt + completion == "START " + trace.
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import itertools
import json
import math
import multiprocessing as mp
import os
import random
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rspo.rewards.countdown import score

__all__ = [
    "CountdownConfig",
    "STYLES",
    "SPLITS",
    "combine_nums",
    "first_solution",
    "dfs_search_path",
    "optimal_path",
    "make_record",
    "split_targets",
    "iter_split",
    "generate_split",
    "generate",
    "load_split",
    "format_prompt",
    "format_completion",
    "main",
]

STYLES = ("steps", "optimal_path", "search_path")
SPLITS = ("train", "val", "val_target")
CHUNK = 1000
"""Problems per random stream and per multiprocessing task (changing it changes the data)."""
MAX_DRAWS = 20_000
"""Rejection-sampling budget (candidate draws) per problem before giving up with an error."""
ROW_CAP = 1 << 18
"""Largest candidate batch per rejection round (rows of n numbers)."""
ROW_BLOCK = 1 << 16
"""Rows per vectorised solvability call (bounds the temporaries' memory)."""
_SEED_TAG = 0x5C0D  # mixes the task into every SeedSequence
MAX_REDRAWS = 10_000
"""Redraws of a `val` problem whose solution occurs in train before giving up."""
HEURISTICS = ("sum_heuristic", "mult_heuristic")
REQUIRED_FIELDS = ("nums", "target", "solution")
TRACE_FIELDS = ("search_path", "optimal_path")


@dataclass(frozen=True)
class CountdownConfig:
    """Generation parameters (the YAML presets' top-level `countdown:` mapping)."""

    num_numbers: int = 4
    """Numbers per problem (Qin et al.: 4; CPU presets: 3). Allowed 2..5."""
    max_number: int = 99
    """Numbers are drawn uniformly from 1..max_number (Qin et al.: 1..99)."""
    min_target: int = 10
    """Smallest target (Qin et al.: 10)."""
    max_target: int = 100
    """Largest target (Qin et al.: 100)."""
    train_size: int = 500_000
    """Problems in split `train` (Qin et al.: 500,000)."""
    val_size: int = 1000
    """Problems in split `val`: train targets, no solution shared with train (Qin et al.: 1,000)."""
    val_target_size: int = 1000
    """Problems in split `val_target`: held-out targets only (Qin et al.: 1,000)."""
    heldout_target_frac: float = 0.1
    """Fraction of the targets held out for `val_target` (Qin et al.: 10%, `len // 10`)."""
    seed: int = 4
    """Random seed (Qin et al.'s gen_task.sh: 4)."""

    def __post_init__(self) -> None:
        for name in ("num_numbers", "max_number", "min_target", "max_target", "train_size",
                     "val_size", "val_target_size", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"countdown: {name} must be an int, got {value!r}")
        frac = self.heldout_target_frac
        if isinstance(frac, bool) or not isinstance(frac, (int, float)):
            raise ValueError(f"countdown: heldout_target_frac must be a number, got {frac!r}")
        if not 2 <= self.num_numbers <= 5:
            raise ValueError(f"countdown: num_numbers must be in 2..5, got {self.num_numbers}")
        if self.seed < 0:
            raise ValueError(f"countdown: seed must be >= 0, got {self.seed}")
        if self.max_number < 1:
            raise ValueError(f"countdown: max_number must be >= 1, got {self.max_number}")
        if self.min_target < 1:
            raise ValueError(f"countdown: min_target must be >= 1, got {self.min_target}")
        if self.min_target > self.max_target:
            raise ValueError(
                f"countdown: min_target ({self.min_target}) > max_target ({self.max_target})"
            )
        for name in ("train_size", "val_size", "val_target_size"):
            if getattr(self, name) < 0:
                raise ValueError(f"countdown: {name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= frac < 1.0:
            raise ValueError(f"countdown: heldout_target_frac must be in [0, 1), got {frac}")
        train_t, held_t = split_targets(self)
        if self.val_target_size > 0 and not held_t:
            raise ValueError(
                f"countdown: heldout_target_frac={frac} holds out no target of "
                f"{self.min_target}..{self.max_target}, but val_target_size={self.val_target_size}"
            )
        if (self.train_size > 0 or self.val_size > 0) and not train_t:
            raise ValueError(
                f"countdown: heldout_target_frac={frac} leaves no training target in "
                f"{self.min_target}..{self.max_target}"
            )


# ---------------------------------------------------------------------------------------
# Search


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


def _results(a: int, b: int) -> list[tuple[int, int, str, int]]:
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
        for res in _results(nums[0], nums[1]):
            if res[0] == target:
                return [res]
        return None
    for i, j in itertools.combinations(range(n), 2):
        rest = [nums[k] for k in range(n) if k != i and k != j]
        for res in _results(nums[i], nums[j]):
            sub = _search(rest + [res[0]], target)
            if sub is not None:
                return [res, *sub]
    return None


def first_solution(target: int, nums: Sequence[int]) -> list[str] | None:
    """The solution Qin et al.'s exhaustive DFS finds first, as step strings, or None."""
    found = _search(list(nums), target)
    if found is None:
        return None
    return [f"{x}{sym}{y}={r}" for r, x, sym, y in found]


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
            for r, x, sym, y in _results(cur[i], cur[j]):
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
# Splits


def split_targets(cfg: CountdownConfig) -> tuple[list[int], list[int]]:
    """(train/val targets, held-out val_target targets): shuffled by seed, first frac held out."""
    targets = list(range(cfg.min_target, cfg.max_target + 1))
    random.Random(cfg.seed).shuffle(targets)
    n_held = int(len(targets) * cfg.heldout_target_frac)
    return targets[n_held:], targets[:n_held]


def _solvable_batch(nums: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Vectorised exhaustive search: row b is solvable iff some full expression tree hits target[b].

    nums (B, n) int64, target (B,) int64 -> (B,) bool. Enumerates the same trees as
    `_search` (pair, operation, recurse) on whole columns; at the last pair (x, y) the four
    operations are tested against the target directly; exact division hi/lo == t is
    `lo != 0 and lo * t == hi`. Callers keep values below 2**62 (see `_fits_int64`).
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


def _fits_int64(n: int, max_number: int, max_target: int) -> bool:
    """Every intermediate value (<= max_number**n) and lo * target stay below 2**62."""
    return max_number**n * max(max_target, 1) < 2**62


def _solvable(nums: np.ndarray, target: np.ndarray, vectorised: bool) -> np.ndarray:
    """(B, n), (B,) -> (B,) bool, in blocks of `ROW_BLOCK` rows; Python fallback on overflow risk."""
    out = np.empty(nums.shape[0], dtype=bool)
    for a in range(0, nums.shape[0], ROW_BLOCK):
        b = min(a + ROW_BLOCK, nums.shape[0])
        if vectorised:
            out[a:b] = _solvable_batch(nums[a:b], target[a:b])
        else:
            out[a:b] = [_search([int(v) for v in row], int(t)) is not None
                        for row, t in zip(nums[a:b], target[a:b], strict=True)]
    return out


def _chunk_rng(seed: int, split: str, chunk: int) -> np.random.Generator:
    """The random stream of one chunk of a split (independent of workers and chunk order)."""
    return np.random.default_rng(np.random.SeedSequence([_SEED_TAG, seed, SPLITS.index(split), chunk]))


def _draw_problems(
    rng: np.random.Generator, targets: np.ndarray, count: int, n: int, max_number: int,
    vectorised: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """`count` problems: a uniform target each, then numbers redrawn until solvable.

    Rejection sampling in rounds: each unresolved problem draws `k` candidate tuples
    (k = 8, 32, 128, ...), and takes the FIRST solvable one in its own draw order, which is
    exactly sequential rejection sampling (uniform over the solvable tuples for its target).
    Returns target (count,) and nums (count, n).
    """
    tgt = targets[rng.integers(0, len(targets), size=count)]
    nums = np.zeros((count, n), dtype=np.int64)
    pending = np.arange(count)
    k, drawn = 8, 0
    while pending.size:
        if drawn >= MAX_DRAWS:
            bad = sorted({int(t) for t in tgt[pending]})
            raise ValueError(
                f"countdown: no solvable problem for target(s) {bad[:10]} with {n} numbers in "
                f"1..{max_number} after {drawn} draws; widen max_number or the target range"
            )
        k = min(k, MAX_DRAWS - drawn, max(8, ROW_CAP // pending.size))
        cand = rng.integers(1, max_number + 1, size=(pending.size, k, n), dtype=np.int64)
        ok = _solvable(cand.reshape(-1, n), np.repeat(tgt[pending], k), vectorised)
        ok = ok.reshape(pending.size, k)  # (P, k)
        has = ok.any(axis=1)
        first = ok.argmax(axis=1)
        nums[pending[has]] = cand[has, first[has]]
        pending = pending[~has]
        drawn += k
        k *= 4
    return tgt, nums


def _gen_chunk(args: tuple) -> list[dict]:
    """The records of one chunk of a split, from the chunk's own random stream."""
    seed, split, chunk, count, targets, n, max_number, traces, exclude = args
    rng = _chunk_rng(seed, split, chunk)
    targets = np.asarray(targets, dtype=np.int64)
    vec = _fits_int64(n, max_number, int(targets.max()))
    tgt, nums = _draw_problems(rng, targets, count, n, max_number, vec)
    sols = [first_solution(int(t), row.tolist()) for t, row in zip(tgt, nums, strict=True)]
    # val: a problem whose solution occurs in train is redrawn (new target and numbers).
    redo = [i for i, sol in enumerate(sols) if ",".join(sol) in exclude]
    tries = 0
    while redo:
        tries += 1
        if tries > MAX_REDRAWS:
            raise ValueError(
                f"countdown: could not draw {split} problems whose solution is not in train "
                f"after {MAX_REDRAWS} redraws; the problem space is too small"
            )
        t2, n2 = _draw_problems(rng, targets, len(redo), n, max_number, vec)
        for q, i in enumerate(redo):
            tgt[i], nums[i] = t2[q], n2[q]
            sols[i] = first_solution(int(t2[q]), n2[q].tolist())
        redo = [i for i in redo if ",".join(sols[i]) in exclude]
    heur = rng.integers(0, len(HEURISTICS), size=count)
    out = []
    for t, row, sol, h in zip(tgt.tolist(), nums.tolist(), sols, heur.tolist(), strict=True):
        if traces:
            out.append(make_record(t, row, sol, HEURISTICS[h]))
        else:
            out.append({"nums": row, "target": t, "solution": sol, "heuristic": HEURISTICS[h]})
    return out


_EXCLUDE: frozenset[str] = frozenset()


def _init_worker(exclude: frozenset[str]) -> None:
    global _EXCLUDE
    _EXCLUDE = exclude


def _gen_chunk_worker(args: tuple) -> list[dict]:
    return _gen_chunk((*args, _EXCLUDE))


def iter_split(
    cfg: CountdownConfig,
    split: str,
    size: int,
    targets: Sequence[int],
    workers: int = 1,
    exclude: Iterable[str] = (),
    traces: bool = True,
) -> Iterator[dict]:
    """Yield `size` records of `split` (targets from `targets`), chunk by chunk, in order.

    Problems whose solution string ("a+b=c,...") is in `exclude` are redrawn. Deterministic
    in (cfg.seed, num_numbers, max_number, split, size, targets, exclude); independent of
    `workers`. With traces=False the records hold only nums, target, solution, heuristic
    (the traces are pure functions of these: `dfs_search_path`, `optimal_path`).
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {SPLITS}")
    if size == 0:
        return
    if not targets:
        raise ValueError(f"countdown: split {split} has no targets")
    excl = frozenset(exclude)
    tasks = [
        (cfg.seed, split, c, min(CHUNK, size - c * CHUNK), list(targets), cfg.num_numbers,
         cfg.max_number, traces)
        for c in range(math.ceil(size / CHUNK))
    ]
    if workers <= 1 or len(tasks) == 1:
        for t in tasks:
            yield from _gen_chunk((*t, excl))
        return
    ctx = mp.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    with ctx.Pool(min(workers, len(tasks)), initializer=_init_worker, initargs=(excl,)) as pool:
        for chunk in pool.imap(_gen_chunk_worker, tasks, chunksize=1):
            yield from chunk


def generate_split(
    cfg: CountdownConfig,
    split: str,
    size: int,
    targets: Sequence[int],
    workers: int = 1,
    exclude: Iterable[str] = (),
    traces: bool = True,
) -> list[dict]:
    """`iter_split` as a list."""
    return list(iter_split(cfg, split, size, targets, workers, exclude, traces))


def _write_atomic(path: Path, lines: Iterable[str]) -> None:
    """Write to a temporary file in the same folder, fsync, then rename over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            for line in lines:
                f.write(line)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def generate(
    cfg: CountdownConfig, out_dir: str | os.PathLike, workers: int = 1, traces: bool = True,
    progress: bool = False,
) -> dict:
    """Generate all splits into `out_dir` ({split}.jsonl, then meta.json); returns the meta dict.

    Records are streamed to disk chunk by chunk (a 500k-record train split with traces is
    ~5 GB). meta.json is removed first and written last, so its presence means complete.
    `progress` shows a bar (terminal) or log lines per split (rspo.progress).
    """
    from rspo.progress import Progress

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta_path = out / "meta.json"
    if meta_path.exists():
        meta_path.unlink()  # a stale meta.json must not vouch for files being rewritten
    train_t, held_t = split_targets(cfg)
    plan = (
        ("train", cfg.train_size, train_t),
        ("val", cfg.val_size, train_t),
        ("val_target", cfg.val_target_size, held_t),
    )
    train_solutions: set[str] = set()
    counts: dict[str, int] = {}
    timings: dict[str, float] = {}
    for split, size, targets in plan:
        t0 = time.perf_counter()
        exclude = train_solutions if split == "val" else ()
        counts[split] = 0

        def lines(split=split, size=size, targets=targets, exclude=exclude, bar=None):
            for rec in iter_split(cfg, split, size, targets, workers, exclude, traces):
                if split == "train":
                    train_solutions.add(",".join(rec["solution"]))
                counts[split] += 1
                bar.update(counts[split])
                yield json.dumps(rec) + "\n"

        with Progress(f"generate {split}", size, unit="record", quiet=not progress) as bar:
            _write_atomic(out / f"{split}.jsonl", lines(bar=bar))
        timings[split] = time.perf_counter() - t0
    meta = {
        "task": "countdown",
        "config": dataclasses.asdict(cfg),
        "traces": traces,
        "counts": counts,
        "train_targets": sorted(train_t),
        "val_target_targets": sorted(held_t),
        "files": {s: f"{s}.jsonl" for s in SPLITS},
        "generation_seconds": {k: round(v, 3) for k, v in timings.items()},
        "workers": workers,
    }
    _write_atomic(meta_path, [json.dumps(meta, indent=2) + "\n"])
    return meta


# ---------------------------------------------------------------------------------------
# Loading and validation


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def validate_record(rec: Any) -> str | None:
    """None if `rec` is a well-formed, solved Countdown record, else what is wrong.

    Required: nums (>= 2 non-negative ints), target (int), solution (list of step strings)
    that the verifier accepts. Optional (written unless --no-traces): optimal_path, which
    must be a valid path too, and search_path, which must be valid if it claims the goal
    (a heuristic DFS that missed the solution legitimately has no "Goal Reached").
    """
    if not isinstance(rec, dict):
        return f"record is not a JSON object ({type(rec).__name__})"
    missing = [k for k in REQUIRED_FIELDS if k not in rec]
    if missing:
        return f"missing field(s) {missing}"
    nums, target, solution = rec["nums"], rec["target"], rec["solution"]
    if not isinstance(nums, list) or len(nums) < 2 or not all(_is_int(x) and x >= 0 for x in nums):
        return f"'nums' must be a list of >= 2 non-negative ints, got {nums!r}"
    if not _is_int(target):
        return f"'target' must be an int, got {target!r}"
    if not isinstance(solution, list) or not all(isinstance(s, str) for s in solution):
        return f"'solution' must be a list of strings, got {solution!r}"
    for key in TRACE_FIELDS:
        if key in rec and not isinstance(rec[key], str):
            return f"{key!r} must be a string, got {type(rec[key]).__name__}"
    if "heuristic" in rec and rec["heuristic"] not in HEURISTICS:
        return f"'heuristic' must be one of {HEURISTICS}, got {rec['heuristic']!r}"
    reward, reason = score(",".join(solution), nums, target)
    if reward != 1.0:
        return f"unsolvable record: solution {solution} does not reach {target} from {nums} ({reason})"
    if "optimal_path" in rec:
        reward, reason = score(rec["optimal_path"], nums, target)
        if reward != 1.0:
            return f"'optimal_path' is not a valid path ({reason})"
    if "search_path" in rec and "Goal Reached" in rec["search_path"]:
        reward, reason = score(rec["search_path"], nums, target)
        if reward != 1.0:
            return f"'search_path' claims the goal but is not a valid path ({reason})"
    return None


def load_split(path: str | os.PathLike) -> list[dict]:
    """Read a split JSONL file, validating every record (fields, types, solution via the verifier).

    Raises FileNotFoundError if missing and ValueError naming the file and line otherwise.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"Countdown split not found: {p} (run `python -m rspo generate`)")
    from rspo.jsonl import iter_jsonl

    records = []
    for lineno, rec in iter_jsonl(p):
        problem = validate_record(rec)
        if problem is not None:
            raise ValueError(f"{p}:{lineno}: {problem}")
        records.append(rec)
    return records


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


# ---------------------------------------------------------------------------------------
# CLI

_CLI_KEYS = [f.name for f in dataclasses.fields(CountdownConfig)]


def _load_preset(path: str) -> dict:
    import yaml

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"preset not found: {p}")
    with p.open(encoding="utf-8") as f:
        doc = yaml.safe_load(f)
    if not isinstance(doc, dict) or "countdown" not in doc:
        raise ValueError(f"preset {p} has no top-level 'countdown:' mapping")
    section = doc["countdown"]
    if not isinstance(section, dict):
        raise ValueError(f"preset {p}: 'countdown' must be a mapping, got {type(section).__name__}")
    unknown = sorted(set(section) - set(_CLI_KEYS))
    if unknown:
        raise ValueError(
            f"preset {p}: unknown key(s) in 'countdown': {', '.join(map(str, unknown))} "
            f"(allowed: {', '.join(_CLI_KEYS)})"
        )
    return section


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m rspo generate",
        description="Generate Countdown splits (train, val, val_target) as JSONL + meta.json.",
    )
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--preset", help="YAML preset; its top-level 'countdown:' mapping gives defaults")
    types = {f.name: (float if f.name == "heldout_target_frac" else int)
             for f in dataclasses.fields(CountdownConfig)}
    for name in _CLI_KEYS:
        default = CountdownConfig.__dataclass_fields__[name].default
        ap.add_argument(f"--{name.replace('_', '-')}", dest=name, type=types[name], default=None,
                        help=f"(default {default})")
    ap.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    ap.add_argument("--quiet", action="store_true", help="no progress bar / progress lines")
    ap.add_argument("--no-traces", dest="traces", action="store_false",
                    help="omit search_path/optimal_path/rating/search_type (rebuilt on demand by "
                         "format_completion); ~10x smaller and faster for 4 numbers")
    return ap


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    values: dict[str, Any] = {}
    try:
        if args.preset:
            values.update(_load_preset(args.preset))
        for name in _CLI_KEYS:
            if getattr(args, name) is not None:
                values[name] = getattr(args, name)
        if args.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {args.workers}")
        cfg = CountdownConfig(**values)
    except (ValueError, FileNotFoundError) as e:
        parser.error(str(e))  # exits with status 2 and the message on stderr
    t0 = time.perf_counter()
    meta = generate(cfg, args.out, workers=args.workers, traces=args.traces, progress=not args.quiet)
    summary = {"out": str(args.out), "counts": meta["counts"],
               "seconds": round(time.perf_counter() - t0, 2)}
    print(json.dumps(summary))
    return 0
