"""`mlflow ui` in headless Chromium (slow): the address `python -m rspo mlflow-ui` prints opens on
the experiment's runs table, which lists every run with its dataset and source.

Chromium comes from Debian's `chromium` package (scripts/install_chromium.sh installs it when
missing, as root with apt-get); without it the test is skipped and says why. The screenshot in
the README is made by the same script on the smoke preset's store:
`python scripts/mlflow_ui_check.py --preset smoke --screenshot docs/images/mlflow_runs.png`."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rspo.report.mlflow_run import log_report
from rspo.tracking import Tracker

ROOT = Path(__file__).resolve().parents[1]


def chromium_or_skip() -> None:
    r = subprocess.run(
        ["bash", str(ROOT / "scripts" / "install_chromium.sh")], capture_output=True, text=True, timeout=1200
    )
    if not any(shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome")):
        pytest.skip(f"no Chromium to drive the MLflow UI: {(r.stdout + r.stderr).strip() or 'not on PATH'}")


def smoke_like_store(root: Path) -> tuple[str, list[str]]:
    """Two RL runs and an evaluation run with their data files, and the report run with a figure."""
    uri = f"sqlite:///{root / 'mlflow' / 'mlflow.db'}"
    data = root / "data" / "countdown"
    data.mkdir(parents=True)
    for split, n in (("train", 200), ("val", 16), ("val_target", 16)):
        (data / f"{split}.jsonl").write_text("".join(json.dumps({"i": i}) + "\n" for i in range(n)))
    names = ["grpo-s0", "gmpo-rs0.8-s0"]
    for name in names:
        t = Tracker(uri, "rspo-smoke", name, params={"algorithm/algo": name.split("-")[0]}, source="rspo train")
        t.log_datasets(
            [
                (data / "train.jsonl", "training"),
                (data / "val.jsonl", "validation"),
                (data / "val_target.jsonl", "validation"),
            ]
        )
        for step in range(1, 4):
            t.log_metrics({"critic/score/mean": 0.1 * step, "router/shift_ratio_mean": 1 - 0.01 * step}, step)
        t.end()
    t = Tracker(uri, "rspo-smoke", "eval-countdown-base", source="rspo evaluate countdown")
    t.log_datasets([(data / "val.jsonl", "evaluation")])
    t.log_metrics({"eval/countdown/val/accuracy": 0.5}, 0)
    t.end()
    png = root / "fig1_reward.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n")
    log_report(uri, "rspo-smoke", "smoke", "fig1_reward", [png], names)
    return uri, names + ["eval-countdown-base", "report"]


@pytest.mark.slow
def test_mlflow_ui_opens_on_the_runs_table_with_datasets_and_sources(tmp_path):
    chromium_or_skip()
    uri, runs = smoke_like_store(tmp_path / "store")
    dom, png = tmp_path / "page.html", tmp_path / "page.png"
    expect = [*runs, "countdown/train", "countdown/val", "rspo train", "rspo evaluate", "matching runs"]
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "mlflow_ui_check.py"),
            "--uri",
            uri,
            "--experiment",
            "rspo-smoke",
            "--expect",
            *expect,
            "--dom",
            str(dom),
            "--screenshot",
            str(png),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["missing"] == [] and result["url"].endswith("/runs?workflowType=machine_learning")
    html = dom.read_text()
    assert re.search(r"<strong>(\d+)</strong> matching runs", html)[1] == str(len(runs))  # the table's footer
    assert "No data available" not in html  # not the GenAI traces overview
    assert png.read_bytes().startswith(b"\x89PNG") and png.stat().st_size > 20_000
    assert not (tmp_path / "mlruns").exists() and not (tmp_path / "mlartifacts").exists()


@pytest.mark.slow
def test_mlflow_ui_prints_the_address_last_and_no_request_log(tmp_path):
    """`rspo mlflow-ui` prints the runs table's address once the server answers, as its last lines
    (a JSON record, then the address in words), and the server logs no line per HTTP request unless
    --access-log is given (a first visit printed 145 such lines of 166). Started with SIGINT ignored (as
    a test runner's worker or a script's background job starts it), Ctrl-C still stops it: it hung
    there until killed, under make test, when an earlier test had left SIGINT ignored in its worker."""
    import signal
    import socket
    import time
    import urllib.request

    uri, _ = smoke_like_store(tmp_path / "store")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "rspo", "mlflow-ui", "--uri", uri, "--experiment", "rspo-smoke", "--port", str(port)]
    log = tmp_path / "stderr.txt"  # the server writes there too: a pipe would wait for it
    with log.open("w") as err_file:
        # exec keeps an ignored signal ignored: the command starts with SIGINT ignored, as in such a worker
        ignoring = (
            "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); os.execv(sys.argv[1], sys.argv[1:])"
        )
        proc = subprocess.Popen(
            [sys.executable, "-c", ignoring, *cmd], cwd=tmp_path, stdout=subprocess.PIPE, stderr=err_file, text=True
        )
    try:
        first = json.loads(proc.stdout.readline())
        second = proc.stdout.readline()
        assert second.startswith(f"rspo mlflow-ui: open {first['ui']}"), second
        for path in ("/health", "/", "/health"):  # the server answers at once: it was up before the address
            urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10).close()
        time.sleep(1)
    finally:
        proc.send_signal(signal.SIGINT)  # it stops its server's whole process group
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    err = log.read_text()
    assert not out.strip(), out  # nothing after the address
    assert '"GET /' not in err, err[-2000:]
    time.sleep(2)
    with pytest.raises(OSError):  # the server went with it
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
