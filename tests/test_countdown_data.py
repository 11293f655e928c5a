"""Countdown generator: search and traces against hand-worked examples and a reference
implementation, split invariants, determinism, CLI, loader errors."""

import itertools
import json
import random
from pathlib import Path

import numpy as np
import pytest

import rspo.data.countdown as cd
from rspo.commands.data import generate_main as main
from rspo.data.countdown import (
    CountdownConfig,
    dfs_search_path,
    first_solution,
    format_completion,
    format_prompt,
    generate_split,
    generator,
    heuristic_value,
    load_split,
    optimal_path,
    rating,
    solver,
    split_targets,
)
from rspo.rewards.countdown import score

# ---------------------------------------------------------------------------------------
# Search and traces


def test_first_solution_hand_worked():
    # DFS order: pair (84, 9) first; 84+9=93 and 84*9=756 lead nowhere (checked by hand),
    # 84-9=75 -> [2, 4, 75]: 2+4=6 -> 81/450/69, 2*4=8 -> 83/600/67, 4-2=2 -> 75-2=73.
    assert first_solution(73, [84, 9, 2, 4]) == ["84-9=75", "4-2=2", "75-2=73"]
    # 1+1=2, 2*1=2, ... nothing reaches 100 from three 1s.
    assert first_solution(100, [1, 1, 1]) is None
    # Division is exact only: 7/2 is never produced, so [7, 2] cannot make 3.
    assert first_solution(3, [7, 2]) is None
    assert first_solution(4, [8, 2]) == ["8/2=4"]


def test_combine_nums_order():
    # Qin et al.'s order: +, *, larger-smaller, exact larger/smaller.
    assert cd.combine_nums(3, 12) == [(15, "3+12=15"), (36, "3*12=36"), (9, "12-3=9"), (4, "12/3=4")]
    assert cd.combine_nums(12, 5) == [(17, "12+5=17"), (60, "12*5=60"), (7, "12-5=7")]
    assert cd.combine_nums(0, 5) == [(5, "0+5=5"), (0, "0*5=0"), (5, "5-0=5")]  # no division by 0


def test_heuristics_hand_computed():
    # sum_heuristic: mean |x - t|: (|3-10| + |8-10|) / 2 = 4.5; one number: |11 - 10| = 1.
    assert heuristic_value("sum_heuristic", [3, 8], 10) == 4.5
    assert heuristic_value("sum_heuristic", [11], 10) == 1
    # mult_heuristic: factors of 10 (>= 2) are 2, 5, 10: 3 -> 1 (to 2), 8 -> 2 (to 10).
    assert heuristic_value("mult_heuristic", [3, 8], 10) == 3
    # 73 is prime: its only factor is 73.
    assert heuristic_value("mult_heuristic", [2, 4, 75], 73) == 71 + 69 + 2
    assert heuristic_value("mult_heuristic", [1, 3], 1) == 0 + 2  # target 1: factor list [1]


# Hand-derived (see the comments): nums [2, 3, 4], target 10, sum_heuristic.
# Root children (mean |x-10|): 2*4=8 -> [3, 8] 4.5; 2*3=6 -> [4, 6] 5; 3*4=12 -> [2, 12] 5; ...
# [3, 8]: 3+8=11 (h 1), 3*8=24 (h 14 > 10, pruned), 8-3=5 (h 5) -> both dead ends.
# [4, 6]: 4+6=10 (h 0) -> goal.
HAND_TRACE = """\
Current State: 10:[2, 3, 4], Operations: []
Exploring Operation: 2*4=8, Resulting Numbers: [3, 8]
Generated Node #0,0: 10:[3, 8] Operation: 2*4=8
Moving to Node #0,0
Current State: 10:[3, 8], Operations: ['2*4=8']
Exploring Operation: 3+8=11, Resulting Numbers: [11]
11,10 unequal: No Solution
Moving to Node #0,0
Current State: 10:[3, 8], Operations: ['2*4=8']
Exploring Operation: 8-3=5, Resulting Numbers: [5]
5,10 unequal: No Solution
Moving to Node #0
Current State: 10:[2, 3, 4], Operations: []
Exploring Operation: 2*3=6, Resulting Numbers: [4, 6]
Generated Node #0,1: 10:[4, 6] Operation: 2*3=6
Moving to Node #0,1
Current State: 10:[4, 6], Operations: ['2*3=6']
Exploring Operation: 4+6=10, Resulting Numbers: [10]
10,10 equal: Goal Reached
"""


