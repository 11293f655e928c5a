"""Countdown data: generator, split loader and text formats (`python -m rspo generate`, whose
command line lives in rspo/commands/data.py).

Modules: ``solver`` (the exhaustive search, scalar and vectorised), ``traces`` (the DFS and
optimal-path traces, rating, records, and the text formats for training), ``generator``
(``CountdownConfig``, split targets, the seeded chunked generator, ``generate``), ``load``
(record validation and ``load_split``). Everything public is importable from this package.

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

from rspo.data.countdown.generator import (
    CHUNK,
    SPLITS,
    CountdownConfig,
    generate,
    generate_split,
    iter_split,
    split_targets,
)
from rspo.data.countdown.load import load_split, validate_record
from rspo.data.countdown.solver import combine_nums, first_solution
from rspo.data.countdown.traces import (
    HEURISTICS,
    STYLES,
    dfs_search_path,
    format_completion,
    format_prompt,
    heuristic_value,
    make_record,
    max_nodes,
    optimal_path,
    rating,
)

__all__ = [
    "CHUNK",
    "HEURISTICS",
    "SPLITS",
    "STYLES",
    "CountdownConfig",
    "combine_nums",
    "dfs_search_path",
    "first_solution",
    "format_completion",
    "format_prompt",
    "generate",
    "generate_split",
    "heuristic_value",
    "iter_split",
    "load_split",
    "make_record",
    "max_nodes",
    "optimal_path",
    "rating",
    "split_targets",
    "validate_record",
]
