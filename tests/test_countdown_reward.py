"""Countdown verifier: hand-written valid and invalid paths in both formats, trailing garbage,
hypothesis fuzzing (never raises, reward in {0, 1})."""

import random
import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rspo.data.countdown import first_solution, make_record
from rspo.rewards.countdown import MAX_DIGITS, score, score_batch

# ---------------------------------------------------------------------------------------
# "steps" format

# 67+34=101, 101-12=89: uses 67, 34, 12 once each and ends at 89.
STEPS_OK = "67+34=101,101-12=89"


def test_steps_valid():
    assert score(STEPS_OK, [67, 34, 12], 89) == (1.0, "ok")
    # Operand order of + and * is free: 34+67=101 is the same step.
    assert score("34+67=101,101-12=89", [67, 34, 12], 89) == (1.0, "ok")
    # Spaces around tokens are tolerated.
    assert score(" 67 + 34 = 101 , 101 - 12 = 89", [67, 34, 12], 89) == (1.0, "ok")


def test_steps_exact_division_and_zero():
    # 84/4=21 (84 = 4*21), 21*2=42.
    assert score("84/4=21,21*2=42", [84, 4, 2], 42) == (1.0, "ok")
    # 5-5=0, 7+0=7: zero is a legal intermediate value.
    assert score("5-5=0,7+0=7", [5, 5, 7], 7) == (1.0, "ok")


def test_steps_wrong_arithmetic():
    # 67+34 is 101, not 100.
    assert score("67+34=100,100-12=88", [67, 34, 12], 88) == (0.0, "invalid operation: 67+34=100")


def test_steps_inexact_division():
    # 50/17 = 2.94..., not exact: invalid even though 50//17 == 2.
    assert score("50/17=2,2*5=10", [50, 17, 5], 10) == (0.0, "invalid operation: 50/17=2")


def test_steps_negative_result():
    # 12-34 would be -22: smaller minus larger is not allowed (written as 12-34=22).
    assert score("12-34=22,22+67=89", [67, 34, 12], 89) == (0.0, "invalid operation: 12-34=22")


def test_steps_division_by_zero():
    # 5-5=0, then 7/0 is not allowed.
    assert score("5-5=0,7/0=0", [5, 5, 7], 0) == (0.0, "invalid operation: 7/0=0")


def test_steps_operand_not_available():
    # 67+13=80 is right arithmetic but 13 is not one of the numbers.
    assert score("67+13=80,80+9=89", [67, 34, 12], 89) == (0.0, "operand 13 not available")
    # 5+5=10 needs two 5s; only one is given.
    assert score("5+5=10,10*3=30", [5, 3, 2], 30) == (0.0, "operand 5 not available")
    # An intermediate result can be used once only: 2+3=5, then 5*5=25 needs a second 5.
    assert score("2+3=5,5*5=25", [2, 3, 4], 25) == (0.0, "operand 5 not available")


def test_steps_final_result_wrong():
    # 67+34=101, 101-12=89 is valid but the target is 90.
    assert score(STEPS_OK, [67, 34, 12], 90) == (0.0, "final result 89 != target 90")


def test_steps_not_all_numbers_used():
    # 5 is never used: 89 is reached with [5, 89] left.
    assert score(STEPS_OK, [67, 34, 12, 5], 89) == (0.0, "not all numbers used")


@pytest.mark.parametrize("text", ["", "   ", "hello", "nums 67 34 12 target 89:", "=101", ",67+34=101"])
def test_steps_no_parsable_path(text):
    assert score(text, [67, 34, 12], 89) == (0.0, "no parsable path")


@pytest.mark.parametrize(
    "suffix",
    ["<eos>junk", " the answer is 89", "\n\nExploring Operation: 1+1=3", ",89+1=90", ",,,", "x" * 1000],
)
def test_steps_trailing_garbage_ignored(suffix):
    # After len(nums) - 1 = 2 steps, everything is ignored (even another valid-looking step).
    assert score(STEPS_OK + suffix, [67, 34, 12], 89) == (1.0, "ok")


