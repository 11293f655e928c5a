"""Load an experiment's page of `mlflow ui` in headless Chromium; check what the runs table lists.

    python scripts/mlflow_ui_check.py --preset smoke --expect grpo-s0 countdown/train \
        --screenshot docs/images/mlflow_runs.png
    python scripts/mlflow_ui_check.py --uri sqlite:////tmp/x/mlflow.db --experiment rspo-smoke --expect ...
    python scripts/mlflow_ui_check.py --preset small --run stress-grpo-s0 --expect router/shift_ratio_mean \
        --screenshot docs/images/mlflow_run_metrics.png

Starts `python -m rspo mlflow-ui` (the address it prints is the one a user opens) on a free
port, loads that address with `chromium --headless --dump-dom` until every `--expect` text is on
the rendered page (or the attempts run out), optionally saves a screenshot, stops the server and
prints one JSON line {url, found, missing}. Exit status 0 when nothing is missing, 1 otherwise,
2 when Chromium or the server cannot start. Chromium: $CHROMIUM, else `chromium` on PATH
(scripts/install_chromium.sh installs it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
]


def chromium() -> str | None:
    for name in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def browse(binary: str, url: str, out_flag: str, budget_ms: int, size: str, timeout: float) -> str:
    with tempfile.TemporaryDirectory(prefix="rspo-chromium-") as profile:
        r = subprocess.run(
            [
                binary,
                *FLAGS,
                f"--user-data-dir={profile}",
                f"--window-size={size}",
                f"--virtual-time-budget={budget_ms}",
                out_flag,
                url,
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    return r.stdout


def run_metrics_url(runs_url: str, args, port: int) -> str:
    """The address of a run's metric charts: #/experiments/<id>/runs/<run id>/model-metrics."""
    from mlflow.tracking import MlflowClient

    sys.path.insert(0, str(ROOT))
    from rspo.commands.mlflow import preset_store

    if args.uri:
        uri, experiment = args.uri, args.experiment
    else:
        _, experiment, uri = preset_store(args.preset, shipped=args.shipped)
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], f"attributes.run_name = '{args.run}'", max_results=1)
    if not runs:
        raise SystemExit(json.dumps({"error": f"no run named {args.run!r} in {experiment}"}))
    rid = runs[0].info.run_id
    if args.metric:  # one metric's chart page
        import urllib.parse

        q = urllib.parse.quote
        return (
            f"http://127.0.0.1:{port}/#/metric?runs={q(json.dumps([rid]))}&metric={q(json.dumps(args.metric))}"
            f"&experiments={q(json.dumps([exp.experiment_id]))}&plot_metric_keys={q(json.dumps([args.metric]))}"
            "&x_axis=step&show_point=true"
        )
    return f"http://127.0.0.1:{port}/#/experiments/{exp.experiment_id}/runs/{rid}/model-metrics"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--preset", help="a preset name or configs/<p>.yaml (its store under results/)")
    src.add_argument("--uri", help="tracking URI (with --experiment)")
    ap.add_argument("--shipped", action="store_true", help="the shipped study's store (results/<preset>-archive)")
    ap.add_argument("--experiment", default="")
    ap.add_argument("--expect", nargs="*", default=[], help="texts the rendered runs page must contain")
    ap.add_argument("--dom", help="write the rendered page's HTML here")
    ap.add_argument("--screenshot", help="write a PNG of the page here")
    ap.add_argument("--size", default="1600,900", help="browser window WIDTH,HEIGHT")
    ap.add_argument(
        "--run",
        default="",
        help="open this run's metric charts (its 'Model metrics' tab) instead of the runs table",
    )
    ap.add_argument("--metric", default="", help="with --run: open this metric's chart page")
    ap.add_argument(
        "--by-name",
        action="store_true",
        help="sort the runs table by run name, descending (the table loads 100 runs at a time, and runs "
        "whose start times tie would otherwise come in any order)",
    )
    ap.add_argument("--attempts", type=int, default=3)
    ap.add_argument("--server-timeout", type=float, default=120.0)
    args = ap.parse_args(argv)

    binary = chromium()
    if binary is None:
        print(json.dumps({"error": "chromium not found (bash scripts/install_chromium.sh)"}))
        return 2
    sys.path.insert(0, str(ROOT))
    from rspo.commands.mlflow import serving  # the wait `rspo mlflow-ui` itself does before its address

    port = free_port()
    cmd = [sys.executable, "-m", "rspo", "mlflow-ui", "--port", str(port)]
    cmd += ["--preset", args.preset] if args.preset else ["--uri", args.uri, "--experiment", args.experiment]
    cmd += ["--shipped"] if args.shipped else []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=env, start_new_session=True)
    try:
        first = proc.stdout.readline()
        try:
            url = json.loads(first)["ui"]
        except (ValueError, KeyError):
            log.seek(0)
            print(json.dumps({"error": f"rspo mlflow-ui did not start: {first!r} {log.read()[-2000:]}"}))
            return 2
        threading.Thread(target=proc.stdout.read, daemon=True).start()  # never let the pipe fill up
        if args.run:
            url = run_metrics_url(url, args, port)
        elif args.by_name:
            url += ("&" if "?" in url else "?") + "orderByKey=tags.%60mlflow.runName%60&orderByAsc=false"
        if not serving(f"http://127.0.0.1:{port}", proc, args.server_timeout):
            log.seek(0)
            print(json.dumps({"error": f"mlflow ui did not become healthy: {log.read()[-2000:]}"}))
            return 2
        html, missing = "", list(args.expect)
        for attempt in range(args.attempts):
            html = browse(binary, url, "--dump-dom", 15000 * (attempt + 1), args.size, 180)
            missing = [t for t in args.expect if t not in html]
            if not missing:
                break
        if args.dom:
            Path(args.dom).write_text(html)
        if args.screenshot:
            out = Path(args.screenshot).resolve()
            out.parent.mkdir(parents=True, exist_ok=True)
            browse(binary, url, f"--screenshot={out}", 30000, args.size, 180)
        print(json.dumps({"url": url, "found": [t for t in args.expect if t not in missing], "missing": missing}))
        return 1 if missing else 0
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)  # mlflow ui and its workers: the session we started
            proc.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        log.close()


if __name__ == "__main__":
    raise SystemExit(main())