def test_dfs_trace_hand_worked():
    trace = dfs_search_path(10, [2, 3, 4], "sum_heuristic")
    assert trace == HAND_TRACE
    assert score(trace, [2, 3, 4], 10) == (1.0, "ok")
    # rating = 1 - (5 "Exploring Operation" lines + 1) / 48 (3 numbers: C(3,2)*4 * C(2,2)*4 = 48)
    assert rating(trace, 3) == pytest.approx(1 - 6 / 48)


def test_dfs_trace_pruned_to_failure():
    # 73 is prime, so mult_heuristic of every child of [84, 9, 2, 4] exceeds 73: all pruned,
    # the trace is the root line only (their search fails; the problem is still solvable).
    assert dfs_search_path(73, [84, 9, 2, 4], "mult_heuristic") == ("Current State: 73:[84, 9, 2, 4], Operations: []\n")
    assert rating("Current State: 73:[84, 9, 2, 4], Operations: []\n", 4) == 0.0


def test_optimal_path_hand_worked():
    assert optimal_path(73, [84, 9, 2, 4], ["84-9=75", "4-2=2", "75-2=73"]) == (
        "Current State: 73:[84, 9, 2, 4], Operations: []\n"
        "Exploring Operation: 84-9=75, Resulting Numbers: [2, 4, 75]\n"
        "Generated Node #2: [2, 4, 75] from Operation: 84-9=75\n"
        "Current State: 73:[2, 4, 75], Operations: ['84-9=75']\n"
        "Exploring Operation: 4-2=2, Resulting Numbers: [75, 2]\n"
        "Generated Node #3: [75, 2] from Operation: 4-2=2\n"
        "Current State: 73:[75, 2], Operations: ['84-9=75', '4-2=2']\n"
        "Exploring Operation: 75-2=73, Resulting Numbers: [73]\n"
        "73,73 equal: Goal Reached\n"
    )
    # Operands are removed by value (first occurrence): [5, 2, 7, 5] - {7, 5} = [2, 5], + 12.
    # 7+5=12, 12*2=24, 24+5=29.
    path = optimal_path(29, [5, 2, 7, 5], ["7+5=12", "12*2=24", "24+5=29"])
    assert "Exploring Operation: 7+5=12, Resulting Numbers: [2, 5, 12]\n" in path
    assert score(path, [5, 2, 7, 5], 29) == (1.0, "ok")


def _reference_dfs(target, nums, heuristic):
    """Straightforward transcription of Qin et al.'s DFS: node objects, full heuristic per child."""
    out = []

    def visit(idx, cur, ops):
        out.append(f"Current State: {target}:{cur}, Operations: {ops}")
        kids = []
        for i, j in itertools.combinations(range(len(cur)), 2):
            for res, op in cd.combine_nums(cur[i], cur[j]):
                new = [cur[k] for k in range(len(cur)) if k not in (i, j)] + [res]
                kids.append({"h": heuristic_value(heuristic, new, target), "nums": new, "op": op})
        kids = sorted((k for k in kids if k["h"] <= target), key=lambda k: k["h"])
        for g, kid in enumerate(kids):
            out.append(f"Exploring Operation: {kid['op']}, Resulting Numbers: {kid['nums']}")
            if len(kid["nums"]) == 1:
                if kid["nums"][0] == target:
                    out.append(f"{target},{target} equal: Goal Reached")
                    return True
                out.append(f"{kid['nums'][0]},{target} unequal: No Solution")
            else:
                out.append(f"Generated Node #{idx},{g}: {target}:{kid['nums']} Operation: {kid['op']}")
                out.append(f"Moving to Node #{idx},{g}")
                if visit(f"{idx},{g}", kid["nums"], ops + [kid["op"]]):
                    return True
            if g < len(kids) - 1:
                out.append(f"Moving to Node #{idx}")
                out.append(f"Current State: {target}:{cur}, Operations: {ops}")
        return False

    visit("0", list(nums), [])
    return "".join(line + "\n" for line in out)


def test_dfs_trace_matches_reference():
    rng = random.Random(1)
    for _ in range(150):
        n = rng.choice([2, 3, 4])
        target, nums = rng.randint(10, 100), [rng.randint(1, 99) for _ in range(n)]
        for h in cd.HEURISTICS:
            assert dfs_search_path(target, nums, h) == _reference_dfs(target, nums, h)


