"""MLflow tracking: one experiment per preset, one MLflow run per RL run (or pretraining run).

Store: ``$MLFLOW_TRACKING_URI`` when set, else a sqlite file under the preset's results folder
(``sqlite:///<repo>/results/<preset>/mlflow/mlflow.db``). The URI is always set explicitly: MLflow
>= 3.7 would otherwise create ``mlflow.db`` in whatever directory a job runs in.

Concurrency (measured with MLflow 3.17.2): several processes creating a new sqlite store at once
crash in its migrations, and two processes creating the same experiment at once can silently put
a run in the Default experiment. So the store and the experiment are created once
(``python -m rspo mlflow-init``, Snakemake's ``onstart``) and jobs log by experiment id through
``MlflowClient``; they never call ``set_experiment``. A job that finds no experiment creates it
under a file lock.

What the UI shows:
- The experiment carries the tag ``mlflow.experimentKind = custom_model_development`` (the UI's
  "Machine learning" kind, whose experiment page is the runs table, not the GenAI traces
  overview). The MLflow 3.17.2 UI (its bundled JS hard-enables a flag under which the kind comes
  from the workflow type) derives it from the sidebar switch "GenAI / Model training" (kept in
  the browser's local storage, GenAI by default) or from the address's ``workflowType``
  parameter, not from the tag; so ``experiment_url`` (printed by ``mlflow-init`` and
  ``mlflow-ui``) adds ``?workflowType=machine_learning``. UIs that read the tag pick the same
  view from it.
- Every run records its source: ``mlflow.source.name`` (the ``rspo`` command),
  ``mlflow.source.type`` LOCAL, ``mlflow.source.git.commit`` (the Source and Version columns),
  ``mlflow.user`` and the full command line as tag ``command``.
- ``Tracker.log_datasets`` records the data files a run trained, validated or was evaluated on
  as dataset inputs (the Dataset column): name ``<folder>/<file stem>``, a digest of the file's
  bytes (sha256, streamed, so a 240k-row split is never loaded), the file as a ``local`` source
  and a profile with its rows, bytes and full sha256.
- ``report_run`` is the one run per preset named ``report`` that holds every figure and table
  (rspo.report.cli ``--mlflow``).
"""

from __future__ import annotations

import argparse
import fcntl
import functools
import hashlib
import json
import math
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]

EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"  # the UI's "Machine learning" kind: the runs table
REPORT_RUN = "report"


def default_tracking_uri(preset: str, results_dir: str | Path | None = None) -> str:
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    base = Path(results_dir) if results_dir else REPO_ROOT / "results" / preset
    return f"sqlite:///{(base / 'mlflow' / 'mlflow.db').resolve()}"


def eval_run_name(family: str, model_dir: str) -> str:
    """The MLflow run name of an evaluation: eval-<family>-<run name, or the model folder's name>."""
    label = Path(model_dir).parent.name if Path(model_dir).name == "final" else Path(model_dir).name
    return f"eval-{family}-{label}"


def _sqlite_path(uri: str) -> Path | None:
    return Path(uri[len("sqlite:///") :]) if uri.startswith("sqlite:///") else None


@contextmanager
def _store_lock(uri: str):
    path = _sqlite_path(uri)
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure_experiment(uri: str, name: str) -> str:
    """Create the store (if sqlite) and the experiment once; return the experiment id.

    The experiment is marked as a model-training experiment (``EXPERIMENT_KIND_TAG``); an
    experiment made before that tag existed gets it here."""
    from mlflow.tracking import MlflowClient

    with _store_lock(uri):
        client = MlflowClient(tracking_uri=uri)
        exp = client.get_experiment_by_name(name)
        if exp is not None:
            if exp.tags.get(EXPERIMENT_KIND_TAG) is None:
                client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
            return exp.experiment_id
        artifact_root = None
        path = _sqlite_path(uri)
        if path is not None:
            artifact_root = (path.parent / "artifacts").resolve().as_uri()
        return client.create_experiment(
            name, artifact_location=artifact_root, tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND}
        )