def test_steps_garbage_before_the_last_step():
    # The path stops at "junk": one step done, [101, 12] left.
    assert score("67+34=101 junk,101-12=89", [67, 34, 12], 89) == (0.0, "final result 101 != target 89")


def test_steps_digit_glued_to_result_is_wrong_arithmetic():
    # "101-12=8x9": the step reads 101-12=8, which is wrong.
    assert score("67+34=101,101-12=8x9", [67, 34, 12], 89) == (0.0, "invalid operation: 101-12=8")


def test_non_ascii_digits_are_not_numbers():
    # Full-width digits (U+FF16 U+FF17) are \d in Python's re but not ASCII digits.
    assert score("\uff16\uff17+34=101,101-12=89", [67, 34, 12], 89) == (0.0, "no parsable path")


def test_huge_numbers_do_not_crash():
    text = "9" * 5000 + "+1=" + "9" * 5000
    reward, reason = score(text, [67, 34, 12], 89)
    assert reward == 0.0 and f"longer than {MAX_DIGITS} digits" in reason


# ---------------------------------------------------------------------------------------
# Qin et al.'s trace format

# The completion after the prompt "START Current State: 73:[84, 9, 2, 4], Operations: []\n".
# Path: 84-9=75 -> [2, 4, 75]; 4-2=2 -> [75, 2]; 75-2=73 -> [73].
OPTIMAL_OK = (
    "Exploring Operation: 84-9=75, Resulting Numbers: [2, 4, 75]\n"
    "Generated Node #2: [2, 4, 75] from Operation: 84-9=75\n"
    "Current State: 73:[2, 4, 75], Operations: ['84-9=75']\n"
    "Exploring Operation: 4-2=2, Resulting Numbers: [75, 2]\n"
    "Generated Node #3: [75, 2] from Operation: 4-2=2\n"
    "Current State: 73:[75, 2], Operations: ['84-9=75', '4-2=2']\n"
    "Exploring Operation: 75-2=73, Resulting Numbers: [73]\n"
    "73,73 equal: Goal Reached\n"
)

# A DFS trace with a dead end first: 84+9=93 -> [2, 4, 93]; 2*4=8 -> [93, 8]; 93-8=85 != 73;
# back to the root; 84-9=75 -> [2, 4, 75]; 4-2=2 -> [75, 2]; 75-2=73.
SEARCH_OK = (
    "Exploring Operation: 84+9=93, Resulting Numbers: [2, 4, 93]\n"
    "Generated Node #0,0: 73:[2, 4, 93] Operation: 84+9=93\n"
    "Moving to Node #0,0\n"
    "Current State: 73:[2, 4, 93], Operations: ['84+9=93']\n"
    "Exploring Operation: 2*4=8, Resulting Numbers: [93, 8]\n"
    "Generated Node #0,0,0: 73:[93, 8] Operation: 2*4=8\n"
    "Moving to Node #0,0,0\n"
    "Current State: 73:[93, 8], Operations: ['84+9=93', '2*4=8']\n"
    "Exploring Operation: 93-8=85, Resulting Numbers: [85]\n"
    "85,73 unequal: No Solution\n"
    "Moving to Node #0\n"
    "Current State: 73:[84, 9, 2, 4], Operations: []\n"
    "Exploring Operation: 84-9=75, Resulting Numbers: [2, 4, 75]\n"
    "Generated Node #0,1: 73:[2, 4, 75] Operation: 84-9=75\n"
    "Moving to Node #0,1\n"
    "Current State: 73:[2, 4, 75], Operations: ['84-9=75']\n"
    "Exploring Operation: 4-2=2, Resulting Numbers: [75, 2]\n"
    "Generated Node #0,1,0: 73:[75, 2] Operation: 4-2=2\n"
    "Moving to Node #0,1,0\n"
    "Current State: 73:[75, 2], Operations: ['84-9=75', '4-2=2']\n"
    "Exploring Operation: 75-2=73, Resulting Numbers: [73]\n"
    "73,73 equal: Goal Reached\n"
)
NUMS, TARGET = [84, 9, 2, 4], 73