def test_vectorised_solvability_matches_scalar_search():
    rng = np.random.default_rng(0)
    for n, hi, tmax in [(2, 5, 12), (3, 4, 30), (3, 99, 100), (4, 6, 40), (4, 99, 100)]:
        nums = rng.integers(0 if hi < 10 else 1, hi + 1, size=(600, n))
        target = rng.integers(0, tmax + 1, size=600)
        fast = solver._solvable_batch(nums.astype(np.int64), target.astype(np.int64))
        slow = [first_solution(int(t), row.tolist()) is not None for row, t in zip(nums, target, strict=True)]
        assert fast.tolist() == slow
        assert 0 < sum(slow) < 600  # both outcomes exercised


# ---------------------------------------------------------------------------------------
# Generated splits


def _read(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


@pytest.fixture(scope="module", params=[3, 4], ids=["3num", "4num"])
def generated(request, tmp_path_factory):
    n = request.param
    out = tmp_path_factory.mktemp(f"cd{n}")
    if n == 3:
        sizes = {"train": 500, "val": 120, "val_target": 80}
    else:
        sizes = {"train": 250, "val": 60, "val_target": 40}
    rc = main(
        [
            "--out",
            str(out),
            "--num-numbers",
            str(n),
            "--train-size",
            str(sizes["train"]),
            "--val-size",
            str(sizes["val"]),
            "--val-target-size",
            str(sizes["val_target"]),
            "--seed",
            "7",
        ]
    )
    assert rc == 0
    return n, out, sizes


def test_files_and_sizes(generated):
    n, out, sizes = generated
    meta = json.loads((out / "meta.json").read_text())
    assert meta["counts"] == sizes
    assert meta["config"]["num_numbers"] == n and meta["config"]["seed"] == 7
    for split, size in sizes.items():
        assert len(load_split(out / f"{split}.jsonl")) == size
    assert not list(out.glob(".*tmp"))  # no temporary file left behind


def test_every_record_is_solved_and_well_formed(generated):
    n, out, _ = generated
    for split in cd.SPLITS:
        for rec in _read(out / f"{split}.jsonl"):
            assert len(rec["nums"]) == n and all(1 <= x <= 99 for x in rec["nums"])
            assert 10 <= rec["target"] <= 100
            assert len(rec["solution"]) == n - 1
            assert rec["solution"] == first_solution(rec["target"], rec["nums"])
            assert score(",".join(rec["solution"]), rec["nums"], rec["target"]) == (1.0, "ok")
            assert score(rec["optimal_path"], rec["nums"], rec["target"]) == (1.0, "ok")
            reached = "Goal Reached" in rec["search_path"]
            assert (rec["rating"] > 0) == reached
            if reached:
                assert score(rec["search_path"], rec["nums"], rec["target"]) == (1.0, "ok")
            assert rec["search_path"] == dfs_search_path(rec["target"], rec["nums"], rec["heuristic"])
            assert list(rec) == [
                "nums",
                "target",
                "solution",
                "search_path",
                "rating",
                "search_type",
                "optimal_path",
                "heuristic",
            ]


def test_split_disjointness(generated):
    _, out, _ = generated
    meta = json.loads((out / "meta.json").read_text())
    train_t, held_t = set(meta["train_targets"]), set(meta["val_target_targets"])
    assert train_t.isdisjoint(held_t) and train_t | held_t == set(range(10, 101))
    assert len(held_t) == 9  # int(91 * 0.1), as their len // 10
    train, val, vt = (_read(out / f"{s}.jsonl") for s in cd.SPLITS)
    assert {r["target"] for r in train} <= train_t
    assert {r["target"] for r in val} <= train_t
    assert {r["target"] for r in vt} <= held_t
    train_solutions = {",".join(r["solution"]) for r in train}
    assert not any(",".join(r["solution"]) in train_solutions for r in val)


def test_val_redraws_solutions_in_exclude():
    cfg = CountdownConfig(num_numbers=3, train_size=0, val_size=0, val_target_size=0)
    targets, _ = split_targets(cfg)
    first = generate_split(cfg, "val", 200, targets, traces=False)
    excluded = {",".join(r["solution"]) for r in first[:100]}
    second = generate_split(cfg, "val", 200, targets, exclude=excluded, traces=False)
    assert not any(",".join(r["solution"]) in excluded for r in second)
    # The same stream would have reproduced `first`: the excluded problems were redrawn.
    assert second[100:] != first[100:] or second[:100] != first[:100]
    assert sum(a != b for a, b in zip(first, second, strict=True)) >= 100


def test_determinism_seed_and_workers(tmp_path, monkeypatch):
    args = ["--num-numbers", "3", "--train-size", "230", "--val-size", "40", "--val-target-size", "30"]
    monkeypatch.setattr(generator, "CHUNK", 50)  # several chunks, so workers matter
    assert main(["--out", str(tmp_path / "a"), *args, "--seed", "1"]) == 0
    assert main(["--out", str(tmp_path / "b"), *args, "--seed", "1", "--workers", "2"]) == 0
    assert main(["--out", str(tmp_path / "c"), *args, "--seed", "2"]) == 0
    for split in cd.SPLITS:
        a, b, c = ((tmp_path / d / f"{split}.jsonl").read_bytes() for d in "abc")
        assert a == b
        assert a != c


def test_no_traces_records_rebuild_the_same_text(tmp_path):
    cfg = CountdownConfig(num_numbers=3, train_size=0, val_size=0, val_target_size=0, seed=3)
    targets, _ = split_targets(cfg)
    full = generate_split(cfg, "train", 60, targets)
    slim = generate_split(cfg, "train", 60, targets, traces=False)
    assert [r["solution"] for r in full] == [r["solution"] for r in slim]
    assert set(slim[0]) == {"nums", "target", "solution", "heuristic"}
    for a, b in zip(full, slim, strict=True):
        for style in cd.STYLES:
            assert format_prompt(a, style) == format_prompt(b, style)
            assert format_completion(a, style) == format_completion(b, style)


def test_three_numbers_preset_and_override(tmp_path):
    preset = tmp_path / "p.yaml"
    preset.write_text(
        "countdown:\n  num_numbers: 3\n  train_size: 40\n  val_size: 10\n"
        "  val_target_size: 10\n  max_number: 20\n  seed: 5\n"
    )
    assert main(["--out", str(tmp_path / "o"), "--preset", str(preset), "--train-size", "25"]) == 0
    meta = json.loads((tmp_path / "o" / "meta.json").read_text())
    assert meta["counts"] == {"train": 25, "val": 10, "val_target": 10}
    assert meta["config"]["max_number"] == 20 and meta["config"]["num_numbers"] == 3
    recs = load_split(tmp_path / "o" / "train.jsonl")
    assert all(len(r["nums"]) == 3 and max(r["nums"]) <= 20 for r in recs)


# ---------------------------------------------------------------------------------------
# Text formats


def test_formats():
    rec = {"nums": [67, 34, 12], "target": 89, "solution": ["67+34=101", "101-12=89"], "heuristic": "sum_heuristic"}
    assert format_prompt(rec, "steps") == "nums 67 34 12 target 89:"
    assert format_completion(rec, "steps") == "67+34=101,101-12=89"
    for style in ("optimal_path", "search_path"):
        prompt, completion = format_prompt(rec, style), format_completion(rec, style)
        assert prompt == "START Current State: 89:[67, 34, 12], Operations: []\n"
        trace = (
            optimal_path(89, [67, 34, 12], rec["solution"])
            if style == "optimal_path"
            else dfs_search_path(89, [67, 34, 12], "sum_heuristic")
        )
        assert prompt + completion == "START " + trace
        assert score(completion, rec["nums"], rec["target"])[0] == (1.0 if "Goal" in trace else 0.0)
    with pytest.raises(ValueError, match="style"):
        format_prompt(rec, "chat")


# ---------------------------------------------------------------------------------------
# Errors


def _good_record():
    return {"nums": [67, 34, 12], "target": 89, "solution": ["67+34=101", "101-12=89"]}


def test_load_split_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        load_split(tmp_path / "missing.jsonl")
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text(json.dumps(_good_record()) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: malformed JSON"):
        load_split(bad_json)
    unsolvable = tmp_path / "unsolvable.jsonl"
    rec = _good_record() | {"target": 90}
    unsolvable.write_text(json.dumps(_good_record()) + "\n" + json.dumps(rec) + "\n")
    msg = r"unsolvable\.jsonl:2: unsolvable record.*final result 89 != target 90"
    with pytest.raises(ValueError, match=msg):
        load_split(unsolvable)
    for broken, msg in [
        ({"nums": [67, 34, 12], "target": 89}, "missing field"),
        (_good_record() | {"target": "89"}, "'target' must be an int"),
        (_good_record() | {"nums": [67]}, "'nums' must be"),
        (
            _good_record() | {"optimal_path": "Current State: 89:[1], Operations: []\n"},
            "'optimal_path' is not a valid path",
        ),
        ([1, 2], "not a JSON object"),
    ]:
        path = tmp_path / "broken.jsonl"
        path.write_text(json.dumps(broken) + "\n")
        with pytest.raises(ValueError, match=r"broken\.jsonl:1: .*" + msg):
            load_split(path)


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--min-target", "50", "--max-target", "40"], "min_target (50) > max_target (40)"),
        (["--num-numbers", "1"], "num_numbers"),
        (["--train-size", "-1"], "train_size"),
        (["--heldout-target-frac", "1.5"], "heldout_target_frac"),
        (["--workers", "0"], "--workers"),
        (["--min-target", "10", "--max-target", "12"], "holds out no target"),
    ],
)
def test_cli_rejects_bad_arguments(tmp_path, capsys, extra, needle):
    with pytest.raises(SystemExit) as exc:
        main(["--out", str(tmp_path / "o"), *extra])
    assert exc.value.code == 2
    assert needle in capsys.readouterr().err