def experiment_url(experiment_id: str, host: str = "http://127.0.0.1:5000") -> str:
    """The experiment's runs table in ``mlflow ui`` (see the module docstring for the parameter)."""
    return f"{host}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def command_line(argv: list[str] | None = None) -> str:
    """This process's command as a user would type it (``python -m rspo train ...``)."""
    argv = list(sys.argv if argv is None else argv)
    head = argv[0] if argv else ""
    if head.endswith(os.path.join("rspo", "__main__.py")) or Path(head).name == "rspo":
        argv = ["python", "-m", "rspo", *argv[1:]]
    return shlex.join(argv)


def source_tags(source: str) -> dict[str, str]:
    """The tags that fill the UI's Source, Version and User columns."""
    import getpass

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return {
        "mlflow.source.name": source,
        "mlflow.source.type": "LOCAL",
        "mlflow.source.git.commit": git_commit(),
        "mlflow.user": user,
        "command": command_line()[:5000],
    }


@functools.lru_cache(maxsize=64)
def _file_digest(path: str, size: int, mtime_ns: int) -> tuple[str, int]:
    """(sha256 hex, number of lines) of a file, streamed in 1 MiB blocks (cached per version)."""
    h = hashlib.sha256()
    lines = 0
    last = b"\n"
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            h.update(block)
            lines += block.count(b"\n")
            last = block[-1:]
    if size and last != b"\n":
        lines += 1  # a last line without a newline
    return h.hexdigest(), lines


def file_dataset(path: str | Path, name: str | None = None):
    """An ``mlflow.data`` dataset that describes a data file without loading it.

    Name ``<folder>/<stem>`` (``countdown/train``), digest = the first 10 hex digits of the
    sha256 of the file's bytes, source = the file (type ``local``), profile = rows (lines), bytes
    and the full sha256."""
    from mlflow.data.dataset_source_registry import get_dataset_source_from_json
    from mlflow.data.meta_dataset import MetaDataset

    p = Path(path).resolve()
    st = p.stat()
    sha, rows = _file_digest(str(p), st.st_size, st.st_mtime_ns)
    profile = json.dumps({"num_rows": rows, "bytes": st.st_size, "sha256": sha})

    class FileDataset(MetaDataset):
        @property
        def profile(self) -> Any:
            return profile

        def to_dict(self) -> dict[str, str]:
            return {**super().to_dict(), "profile": profile}

    source = get_dataset_source_from_json(json.dumps({"uri": str(p)}), "local")
    return FileDataset(source, name=name or f"{p.parent.name}/{p.stem}", digest=sha[:10])


def package_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("rspo", "torch", "transformers", "mlflow", "math-verify", "vllm"):
        try:
            out[f"version/{pkg}"] = version(pkg)
        except PackageNotFoundError:
            continue
    return out


