"""scripts/eval_resolution.py: a checkpoint's accuracy and its sampling SD, and a pair's McNemar SD,
on each evaluation set, read from `rspo evaluate countdown` outputs."""

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def write_eval(folder: Path, scores: dict[str, list[int]]) -> None:
    folder.mkdir(parents=True)
    splits = {s: {"accuracy": sum(v) / len(v), "n": len(v), "scores": v} for s, v in scores.items()}
    (folder / "countdown.json").write_text(json.dumps({"splits": splits}))


def test_the_table_gives_each_checkpoint_its_binomial_sd_and_each_pair_its_mcnemar_sd(tmp_path):
    # 8 problems: a solves 4 (one split each), b solves those 4 and 2 more (2 discordant, both b's)
    write_eval(tmp_path / "small" / "a", {"val": [1, 1, 0, 0], "val_target": [1, 1, 0, 0]})
    write_eval(tmp_path / "small" / "b", {"val": [1, 1, 1, 0], "val_target": [1, 1, 1, 0]})
    out = tmp_path / "t.md"
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "eval_resolution.py"), "--label", f"small={tmp_path / 'small'}",
         "--checkpoint", "a", "--checkpoint", "b", "--out", str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    lines = out.read_text().splitlines()
    assert lines[2] == f"| small | 8 | a | 50.00 | {100 * math.sqrt(0.25 / 8):.2f} |"
    assert lines[3] == f"| small | 8 | b | 75.00 | {100 * math.sqrt(0.75 * 0.25 / 8):.2f} |"
    # McNemar: b + c = 2, (b - c)^2 / n = 4 / 8 -> var = 1.5 / 64
    assert lines[4] == f"| small | 8 | b - a | +25.00 | {100 * math.sqrt(1.5 / 64):.2f} |"
    bad = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "eval_resolution.py"), "--label", "nodir", "--checkpoint", "a"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert bad.returncode == 2 and "expected NAME=DIR" in bad.stderr