def test_trace_valid():
    assert score(OPTIMAL_OK, NUMS, TARGET) == (1.0, "ok")
    assert score(SEARCH_OK, NUMS, TARGET) == (1.0, "ok")
    # With the prompt included (START + root state line) it is graded the same.
    prompt = "START Current State: 73:[84, 9, 2, 4], Operations: []\n"
    assert score(prompt + SEARCH_OK, NUMS, TARGET) == (1.0, "ok")


def test_trace_two_numbers_goal_from_root():
    # No "Current State" line in the completion: the parent is the root (prompt). 3+5=8.
    text = "Exploring Operation: 3+5=8, Resulting Numbers: [8]\n8,8 equal: Goal Reached\n"
    assert score(text, [3, 5], 8) == (1.0, "ok")


def test_trace_wrong_final_arithmetic():
    text = SEARCH_OK.replace("Exploring Operation: 75-2=73", "Exploring Operation: 75-3=73")
    assert score(text, NUMS, TARGET) == (0.0, "invalid operation: 75-3=73")


def test_trace_wrong_arithmetic_in_state_operations():
    # The path's first step as recorded in the last state line is 84-9=76 (wrong).
    text = SEARCH_OK.replace("Operations: ['84-9=75', '4-2=2']", "Operations: ['84-9=76', '4-2=2']")
    assert score(text, NUMS, TARGET) == (0.0, "invalid operation: 84-9=76")


def test_trace_final_result_not_target():
    # A valid path to 73 graded against target 74.
    assert score(SEARCH_OK, NUMS, 74) == (0.0, "final result 73 != target 74")
    # 75*2=150 from [75, 2] is right arithmetic but not the target, whatever the goal line says.
    text = OPTIMAL_OK.replace("75-2=73, Resulting Numbers: [73]", "75*2=150, Resulting Numbers: [150]")
    assert score(text, NUMS, TARGET) == (0.0, "final result 150 != target 73")


def test_trace_not_all_numbers_used():
    # Parent state claims only 84-9=75 was done; the final 75-2=73 leaves 4 unused.
    text = (
        "Current State: 73:[2, 4, 75], Operations: ['84-9=75']\n"
        "Exploring Operation: 75-2=73, Resulting Numbers: [4, 73]\n"
        "73,73 equal: Goal Reached\n"
    )
    assert score(text, NUMS, TARGET) == (0.0, "not all numbers used")


def test_trace_operand_not_available():
    # 75-2=73 after ['84-9=75', '2*4=8']: the 2 was already used.
    text = (
        "Current State: 73:[75, 8], Operations: ['84-9=75', '2*4=8']\n"
        "Exploring Operation: 75-2=73, Resulting Numbers: [73]\n"
        "73,73 equal: Goal Reached\n"
    )
    assert score(text, NUMS, TARGET) == (0.0, "operand 2 not available")


def test_trace_without_goal():
    text = SEARCH_OK.split("73,73 equal")[0]
    assert score(text, NUMS, TARGET) == (0.0, "goal not reached")
    # "unequal: No Solution" is not a goal.
    assert score(
        "Exploring Operation: 93-8=85, Resulting Numbers: [85]\n85,73 unequal: No Solution\n", NUMS, TARGET
    ) == (0.0, "goal not reached")


def test_trace_goal_without_operation():
    assert score("Current State: 73:[73], Operations: []\n73,73 equal: Goal Reached", NUMS, TARGET) == (
        0.0,
        "no parsable path",
    )


def test_trace_unparsable_final_operation():
    text = OPTIMAL_OK.replace("Exploring Operation: 75-2=73", "Exploring Operation: 75 minus 2")
    reward, reason = score(text, NUMS, TARGET)
    assert reward == 0.0 and reason.startswith("unparsable operation")


@pytest.mark.parametrize(
    "suffix",
    [
        "<eos>",
        "Exploring Operation: 1+1=3, Resulting Numbers: [3]\n3,73 equal: Goal Reached\n",
        "END " * 50,
        "\x00\x01garbage",
    ],
)
def test_trace_trailing_garbage_after_goal(suffix):
    assert score(SEARCH_OK + suffix, NUMS, TARGET) == (1.0, "ok")


