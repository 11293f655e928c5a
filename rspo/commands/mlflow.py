"""The MLflow commands of `python -m rspo`:

- ``mlflow-init`` creates a preset's store, experiment and report run once, before any job starts
  (Snakemake's ``onstart``), since concurrent jobs creating them race (rspo.tracking).
- ``mlflow-sync`` records in the store what the preset's result files hold and the store lacks
  (``rspo.mlflow_sync.Syncer``: idempotent, never deletes).
- ``mlflow-ui`` runs ``mlflow ui`` on a preset's store and prints the address of its runs table.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from rspo.commands import preset_path
from rspo.mlflow_sync import Syncer
from rspo.report.mlflow_run import report_run
from rspo.tracking import (
    FAILED,
    REPO_ROOT,
    SHIPPED_SUFFIX,
    Resilience,
    default_tracking_uri,
    ensure_experiment,
    experiment_name,
    experiment_url,
    shipped_results,
    sqlite_path,
    warn,
)


def preset_store(preset_arg: str, uri: str = "", shipped: bool = False) -> tuple[str, str, str]:
    """(preset name, experiment, tracking URI) of ``--preset`` (a path, or a name in configs/);
    ``shipped``: the store and experiment of its shipped run archive (`make figures`), not the user's."""
    from rspo.preset import Preset

    path = preset_path(preset_arg)
    preset = Preset.load(path)
    name = preset.name
    experiment = experiment_name(preset)
    if shipped:
        experiment = experiment.removesuffix(SHIPPED_SUFFIX) + SHIPPED_SUFFIX
        return name, experiment, uri or default_tracking_uri(name, shipped_results(name))
    return name, experiment, uri or default_tracking_uri(name)


def init_main(argv: list[str] | None = None) -> int:
    """`python -m rspo mlflow-init --preset configs/<p>.yaml`: create the store, the experiment and
    the report run once; print them and the runs table's address in `mlflow ui`."""
    ap = argparse.ArgumentParser(prog="rspo mlflow-init", description=init_main.__doc__)
    ap.add_argument("--preset", required=True, help="configs/<p>.yaml or a preset name")
    ap.add_argument("--uri", default="", help="tracking URI (default: $MLFLOW_TRACKING_URI or sqlite under results/)")
    ap.add_argument(
        "--best-effort",
        action="store_true",
        help="on a store that cannot be reached, warn and exit 0 (jobs then record what they can and "
        "`mlflow-sync` the rest); Snakemake's onstart passes it, so a tracking server that is down "
        "does not stop the workflow",
    )
    args = ap.parse_args(argv)
    name, experiment, uri = preset_store(args.preset, args.uri)
    net = Resilience("mlflow-init")
    ids = net.call("the experiment and its report run", lambda: (ensure_experiment(uri, experiment), None))
    if ids is not FAILED:
        ids = net.call("the report run", lambda: (ids[0], report_run(uri, experiment, name)))
    if ids is FAILED:
        msg = f"the MLflow store {uri} could not be prepared ({net.summary()})"
        if args.best_effort:
            warn(f"{msg}; the workflow goes on, `python -m rspo mlflow-sync --preset {name}` records its runs later")
            return 0
        print(f"rspo mlflow-init: {msg}", file=sys.stderr)
        return 1
    exp_id, run_id = ids
    print(
        json.dumps(
            {
                "tracking_uri": uri,
                "experiment": experiment,
                "experiment_id": exp_id,
                "report_run_id": run_id,
                "ui": experiment_url(exp_id),
            }
        )
    )
    return 0


