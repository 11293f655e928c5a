"""rspo.run_record: a run folder read once, the metric names spelled once, and the study's words for a
run (learned, RS acts, collapsed, late reward) each defined once."""

from __future__ import annotations

import ast
import json
import random
import statistics
from pathlib import Path

import pytest

from rspo import run_record as rr
from rspo.run_record import REWARD, RunRecord, Steps

ROOT = Path(__file__).resolve().parents[1]


def _write(folder: Path, lines: list[dict], final: dict | None = None, **files: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    if final is not None:
        (folder / "final.json").write_text(json.dumps(final))
    for name, data in files.items():
        (folder / f"{name}.json").write_text(json.dumps(data))
    return folder


def test_a_later_line_wins_key_by_key_and_step_0_keeps_its_validation(tmp_path):
    run = _write(
        tmp_path / "r",
        [
            {"step": 0, "val/val/score": 0.5},
            {"step": 1, REWARD: 0.1, rr.GAMMA: 0.99},
            {"step": 1, REWARD: 0.2},  # a resumed step: the reward is replaced, gamma kept
            {"step": 2, REWARD: float("nan"), rr.GAMMA: 0.98},
            {"step": 3, REWARD: 0.4},
        ],
    )
    steps = RunRecord.open(run).steps
    assert steps.series(REWARD) == ([1, 3], [0.2, 0.4])  # step 0 is not a training step; NaN is left out
    assert steps.values(rr.GAMMA) == [0.99, 0.98]
    assert steps.values(REWARD, after=1) == [0.4]
    assert steps.values(REWARD, until=3) == [0.2]
    assert steps.at(rr.val_score()) == {0: 0.5}
    assert steps.rs_activity()[0] == pytest.approx(0.985)


def test_a_metrics_file_is_parsed_once_per_version(tmp_path):
    run = _write(tmp_path / "r", [{"step": 1, REWARD: 0.1}])
    first = Steps.parse(run / "metrics.jsonl")
    assert Steps.parse(run / "metrics.jsonl") is first
    _write(tmp_path / "r", [{"step": 1, REWARD: 0.1}, {"step": 2, REWARD: 0.3}])
    assert Steps.parse(run / "metrics.jsonl").values(REWARD) == [0.1, 0.3]


def test_bad_lines_and_missing_files_are_named(tmp_path):
    run = _write(tmp_path / "r", [{"step": 1, REWARD: 0.1}])
    (run / "metrics.jsonl").write_text('{"step": 1}\n{not json\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: malformed JSON line"):
        Steps.parse(run / "metrics.jsonl")
    (run / "metrics.jsonl").write_text('{"step": "one"}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:1: every line needs an integer 'step'"):
        Steps.parse(run / "metrics.jsonl")
    with pytest.raises(FileNotFoundError, match="final.json: missing"):
        _ = RunRecord.open(run).final
    with pytest.raises(FileNotFoundError, match="run.json: missing"):
        _ = RunRecord.open(run).identity
    (run / "final.json").write_text("[1]")
    with pytest.raises(ValueError, match="final.json: expected a JSON object"):
        _ = RunRecord.open(run).final
    with pytest.raises(FileNotFoundError, match="no run folder"):
        RunRecord.open(tmp_path / "absent")


def test_a_run_folder_gives_its_identity_config_result_and_evaluations(tmp_path):
    run = _write(
        tmp_path / "runs" / "gmpo-s0",
        [{"step": 1, REWARD: 0.1}],
        final={"steps": 60, "collapsed": True, "collapse_step": 41, "time_account": {"wall": 9.0}},
        run={"run_name": "gmpo-s0", "seed": 0},
        config={"tracking": {"collapse_window": 12}},
    )
    (tmp_path / "eval" / "gmpo-s0").mkdir(parents=True)
    (tmp_path / "eval" / "gmpo-s0" / "countdown.json").write_text(json.dumps({"model": "m"}))
    record = RunRecord.open(run)
    assert (record.name, record.identity["seed"], record.n_steps) == ("gmpo-s0", 0, 60)
    assert (record.collapsed, record.onset, record.collapse_window) == (True, 41, 12)
    assert record.time_account == {"wall": 9.0}
    assert record.evaluation(tmp_path / "eval", "countdown") == {"model": "m"}
    with pytest.raises(FileNotFoundError, match="mbpp.json: missing"):
        record.evaluation(tmp_path / "eval", "mbpp")
    assert rr.onset({"collapsed": False, "collapse_step": 41}) is None  # a step without the verdict is no onset


def test_rs_acts_at_its_two_thresholds():
    assert rr.rs_acts(0.99, 0.0) and rr.rs_acts(0.999, 0.01)
    assert not rr.rs_acts(0.9901, 0.0099)


def test_the_learn_test_passes_a_flat_series_5_percent_of_the_time():
    """A flat series with the calibration noise passes 'learned' with probability about 5%, for one run
    and for the mean of five; a run that gains twice the bar passes."""
    rng = random.Random(0)
    assert rr.learn_bar(20) == 0.048  # the bar round 5's L1 registered
    assert rr.learn_bar(20, seeds=5) == 0.022
    flats = [[0.5 + rng.gauss(0, rr.NOISE_SD) for _ in range(60)] for _ in range(4000)]
    one = statistics.fmean(rr.learned(f, rr.late_window(f)) for f in flats)
    assert 0.03 < one <= 0.06
    five = [flats[i : i + 5] for i in range(0, len(flats), 5)]
    bar5 = rr.learn_bar(20, seeds=5)
    mean5 = statistics.fmean(
        statistics.fmean(rr.learn_gain(f, rr.late_window(f)) for f in group) >= bar5 for group in five
    )
    assert 0.02 < mean5 <= 0.08
    rising = [0.5] * 40 + [0.5 + 2 * rr.learn_bar(20)] * 20
    assert rr.learned(rising, rr.late_window(rising))
    assert rr.noise_sd(flats[0]) == pytest.approx(rr.NOISE_SD, rel=0.3)


def test_the_late_window_is_the_last_third():
    assert rr.late_window(list(range(60))) == list(range(40, 60))
    assert rr.late_window([1.0]) == [1.0]


def _literals(path: Path) -> list[tuple[int, str]]:
    """String constants of a module that are not docstrings (any string standing alone as a statement:
    a module's, a function's, an attribute's)."""
    tree = ast.parse(path.read_text())
    docs = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    }
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            out.append((node.lineno, node.value))
        elif isinstance(node, ast.JoinedStr):
            text = "".join(v.value for v in node.values if isinstance(v, ast.Constant))
            out.append((node.lineno, text))
    return out


@pytest.mark.parametrize(
    "name",
    [rr.REWARD, rr.GAMMA, rr.GAMMA_UNDER, rr.PPO_KL, rr.PG_CLIPFRAC, rr.ROUTING_AGREEMENT, rr.MISMATCH_KL],
)
def test_the_study_metric_names_are_spelled_only_in_the_run_record(name):
    """Writers (rspo.losses, rspo.train.step_metrics) and readers import the constant; a name typed out
    again would let a writer and a reader drift apart. Docstrings and comments may name it."""
    found = []
    for path in sorted([*(ROOT / "rspo").rglob("*.py"), *(ROOT / "scripts").glob("*.py")]):
        if path.name == "run_record.py":
            continue
        for line, text in _literals(path):
            if name in text:
                found.append(f"{path.relative_to(ROOT)}:{line}")
    assert not found, f"{name} spelled out in code outside rspo/run_record.py: {found}"