class Tracker:
    """A thin MlflowClient wrapper bound to one run; resumable by run id."""

    def __init__(
        self,
        uri: str,
        experiment: str,
        run_name: str,
        *,
        run_id: str | None = None,
        params: dict[str, str] | None = None,
        tags: dict[str, str] | None = None,
        source: str = "rspo",
    ) -> None:
        from mlflow.tracking import MlflowClient

        self.uri = uri
        self.client = MlflowClient(tracking_uri=uri)
        self.experiment_id = ensure_experiment(uri, experiment)
        if run_id:
            run = self.client.get_run(run_id)  # raises if the run is gone
            self.run_id = run.info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            all_tags = {"git_commit": git_commit(), **source_tags(source), **package_versions(), **(tags or {})}
            run = self.client.create_run(self.experiment_id, run_name=run_name, tags=all_tags)
            self.run_id = run.info.run_id
            if params:
                self.log_params(params)

    def log_params(self, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, str(v)[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[i : i + 100])

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        items = [
            Metric(k, float(v), ts, step)
            for k, v in metrics.items()
            if isinstance(v, (int, float)) and math.isfinite(float(v))
        ]
        for i in range(0, len(items), 500):
            self.client.log_batch(self.run_id, metrics=items[i : i + 500])

    def set_tag(self, key: str, value: Any) -> None:
        self.client.set_tag(self.run_id, key, str(value))

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(self.run_id, str(path), artifact_path)

    def log_datasets(self, files: Iterable[tuple[str | Path, str]]) -> None:
        """Record data files as the run's dataset inputs: ``[(path, context), ...]`` with context
        ``training`` / ``validation`` / ``evaluation``. A file already recorded for this run with
        the same digest and context is not recorded twice (a resumed run calls this again)."""
        from mlflow.entities import DatasetInput, InputTag
        from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

        have = {
            (d.dataset.name, d.dataset.digest, tuple(sorted((t.key, t.value) for t in d.tags)))
            for d in self.client.get_run(self.run_id).inputs.dataset_inputs
        }
        inputs = []
        for path, context in files:
            ds = file_dataset(path)
            tags = [InputTag(MLFLOW_DATASET_CONTEXT, context)]
            if (ds.name, ds.digest, ((MLFLOW_DATASET_CONTEXT, context),)) in have:
                continue
            inputs.append(DatasetInput(ds._to_mlflow_entity(), tags=tags))
        if inputs:
            self.client.log_inputs(self.run_id, datasets=inputs)

    def end(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.run_id, status=status)


# ---------------------------------------------------------------------------- the report run


def report_run(uri: str, experiment: str, preset: str) -> str:
    """The id of the preset's report run (named ``report``, tag kind=report), created if missing.

    Several report jobs run at once under Snakemake, so find-or-create happens under the store's
    file lock (sqlite); ``mlflow-init`` (Snakemake's onstart) creates the run before any job
    starts, which also covers a tracking server, where no file lock exists. A job then only
    adds its own artifacts and its own tag (``runs/<target>``), which cannot collide."""
    from mlflow.tracking import MlflowClient

    exp_id = ensure_experiment(uri, experiment)
    with _store_lock(uri):
        client = MlflowClient(tracking_uri=uri)
        found = client.search_runs(
            [exp_id],
            filter_string=f"attributes.run_name = '{REPORT_RUN}' AND tags.kind = 'report'",
            order_by=["attributes.start_time ASC"],
            max_results=1,
        )
        if found:
            return found[0].info.run_id
        tags = {
            **source_tags("rspo report"),
            "kind": "report",
            "preset": preset,
            "mlflow.note.content": f"Figures and tables of preset `{preset}` (none built yet).",
        }
        run = client.create_run(exp_id, run_name=REPORT_RUN, tags=tags)
        client.set_terminated(run.info.run_id, "FINISHED")
        return run.info.run_id


def _report_note(client, run, preset: str) -> str:
    """The report run's description: every target with links to the runs it was built from."""
    exp_id = run.info.experiment_id
    ids: dict[str, tuple[int, str]] = {}
    for r in client.search_runs([exp_id], max_results=50000):
        name = r.info.run_name
        if name not in ids or r.info.start_time > ids[name][0]:
            ids[name] = (r.info.start_time, r.info.run_id)
    lines = [
        f"Figures and tables of preset `{preset}` (artifacts `figures/`, `tables/`); each target "
        "lists the runs it was built from.",
        "",
    ]
    for key in sorted(k for k in run.data.tags if k.startswith("runs/")):
        target = key.split("/", 1)[1]
        names = [n.strip() for n in run.data.tags[key].split(",") if n.strip()]
        links = [f"[{n}](#/experiments/{exp_id}/runs/{ids[n][1]})" if n in ids else n for n in names]
        lines.append(f"- **{target}**: {', '.join(links)}")
    return "\n".join(lines)


def log_report(
    uri: str, experiment: str, preset: str, target: str, files: Iterable[str | Path], built_from: list[str]
) -> str:
    """Log a figure's or table's files into the report run, tag it with the runs it was built
    from (``runs/<target>``: MLflow run names) and refresh the run's description; -> run id."""
    from mlflow.tracking import MlflowClient

    run_id = report_run(uri, experiment, preset)
    client = MlflowClient(tracking_uri=uri)
    folder = "tables" if target.startswith("table") else "figures"
    for f in files:
        client.log_artifact(run_id, str(f), folder)
    if built_from:
        client.set_tag(run_id, f"runs/{target}", ", ".join(built_from)[:8000])
    with _store_lock(uri):  # the description is rebuilt from every job's tags: one writer at a time
        client.set_tag(run_id, "mlflow.note.content", _report_note(client, client.get_run(run_id), preset))
        client.set_terminated(run_id, "FINISHED")
    return run_id


def _preset_store(preset_arg: str, uri: str = "") -> tuple[str, str, str]:
    """(preset name, experiment, tracking URI) of ``--preset`` (a path, or a name in configs/)."""
    from rspo.config import load_preset

    path = Path(preset_arg)
    if not path.is_file() and "/" not in preset_arg and not preset_arg.endswith((".yaml", ".yml")):
        path = REPO_ROOT / "configs" / f"{preset_arg}.yaml"
    preset = load_preset(path)
    name = str(preset.get("preset", path.stem))
    experiment = (preset.get("mlflow") or {}).get("experiment", f"rspo-{name}")
    return name, experiment, uri or default_tracking_uri(name)


def init_main(argv: list[str] | None = None) -> int:
    """`python -m rspo mlflow-init --preset configs/<p>.yaml`: create the store, the experiment and
    the report run once; print them and the runs table's address in `mlflow ui`."""
    ap = argparse.ArgumentParser(prog="rspo mlflow-init", description=init_main.__doc__)
    ap.add_argument("--preset", required=True, help="configs/<p>.yaml or a preset name")
    ap.add_argument("--uri", default="", help="tracking URI (default: $MLFLOW_TRACKING_URI or sqlite under results/)")
    args = ap.parse_args(argv)
    name, experiment, uri = _preset_store(args.preset, args.uri)
    exp_id = ensure_experiment(uri, experiment)
    run_id = report_run(uri, experiment, name)
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

    Prints the address of the experiment's runs table (with ``workflowType=machine_learning``, the
    parameter the MLflow 3.17 UI reads to pick its "Model training" view), then runs ``mlflow ui``
    in the foreground on the preset's store (Ctrl-C stops it)."""
    ap = argparse.ArgumentParser(prog="rspo mlflow-ui", description=ui_main.__doc__)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--preset", help="configs/<p>.yaml or a preset name (small, smoke, ...)")
    src.add_argument("--uri", help="tracking URI (then --experiment names the experiment)")
    ap.add_argument("--experiment", default="", help="experiment name (default: the preset's)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=5000)
    ap.add_argument("--workers", type=int, default=1)
    args = ap.parse_args(argv)
    if args.preset:
        try:
            _, experiment, uri = _preset_store(args.preset)
        except (OSError, ValueError) as e:  # ConfigError is a ValueError
            print(f"rspo mlflow-ui: {e}", file=sys.stderr)
            return 2
    else:
        uri, experiment = args.uri, args.experiment
        if not experiment:
            ap.error("--uri needs --experiment")
    experiment = args.experiment or experiment
    path = _sqlite_path(uri)
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
    print(
        json.dumps(
            {
                "experiment": experiment,
                "experiment_id": exp_id,
                "tracking_uri": uri,
                "ui": experiment_url(exp_id, f"http://{args.host}:{args.port}"),
            }
        ),
        flush=True,
    )
    os.execv(sys.executable, cmd)
    return 0  # pragma: no cover - execv does not return