def test_cli_preset_errors(tmp_path, capsys):
    preset = tmp_path / "p.yaml"
    preset.write_text("countdown:\n  num_numbers: 3\n  num_number: 4\n")
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path / "o"), "--preset", str(preset)])
    assert "unknown key(s) in 'countdown': num_number" in capsys.readouterr().err
    preset.write_text("model:\n  hidden: 8\n")
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path / "o"), "--preset", str(preset)])
    assert "no top-level 'countdown:' mapping" in capsys.readouterr().err
    preset.write_text("countdown:\n")  # present but empty (null): not a mapping
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path / "o"), "--preset", str(preset)])
    assert "'countdown' must be a mapping, got NoneType" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path / "o"), "--preset", str(tmp_path / "nope.yaml")])
    assert "preset not found" in capsys.readouterr().err


def test_impossible_problem_space_errors():
    # Two numbers from 1..2 can make at most 4 (2*2 or 2+2): target 50 is unreachable.
    cfg = CountdownConfig(
        num_numbers=2,
        max_number=2,
        min_target=50,
        max_target=50,
        train_size=1,
        val_size=0,
        val_target_size=0,
        heldout_target_frac=0.0,
    )
    with pytest.raises(ValueError, match="no solvable problem for target"):
        generate_split(cfg, "train", 3, [50])


