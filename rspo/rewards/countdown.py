"""Countdown verifier: one function used for both the RL reward and evaluation.

`score(completion, nums, target) -> (reward, reason)` returns 1.0 when the completion's
operations are all valid and reach `target` using every number of `nums` exactly once,
else 0.0, with a short reason ("ok", "invalid operation: 50/17=2", ...).

Rules (the same as the generator, `rspo.data.countdown`): an operation combines two
available numbers `a op b = r` and replaces them by `r`:
- `a+b`, `a*b` (either operand order);
- `a-b` only when `a >= b` (no negative intermediate results);
- `a/b` only when `b != 0` and `a % b == 0` (exact division);
- the arithmetic must be right, and the final single remaining number must equal the target.

Two completion formats are graded (auto-detected):

1. "steps" (our compact format): `67+34=101,101-12=89,...`, steps separated by "," (spaces
   around tokens tolerated). The answer is the first `len(nums) - 1` steps (that many
   steps reduce the numbers to one); whatever follows them is ignored, as is anything
   after the first piece of text that is not `,<step>`. Fewer steps than needed gives
   "not all numbers used" (or "final result ...").
2. Qin et al.'s trace format ("optimal_path" / "search_path" lines, see
   `rspo.data.countdown`): as in their checker (`countdown_utils.parse_trajectory` in
   KempnerInstitute/Backtrack, used by their verl reward `compute_score`), only the text
   before the FIRST "x,y equal: Goal Reached" line is considered; the final operation is
   the last "Exploring Operation: ..." before it, and the operations leading to its
   parent node are the `Operations: [...]` list of the last "Current State" line before
   that final operation; with no such line the parent is the root (whose state line is
   the prompt). That reconstructed path is checked operation by operation. Text after
   "Goal Reached" is ignored.

Differences from Qin et al.'s checker (all make ours stricter or more robust; none changes
the reward of a trace their generator writes):
- The problem (`nums`, `target`) is passed in, not re-read from the trace's first line,
  so the policy cannot change the problem it is graded on.
- Each operand is removed from the multiset of available numbers (theirs compares ints
  with strings and never removes any), all numbers must be used, negative results and
  inexact divisions are invalid (theirs `eval`s the expression: `3-5=-2` would pass).
- The final operation's result is checked against the given target; the number printed
  in the "x,y equal: Goal Reached" line itself is not (neither does theirs).
- Whitespace around tokens is tolerated, so no `parse_trajectory_qwen`-style respacing
  is needed; numbers are ASCII digits only, at most `MAX_DIGITS` long (longer ones are
  invalid, so `int()` never sees a huge string).
- `score` never raises on any completion string (fuzzed with hypothesis in the tests).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

__all__ = ["MAX_DIGITS", "score", "score_batch", "parse_steps", "apply_operations"]

MAX_DIGITS = 12
"""Longest number (in digits) the verifier accepts in a completion."""

# One operation `a op b = r`; ASCII digits only ([0-9], not \d, which matches any Unicode digit).
_OP = r"([0-9]+)\s*([+\-*/])\s*([0-9]+)\s*=\s*([0-9]+)"
_STEP_RE = re.compile(r"\s*" + _OP)
_SEP_RE = re.compile(r"\s*,")
_OP_FULL_RE = re.compile(r"\s*" + _OP + r"\s*")
# "x,y equal: Goal Reached" is found as "equal: Goal Reached" (a literal-led regex, fast)
# whose preceding text ends with "x,y " (the reversed pattern on the reversed prefix): the
# same matches as [0-9]+\s*,\s*[0-9]+\s+equal\s*:\s*Goal\s+Reached when the "x,y " head
# is at most _GOAL_HEAD_WINDOW characters long; ~20x faster on a 10 kB trace.
_GOAL_TAIL_RE = re.compile(r"equal\s*:\s*Goal\s+Reached")
_GOAL_HEAD_REV_RE = re.compile(r"\s+[0-9]+\s*,\s*[0-9]+")
_GOAL_HEAD_WINDOW = 256  # longest "x,y " head considered (numbers are <= MAX_DIGITS anyway)
_EXPLORE_RE = re.compile(r"Exploring\s+Operation\s*:\s*([^,\n]*)")
# List contents are bounded (a real state line is < 200 characters) so that a failed match
# costs O(1), not the rest of the line: no quadratic time on adversarial text.
_STATE_RE = re.compile(
    r"Current\s+State\s*:\s*[0-9]+\s*:\s*\[[^\]\n]{0,512}\]"
    r"\s*,\s*Operations\s*:\s*\[([^\]\n]{0,2048})\]"
)
_TRACE_HINT_RE = re.compile(r"Goal\s+Reached|Exploring\s+Operation|Current\s+State")

Op = tuple[int, str, int, int]  # (a, symbol, b, claimed result)


def _show(text: str, limit: int = 40) -> str:
    """A short printable excerpt of `text` for reason strings."""
    text = text.strip()
    return text if len(text) <= limit else text[:limit] + "..."


def _to_op(m: re.Match[str]) -> Op | str:
    """A regex match of `_OP` -> (a, sym, b, r), or a reason string if a number is too long."""
    a, sym, b, r = m.group(1), m.group(2), m.group(3), m.group(4)
    if max(len(a), len(b), len(r)) > MAX_DIGITS:
        return f"invalid operation: number longer than {MAX_DIGITS} digits"
    return int(a), sym, int(b), int(r)


def _fmt(op: Op) -> str:
    a, sym, b, r = op
    return f"{a}{sym}{b}={r}"


def apply_operations(ops: Sequence[Op], nums: Sequence[int], target: int) -> tuple[float, str]:
    """Check a parsed path `ops` against the problem; (1.0, "ok") iff it is a valid solution.

    Each op (a, sym, b, r) must be arithmetically right under the rules above and use two
    numbers currently available (a multiset: `nums`, minus used operands, plus results).
    """
    if not ops:
        return 0.0, "no parsable path"
    avail = Counter(nums)
    for op in ops:
        a, sym, b, r = op
        if sym == "+":
            true = a + b
        elif sym == "*":
            true = a * b
        elif sym == "-":
            true = a - b if a >= b else None  # larger minus smaller only
        else:  # "/"
            true = a // b if b != 0 and a % b == 0 else None  # exact division only
        if true is None or true != r:
            return 0.0, f"invalid operation: {_fmt(op)}"
        for x in (a, b):
            if avail[x] <= 0:
                return 0.0, f"operand {x} not available"
            avail[x] -= 1
        avail[r] += 1
    final = ops[-1][3]
    if final != target:
        return 0.0, f"final result {final} != target {target}"
    if sum(avail.values()) != 1:
        return 0.0, "not all numbers used"
    return 1.0, "ok"


def parse_steps(completion: str, max_steps: int) -> list[Op] | str:
    """Parse up to `max_steps` leading "a op b = r" steps separated by ","; the rest is ignored.

    Returns the list of ops, or a reason string (a number too long).
    """
    ops: list[Op] = []
    pos = 0
    while len(ops) < max_steps:
        m = _STEP_RE.match(completion, pos)
        if m is None:
            break
        op = _to_op(m)
        if isinstance(op, str):
            return op
        ops.append(op)
        pos = m.end()
        sep = _SEP_RE.match(completion, pos)
        if sep is None:
            break
        pos = sep.end()
    return ops


def _goal_start(text: str) -> int:
    """Start of the first "x,y equal: Goal Reached" in `text`, or -1.

    The "x,y " head is looked for in the `_GOAL_HEAD_WINDOW` characters before "equal"
    (reversed), so scanning stays linear even for text with many "equal: Goal Reached".
    """
    for tail in _GOAL_TAIL_RE.finditer(text):
        s = tail.start()
        head = _GOAL_HEAD_REV_RE.match(text[max(0, s - _GOAL_HEAD_WINDOW) : s][::-1])
        if head is not None:
            return s - head.end()
    return -1


def _last_match(regex: re.Pattern[str], text: str, keyword: str, end: int) -> re.Match[str] | None:
    """The match of `regex` (which starts with `keyword`) starting last before `end`."""
    pos = end
    while True:
        pos = text.rfind(keyword, 0, pos)
        if pos < 0:
            return None
        m = regex.match(text, pos, end)
        if m is not None:
            return m


def _parse_trace(completion: str) -> list[Op] | str:
    """Reconstruct the path that reaches the first "Goal Reached" (see the module docstring)."""
    goal = _goal_start(completion)
    if goal < 0:
        return "goal not reached"
    last = _last_match(_EXPLORE_RE, completion, "Exploring", goal)
    if last is None:
        return "no parsable path"
    final = _parse_op(last.group(1))
    if isinstance(final, str):
        return final
    state = _last_match(_STATE_RE, completion, "Current", last.start())
    ops: list[Op] = []
    if state is not None:
        for item in state.group(1).split(","):
            item = item.strip().strip("'\"").strip()
            if not item:
                continue  # "Operations: []"
            op = _parse_op(item)
            if isinstance(op, str):
                return op
            ops.append(op)
    ops.append(final)
    return ops


def _parse_op(text: str) -> Op | str:
    """One whole operation ("a+b=c") of a search trace, or why it is not one."""
    m = _OP_FULL_RE.fullmatch(text)
    return f"unparsable operation: {_show(text)!r}" if m is None else _to_op(m)


def _check_problem(nums: Sequence[int], target: int) -> None:
    if isinstance(nums, (str, bytes)) or not isinstance(nums, Sequence) or len(nums) < 2:
        raise ValueError(f"nums must be a list of at least 2 ints, got {nums!r}")
    for x in nums:
        if isinstance(x, bool) or not isinstance(x, int) or x < 0:
            raise ValueError(f"nums must hold non-negative ints, got {nums!r}")
    if isinstance(target, bool) or not isinstance(target, int):
        raise ValueError(f"target must be an int, got {target!r}")


def score(completion: str, nums: Sequence[int], target: int) -> tuple[float, str]:
    """Binary Countdown reward: (1.0, "ok") for a valid path to `target` using all `nums`.

    `completion` is the generated text after the prompt, in the "steps" format or in
    Qin et al.'s trace format (auto-detected: a completion starting with a step is graded
    as steps, otherwise as a trace if it has trace keywords). Never raises on any string;
    raises ValueError only for a malformed problem (`nums`, `target`).
    """
    _check_problem(nums, target)
    if not isinstance(completion, str):
        return 0.0, f"completion is not a string ({type(completion).__name__})"
    if _STEP_RE.match(completion) is not None:
        ops = parse_steps(completion, max_steps=len(nums) - 1)
    elif _TRACE_HINT_RE.search(completion) is not None:
        ops = _parse_trace(completion)
    else:
        return 0.0, "no parsable path"
    if isinstance(ops, str):
        return 0.0, ops
    return apply_operations(ops, nums, target)


def score_batch(
    completions: Sequence[str], nums_list: Sequence[Sequence[int]], targets: Sequence[int]
) -> list[tuple[float, str]]:
    """`score` over a batch (a plain loop: ~2-20 us per completion)."""
    if not (len(completions) == len(nums_list) == len(targets)):
        raise ValueError(
            f"score_batch: lengths differ: {len(completions)} completions, "
            f"{len(nums_list)} nums, {len(targets)} targets"
        )
    return [score(c, n, t) for c, n, t in zip(completions, nums_list, targets, strict=True)]