def test_trace_first_goal_counts():
    # A wrong "goal" before the right one decides: 93-8=85 claimed as goal.
    bad = SEARCH_OK.replace("85,73 unequal: No Solution", "85,73 equal: Goal Reached")
    assert score(bad, NUMS, TARGET) == (0.0, "final result 85 != target 73")


def test_trace_spaced_tokens():
    # WordPiece-style decoded text ("84 - 9 = 75", "[ 2, 4, 75 ]") is still read.
    spaced = OPTIMAL_OK.replace("84-9=75", "84 - 9 = 75").replace("4-2=2", "4 - 2 = 2")
    spaced = spaced.replace("75-2=73", "75 - 2 = 73")
    assert score(spaced, NUMS, TARGET) == (1.0, "ok")


def test_generated_records_score_one():
    rng = random.Random(0)
    done = 0
    while done < 60:
        n = rng.choice([2, 3, 4])
        target, nums = rng.randint(10, 100), [rng.randint(1, 99) for _ in range(n)]
        sol = first_solution(target, nums)
        if sol is None:
            continue
        rec = make_record(target, nums, sol, rng.choice(["sum_heuristic", "mult_heuristic"]))
        assert score(",".join(sol), nums, target) == (1.0, "ok")
        assert score(rec["optimal_path"], nums, target) == (1.0, "ok")
        if "Goal Reached" in rec["search_path"]:
            assert score(rec["search_path"], nums, target) == (1.0, "ok")
        # Breaking the last step's result breaks the path.
        last = sol[-1]
        wrong = last[: last.index("=") + 1] + str(target + 1)
        assert score(",".join(sol[:-1] + [wrong]), nums, target)[0] == 0.0
        done += 1


def test_score_batch_and_bad_problem():
    out = score_batch([STEPS_OK, "nope"], [[67, 34, 12], [67, 34, 12]], [89, 89])
    assert out == [(1.0, "ok"), (0.0, "no parsable path")]
    with pytest.raises(ValueError, match="lengths differ"):
        score_batch([STEPS_OK], [[67, 34, 12], [1, 2]], [89])
    with pytest.raises(ValueError, match="nums"):
        score(STEPS_OK, [67], 89)
    with pytest.raises(ValueError, match="target"):
        score(STEPS_OK, [67, 34, 12], "89")
    assert score(None, [67, 34, 12], 89)[0] == 0.0  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------
# Fuzzing: never raises, reward in {0.0, 1.0}, reason a str.

ALPHABET = string.digits + "+-*/=,:[]#' \n\t"
WORDS = [
    "Current State: ",
    "Operations: ",
    "Exploring Operation: ",
    "Resulting Numbers: ",
    "Generated Node #",
    "Moving to Node #",
    " equal: Goal Reached",
    " unequal: No Solution",
    "START ",
    "'",
    "[",
    "]",
]
VALID = [STEPS_OK, OPTIMAL_OK, SEARCH_OK]


def _check(result):
    reward, reason = result
    assert reward in (0.0, 1.0) and isinstance(reward, float)
    assert isinstance(reason, str) and reason


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text())
def test_fuzz_arbitrary_text(text):
    _check(score(text, NUMS, TARGET))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(WORDS), st.text(alphabet=ALPHABET, max_size=6)), max_size=40))
def test_fuzz_countdown_alphabet(parts):
    text = "".join(parts)
    _check(score(text, NUMS, TARGET))
    _check(score(text, [67, 34, 12], 89))


EDITS = st.lists(
    st.tuples(st.sampled_from(["ins", "del", "sub"]), st.floats(0, 1), st.sampled_from(list(ALPHABET) + ["9" * 20])),
    max_size=6,
)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(VALID), EDITS)
def test_fuzz_mutated_valid_completions(base, edits):
    nums, target = ([67, 34, 12], 89) if base is STEPS_OK else (NUMS, TARGET)
    text = base
    for kind, where, piece in edits:
        i = int(where * len(text))
        if kind == "ins":
            text = text[:i] + piece + text[i:]
        elif kind == "del":
            text = text[:i] + text[i + 1 :]
        else:
            text = text[:i] + piece + text[i + 1 :]
    result = score(text, nums, target)
    _check(result)
    if text == base:
        assert result == (1.0, "ok")