def test_killed_run_leaves_no_file_that_looks_done(tmp_path, monkeypatch):
    calls = {"n": 0}
    real = cd.make_record

    def flaky(*a, **k):
        calls["n"] += 1
        if calls["n"] > 30:
            raise KeyboardInterrupt
        return real(*a, **k)

    out = tmp_path / "o"
    assert (
        main(
            ["--out", str(out), "--num-numbers", "3", "--train-size", "20", "--val-size", "5", "--val-target-size", "5"]
        )
        == 0
    )
    monkeypatch.setattr(generator, "make_record", flaky)
    with pytest.raises(KeyboardInterrupt):
        main(
            ["--out", str(out), "--num-numbers", "3", "--train-size", "50", "--val-size", "5", "--val-target-size", "5"]
        )
    assert not (out / "meta.json").exists()  # the stale meta of the first run is gone
    assert len(_read(out / "train.jsonl")) == 20  # the old file is untouched, not half-rewritten
    assert not list(out.glob(".*tmp"))


def test_cli_in_a_log_writes_parseable_progress_lines_per_split(tmp_path, capsys):
    from rspo.progress import parse_line

    sizes = {"train": 300, "val": 20, "val_target": 10}
    assert (
        main(
            [
                "--out",
                str(tmp_path / "a"),
                "--num-numbers",
                "3",
                "--train-size",
                "300",
                "--val-size",
                "20",
                "--val-target-size",
                "10",
                "--seed",
                "1",
            ]
        )
        == 0
    )
    rows = [r for r in map(parse_line, capsys.readouterr().err.splitlines()) if r is not None]
    for split, size in sizes.items():
        mine = [r for r in rows if r["label"] == f"generate {split}"]
        assert mine[0]["step"] == 1 and mine[-1]["step"] == mine[-1]["total"] == size, mine
        assert {r["unit"] for r in mine} == {"record"}
    assert [r["step"] for r in rows if r["label"] == "generate train"] == [1] + list(range(3, 301, 3))
    assert (
        main(
            [
                "--out",
                str(tmp_path / "b"),
                "--num-numbers",
                "3",
                "--train-size",
                "30",
                "--val-size",
                "5",
                "--val-target-size",
                "5",
                "--quiet",
            ]
        )
        == 0
    )
    assert not [ln for ln in capsys.readouterr().err.splitlines() if parse_line(ln)]
