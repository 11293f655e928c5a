"""scripts/mismatch_screen_table.py: the FP8-engine screen's tables from run folders (or their
runs.json): per-run summaries from metrics.jsonl, per-method mean +- sd, the paired difference to
GMPO with its 95% t-interval and verdict."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from mismatch_screen_table import run_summary, tables  # noqa: E402


def write_run(folder: Path, val_last: float, reward: float, done: bool = True) -> None:
    folder.mkdir(parents=True)
    rows = [{"step": 0, "val/val/score": 0.5}]
    for step in range(1, 21):
        rows.append(
            {
                "step": step,
                "critic/score/mean": reward if step > 10 else 0.0,
                "rollout_corr/k3_kl": 2e-3,
                "rollout_corr/routing_agreement": 0.98,
                "perf/step_s": 4.0,
            }
        )
    rows.append({"step": 20, "val/val/score": val_last})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if done:
        (folder / "done").touch()


def test_a_run_is_summarised_from_its_metrics(tmp_path):
    write_run(tmp_path / "gmpo-s0", 0.6, 0.4)
    s = run_summary(tmp_path / "gmpo-s0")
    assert s == pytest.approx(
        {
            "val": 0.6,
            "val0": 0.5,
            "last_step": 20,
            "reward": 0.4,
            "k3_kl": 2e-3,
            "routing_agreement": 0.98,
            "step_s": 4.0,
        }
    )


def test_paired_differences_give_an_interval_and_a_verdict(tmp_path):
    runs = {}
    for s, (base, r3) in enumerate([(0.50, 0.60), (0.52, 0.63), (0.55, 0.64)]):
        runs[f"gmpo-s{s}"] = {
            "val": base,
            "val0": 0.5,
            "reward": 0.4,
            "k3_kl": 2e-3,
            "routing_agreement": 0.98,
            "step_s": 4,
        }
        runs[f"r3-s{s}"] = {
            "val": r3,
            "val0": 0.5,
            "reward": 0.4 + 0.01 * (s - 1),
            "k3_kl": 1e-3,
            "routing_agreement": 1.0,
            "step_s": 4,
        }
    text = tables(runs)
    # val: differences 0.10, 0.11, 0.09 -> mean 0.10, sd 0.01, half-width 4.303 * 0.01 / sqrt(3) = 0.025
    assert "| R3 | +0.100 [+0.075, +0.125] | higher | +0.000 [-0.025, +0.025] | inconclusive |" in text
    assert "| GMPO | 3 | 0.523 +- 0.025 |" in text
    assert "| GMPO+TIS | n = 0 | - | n = 0 | - |" in text  # a method without runs says so


def test_unfinished_runs_are_left_out_of_a_folder(tmp_path, capsys, monkeypatch):
    import mismatch_screen_table

    write_run(tmp_path / "screen" / "gmpo-s0", 0.6, 0.4)
    write_run(tmp_path / "screen" / "gmpo-s1", 0.9, 0.9, done=False)
    monkeypatch.setattr(sys, "argv", ["x", str(tmp_path / "screen"), "--json", str(tmp_path / "runs.json")])
    mismatch_screen_table.main()
    assert list(json.loads((tmp_path / "runs.json").read_text())) == ["gmpo-s0"]
    assert "| GMPO | 1 | 0.600 |" in capsys.readouterr().out