def ui_main(argv: list[str] | None = None) -> int:
    """`python -m rspo mlflow-ui --preset small`: `mlflow ui` on the preset's store, opened on the runs table.

    Runs ``mlflow ui`` on the preset's store in the foreground (Ctrl-C stops it), without its HTTP
    request log (one line per request, 145 of the 166 lines a first visit printed; --access-log
    keeps it) and with its own output on stderr; once the server answers, prints the address of the
    experiment's runs table last (with ``workflowType=machine_learning``, the parameter the MLflow
    3.17 UI reads to pick its "Model training" view): a JSON line, then the address in words."""
    ap = argparse.ArgumentParser(prog="rspo mlflow-ui", description=ui_main.__doc__)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--preset", help="configs/<p>.yaml or a preset name (small, smoke, ...)")
    src.add_argument("--uri", help="tracking URI (then --experiment names the experiment)")
    ap.add_argument("--experiment", default="", help="experiment name (default: the preset's)")
    ap.add_argument(
        "--shipped", action="store_true", help="the shipped study's store (results/<preset>-archive), not your runs'"
    )
    ap.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1: this machine only; from another, forward the port over SSH)",
    )
    ap.add_argument("--port", type=int, default=5000, help="port (default 5000)")
    ap.add_argument("--workers", type=int, default=1, help="server worker processes (default 1)")
    ap.add_argument("--access-log", action="store_true", help="keep the server's log line of every HTTP request")
    args = ap.parse_args(argv)
    if args.preset:
        try:
            _, experiment, uri = preset_store(args.preset, shipped=args.shipped)
        except (OSError, ValueError) as e:  # ConfigError is a ValueError
            print(f"rspo mlflow-ui: {e}", file=sys.stderr)
            return 2
    else:
        uri, experiment = args.uri, args.experiment
        if not experiment:
            ap.error("--uri needs --experiment")
    experiment = args.experiment or experiment
    path = sqlite_path(uri)
    if path is not None and not path.is_file():
        print(
            f"rspo mlflow-ui: no MLflow store at {path} (run the workflow, or `python -m rspo mlflow-init`, first)",
            file=sys.stderr,
        )
        return 2
    exp_id = ensure_experiment(uri, experiment)  # also marks an older experiment as model training
    cmd = [
        sys.executable,
        "-m",
        "mlflow",
        "ui",
        "--backend-store-uri",
        uri,
        "--host",
        args.host,
        "--port",
        str(args.port),
        "--workers",
        str(args.workers),
    ]
    if path is not None:  # artifacts next to the store, never ./mlartifacts in the cwd
        cmd += ["--default-artifact-root", (path.parent / "artifacts").resolve().as_uri()]
    if not args.access_log:
        cmd += ["--uvicorn-opts", "--no-access-log"]
    url = experiment_url(exp_id, f"http://{args.host}:{args.port}")
    # its own session: the server and what it starts (uvicorn, MLflow's job runner) are one process
    # group, stopped together; a terminal's Ctrl-C reaches this process, which passes it on
    proc = subprocess.Popen(cmd, stdout=sys.stderr, start_new_session=True)
    # Ctrl-C stops it even where it was started with SIGINT ignored (a background job of a script, a test
    # runner's worker): Python then installs no KeyboardInterrupt handler, and the command would not stop
    signal.signal(signal.SIGINT, signal.default_int_handler)

    def stop(sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGTERM, lambda *_: (stop(signal.SIGTERM), sys.exit(128 + signal.SIGTERM)))
    try:
        if not serving(f"http://{'127.0.0.1' if args.host in ('0.0.0.0', '::') else args.host}:{args.port}", proc):
            print(f"rspo mlflow-ui: mlflow ui stopped before it answered (exit {proc.poll()})", file=sys.stderr)
            return 1
        record = {"experiment": experiment, "experiment_id": exp_id, "tracking_uri": uri, "ui": url}
        print(json.dumps(record), flush=True)
        print(f"rspo mlflow-ui: open {url}  (Ctrl-C stops the server)", flush=True)
        return proc.wait()
    except KeyboardInterrupt:
        stop(signal.SIGINT)
        try:
            return proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            stop(signal.SIGKILL)
            return proc.wait()
    finally:
        stop(signal.SIGTERM)  # whatever of the group is left: never a server without its command


def serving(base: str, proc: subprocess.Popen, timeout_s: float = 300.0) -> bool:
    """Whether the server at ``base`` answers /health before ``proc`` exits (or the time runs out)."""
    import time
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            time.sleep(0.3)
    return False


def sync_main(argv: list[str] | None = None) -> int:
    """`python -m rspo mlflow-sync --preset small`: record in the MLflow store what the preset's
    result files hold and the store lacks (idempotent; prints what it wrote)."""
    ap = argparse.ArgumentParser(prog="rspo mlflow-sync", description=sync_main.__doc__)
    ap.add_argument("--preset", required=True, help="configs/<p>.yaml or a preset name")
    ap.add_argument("--results", default="", help="the preset's results folder (default: results/<preset>)")
    ap.add_argument("--uri", default="", help="tracking URI (default: $MLFLOW_TRACKING_URI or sqlite under results/)")
    ap.add_argument(
        "--shipped",
        action="store_true",
        help="the shipped study (results/<preset>-archive, its own store and experiment), not your runs",
    )
    args = ap.parse_args(argv)
    from rspo.config import ConfigError
    from rspo.plan import Plan

    try:
        name, experiment, uri = preset_store(args.preset, args.uri, shipped=args.shipped)
        if args.shipped and not args.results:
            args.results = str(shipped_results(name))
        path = preset_path(args.preset)
        if args.shipped:  # the shipped runs belong to the preset they were packed from (the archive's copy)
            from rspo.archive import unpacked_preset

            path = unpacked_preset(args.results, name) or path
        plan = Plan.from_file(path, None, full=True)
    except (OSError, ConfigError) as e:
        print(f"rspo mlflow-sync: {e}", file=sys.stderr)
        return 2
    results = Path(args.results) if args.results else REPO_ROOT / "results" / name
    if not results.is_dir():
        print(f"rspo mlflow-sync: no results folder {results}", file=sys.stderr)
        return 2
    if not args.uri and not os.environ.get("MLFLOW_TRACKING_URI") and args.results:
        uri = default_tracking_uri(name, results)
    net = Resilience("mlflow-sync")
    syncer = net.call("the experiment", Syncer, uri, experiment, name)
    if syncer is FAILED or net.call("the runs", syncer.sync, results, plan) is FAILED:
        print(f"rspo mlflow-sync: the store {uri} could not be updated: {net.summary()}", file=sys.stderr)
        return 1
    for s in syncer.skipped:
        warn(f"skipped {s}")
    written = {k: v for k, v in syncer.counts.items() if v}  # empty: the store was complete
    print(json.dumps({"tracking_uri": uri, "experiment": experiment, **written}))
    return 0
