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
- The report run (``rspo.report.mlflow_run``) is the one run per preset named ``report`` that holds
  every figure and table (rspo.commands.report ``--mlflow``).
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import math
import os
import random
import shlex
import subprocess
import sys
import time
from collections.abc import Iterable
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rspo.preset import Preset

REPO_ROOT = Path(__file__).resolve().parents[1]

EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"  # the UI's "Machine learning" kind: the runs table
REPORT_RUN = "report"


SHIPPED_SUFFIX = " (shipped study)"  # the experiment of a shipped run archive (`make figures`)


def experiment_name(preset: Preset, default: str = "") -> str:
    """The MLflow experiment of a preset's runs: ``RSPO_MLFLOW_EXPERIMENT`` when set (archive mode
    sets it to the shipped study's name), else the preset's ``mlflow.experiment``, else
    ``default`` or ``rspo-<preset>``."""
    return os.environ.get("RSPO_MLFLOW_EXPERIMENT") or preset.mlflow_experiment or default or f"rspo-{preset.name}"


def shipped_results(preset: str) -> Path:
    """Where `make figures` unpacks a preset's shipped run archive and builds its tables and figures:
    a folder of its own, beside the user's ``results/<preset>``, which it never touches."""
    return REPO_ROOT / "results" / f"{preset}-archive"


def default_tracking_uri(preset: str, results_dir: str | Path | None = None) -> str:
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    base = Path(results_dir) if results_dir else REPO_ROOT / "results" / preset
    return f"sqlite:///{(base / 'mlflow' / 'mlflow.db').resolve()}"


def model_label(model_dir: str) -> str:
    """A checkpoint's short name: the run name for ``runs/<run>/final``, else the folder's name."""
    return Path(model_dir).parent.name if Path(model_dir).name == "final" else Path(model_dir).name


def eval_run_name(family: str, model_dir: str) -> str:
    """The MLflow run name of an evaluation: eval-<family>-<run name, or the model folder's name>."""
    return f"eval-{family}-{model_label(model_dir)}"


def eval_run_key(family: str, model_dir: str) -> str:
    """The ``rspo.key`` tag of an evaluation's MLflow run (``mlflow-sync`` finds it by this)."""
    return f"eval/{family}/{model_label(model_dir)}"


def sqlite_path(uri: str) -> Path | None:
    return Path(uri[len("sqlite:///") :]) if uri.startswith("sqlite:///") else None


@contextmanager
def store_lock(uri: str):
    path = sqlite_path(uri)
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
    experiment made before that tag existed gets it here. On a sqlite store creation happens under
    a file lock; on a tracking server (no file lock) a concurrent creation by another job makes
    ours fail with RESOURCE_ALREADY_EXISTS, and the experiment is then looked up by name."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    configure_clients()
    with store_lock(uri):
        client = MlflowClient(tracking_uri=uri)
        exp = client.get_experiment_by_name(name)
        if exp is not None:
            if exp.tags.get(EXPERIMENT_KIND_TAG) is None:
                client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
            return exp.experiment_id
        artifact_root = None
        path = sqlite_path(uri)
        if path is not None:
            artifact_root = (path.parent / "artifacts").resolve().as_uri()
        try:
            return client.create_experiment(
                name, artifact_location=artifact_root, tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND}
            )
        except MlflowException as e:
            if error_code(e) != "RESOURCE_ALREADY_EXISTS":
                raise
            return client.get_experiment_by_name(name).experiment_id


def experiment_url(experiment_id: str, host: str = "http://127.0.0.1:5000") -> str:
    """The experiment's runs table in ``mlflow ui`` (see the module docstring for the parameter)."""
    return f"{host}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"


UTC_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
"""How the records write a time (``2026-12-06T13:36:25Z``): UTC, to the second."""


def utc_now() -> str:
    """The time now in UTC (``UTC_FORMAT``): when a run, an archive or a trial was made."""
    return time.strftime(UTC_FORMAT, time.gmtime())


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
    p = Path(path).resolve()
    st = p.stat()
    sha, rows = _file_digest(str(p), st.st_size, st.st_mtime_ns)
    return recorded_dataset(
        {"name": name or f"{p.parent.name}/{p.stem}", "num_rows": rows, "bytes": st.st_size, "sha256": sha}, p
    )


def recorded_dataset(record: dict[str, Any], uri: str | Path):
    """The dataset of ``file_dataset`` from a record of it (name, num_rows, bytes, sha256), for a
    file that is not on this machine (a run archive lists the data its runs used)."""
    from mlflow.data.dataset_source_registry import get_dataset_source_from_json
    from mlflow.data.meta_dataset import MetaDataset

    profile = json.dumps({k: record[k] for k in ("num_rows", "bytes", "sha256")})

    class FileDataset(MetaDataset):
        @property
        def profile(self) -> Any:
            return profile

        def to_dict(self) -> dict[str, str]:
            return {**super().to_dict(), "profile": profile}

    source = get_dataset_source_from_json(json.dumps({"uri": str(uri)}), "local")
    return FileDataset(source, name=record["name"], digest=record["sha256"][:10])


def package_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("rspo", "torch", "transformers", "mlflow", "math-verify", "vllm"):
        try:
            out[f"version/{pkg}"] = version(pkg)
        except PackageNotFoundError:
            continue
    return out


# ---------------------------------------------------------------------------- resilience

RETRY_ENV = "RSPO_MLFLOW_RETRY_S"
PROBE_ENV = "RSPO_MLFLOW_PROBE_S"
DEFAULT_RETRY_S = 120.0
DEFAULT_PROBE_S = 60.0
SQLITE_BUSY_TIMEOUT_MS = 60_000
# MlflowException codes that no retry can change (a rejected value, a deleted run): reported at
# once. Not BAD_REQUEST: MLflow's SQL store reports every SQLAlchemy error under it, the
# IntegrityError of two jobs registering the same dataset at once included, and that one passes.
PERMANENT_CODES = frozenset(
    {"INVALID_PARAMETER_VALUE", "RESOURCE_DOES_NOT_EXIST", "INVALID_STATE", "PERMISSION_DENIED"}
)


def _env_seconds(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    try:
        return float(raw) if raw else default
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected a number of seconds") from None


def is_transient(e: BaseException) -> bool:
    """An error a retry can fix: a store that is locked, busy, racing another writer, down or full
    (MLflow's own errors except PERMANENT_CODES, database errors, OS and network errors). Anything
    else (a rejected value, a deleted run, a bug) is reported at once and not retried."""
    import sqlite3

    from mlflow.exceptions import MlflowException
    from sqlalchemy.exc import SQLAlchemyError

    if isinstance(e, MlflowException):
        return e.error_code not in PERMANENT_CODES
    return isinstance(e, (OSError, sqlite3.Error, SQLAlchemyError))


def error_code(e: BaseException) -> str:
    return str(getattr(e, "error_code", "") or "")


def short_error(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:300]}"


@functools.cache
def configure_clients() -> None:
    """Process-wide settings for talking to a store many jobs share (called before any client).

    - SQLite: every connection waits up to 60 s for a lock (``PRAGMA busy_timeout``) instead of
      sqlite3's 5 s, so writers queue instead of failing with "database is locked".
    - HTTP (a tracking server): no HTTP-level retry and a 30 s timeout per request unless the user set
      ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` / ``MLFLOW_HTTP_REQUEST_TIMEOUT``; MLflow's defaults (7
      retries with exponential backoff, 120 s timeout) could hold one call for many minutes, while
      ``Resilience`` bounds the whole call (``RSPO_MLFLOW_RETRY_S``).
    """
    import sqlite3

    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    @event.listens_for(Engine, "connect")
    def _busy_timeout(dbapi_conn, _record):  # pragma: no cover - exercised through MLflow's engine
        if isinstance(dbapi_conn, sqlite3.Connection):
            dbapi_conn.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")

    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")


def warn(message: str) -> None:
    """Tracking warnings go to stderr (the job log), one line each, prefixed ``[mlflow]``."""
    print(f"[mlflow] {message}", file=sys.stderr, flush=True)


FAILED = type("Failed", (), {"__repr__": lambda self: "FAILED", "__bool__": lambda self: False})()
"""What ``Resilience.call`` returns for a call that did not go through (falsy)."""


class Resilience:
    """Bounded retries for tracking calls, so that tracking never fails a job.

    ``call(what, fn, ...)`` runs ``fn``; on an error it retries with exponential backoff (0.25 s
    doubling to 5 s, jittered) for at most ``retry_s`` seconds (``$RSPO_MLFLOW_RETRY_S``, default
    120), then gives up on that call: it warns once, names the run and what was not recorded, and
    returns ``FAILED``. From then on the store counts as unreachable: calls are skipped (and counted)
    except one attempt every ``probe_s`` seconds (``$RSPO_MLFLOW_PROBE_S``, default 60); when an
    attempt succeeds again, logging resumes. Other errors (not ``is_transient``) are not retried.
    ``lost`` collects what was not recorded; ``summary()`` says it in one line. The run folder
    keeps everything, and ``python -m rspo mlflow-sync`` records it afterwards.

    Retrying is safe because every call the project makes is idempotent or made so: MLflow drops
    a metric already stored with the same (key, value, step, timestamp); re-logging a param with
    its value, a tag, an artifact or a dataset input changes nothing; run creation searches for
    the run a previous attempt may have created (``Tracker``).
    """

    def __init__(self, label: str, *, retry_s: float | None = None, probe_s: float | None = None) -> None:
        self.label = label
        self.retry_s = _env_seconds(RETRY_ENV, DEFAULT_RETRY_S) if retry_s is None else float(retry_s)
        self.probe_s = _env_seconds(PROBE_ENV, DEFAULT_PROBE_S) if probe_s is None else float(probe_s)
        self.offline = False
        self._next_probe = 0.0
        self.lost: dict[str, str] = {}  # what was not recorded -> the last error
        self.retries = 0

    def call(self, what: str, fn, *args, **kwargs):
        now = time.monotonic()
        if self.offline and now < self._next_probe:
            self.lost.setdefault(what, "store unreachable")
            return FAILED
        deadline = now + (0.0 if self.offline else self.retry_s)
        delay = 0.25
        while True:
            try:
                out = fn(*args, **kwargs)
            except Exception as e:  # noqa: BLE001 - every tracking error is caught here, by design
                permanent = not is_transient(e)
                if not permanent and time.monotonic() + delay <= deadline:
                    self.retries += 1
                    time.sleep(delay * (0.5 + random.random()))
                    delay = min(2 * delay, 5.0)
                    continue
                self.lost[what] = short_error(e)
                if permanent:
                    warn(f"{self.label}: {what} not recorded: {short_error(e)}")
                elif not self.offline:
                    warn(
                        f"{self.label}: {what} not recorded: the store failed for {self.retry_s:g} s "
                        f"({short_error(e)}); the job goes on without tracking (one attempt every "
                        f"{self.probe_s:g} s), its run folder keeps everything"
                    )
                    self.offline = True
                if not permanent:
                    self._next_probe = time.monotonic() + self.probe_s
                return FAILED
            if self.offline:
                self.offline = False
                warn(f"{self.label}: the store answers again; tracking resumes")
            return out

    def summary(self) -> str:
        """What was not recorded, each with its last error."""
        return "; ".join(f"{what} ({err})" for what, err in self.lost.items())


class Tracker:
    """A MlflowClient wrapper bound to one run; resumable by run id; never fails the job.

    Every call goes through ``Resilience``: a store that is locked, racing another job, down or
    full is retried for a bounded time, then skipped with a warning (what was not recorded, for
    which run); ``end()`` repeats the list and names the command that records it later
    (``python -m rspo mlflow-sync --preset P``). The job's own files (metrics.jsonl, run.json,
    ...) are the source of truth.

    Identity: the run carries the tag ``rspo.key`` (``train/<run>``, ``pretrain/<model>``,
    ``eval/<family>/<model>``, ``trial/<trial folder>/<method>-s<seed>``), by which ``mlflow-sync``
    finds it again, and ``rspo.uid`` (random, per Tracker), by which a retried creation finds the run
    an earlier attempt created instead of creating a second one.
    """

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
        key: str | None = None,
        preset: str = "",
        retry_s: float | None = None,
        probe_s: float | None = None,
    ) -> None:
        import uuid

        from mlflow.tracking import MlflowClient

        configure_clients()
        self.uri = uri
        self.experiment = experiment
        self.run_name = run_name
        self.preset = preset
        self.key = key or run_name
        self.uid = uuid.uuid4().hex
        self.client = MlflowClient(tracking_uri=uri)
        self.experiment_id: str | None = None
        self.run_id: str | None = None
        self._resume_id = run_id
        self._tags = {
            "git_commit": git_commit(),
            **source_tags(source),
            **package_versions(),
            **(tags or {}),
            "rspo.key": self.key,
            "rspo.uid": self.uid,
        }
        self._params = dict(params or {})
        self._attempts = 0
        self.net = Resilience(f"run {run_name!r}", retry_s=retry_s, probe_s=probe_s)
        self._metric_steps_lost: list[int] = []
        self._started()

    # -- the run

    def _start(self) -> str:
        from mlflow.exceptions import MlflowException

        self._attempts += 1
        if self.experiment_id is None:
            self.experiment_id = ensure_experiment(self.uri, self.experiment)
        if self._resume_id:
            try:
                run = self.client.get_run(self._resume_id)
            except MlflowException as e:
                if error_code(e) != "RESOURCE_DOES_NOT_EXIST":
                    raise
                run = None
            if run is not None and run.info.lifecycle_stage == "active":
                self.client.update_run(self._resume_id, status="RUNNING")
                return self._resume_id
            warn(f"run {self.run_name!r}: MLflow run {self._resume_id} is gone from the store; starting a new one")
            self._resume_id = None
        if self._attempts > 1:  # an earlier attempt may have created the run before failing
            found = self.client.search_runs(
                [self.experiment_id], filter_string=f"tags.`rspo.uid` = '{self.uid}'", max_results=1
            )
            if found:
                return found[0].info.run_id
        return self.client.create_run(self.experiment_id, run_name=self.run_name, tags=self._tags).info.run_id

    def _started(self) -> bool:
        """Whether the run exists; creates it (or finds the resumed one) when the store answers."""
        if self.run_id is None:
            run_id = self.net.call("the run itself", self._start)
            self.run_id = None if run_id is FAILED else run_id
            if self.run_id is not None and self._params:
                self.log_params(self._params)
        return self.run_id is not None

    # -- logging

    def log_params(self, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        self._params.update(params)
        if not self._started():
            self.net.lost.setdefault("params", "no run")
            return
        items = [Param(k, str(v)[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 100):
            self.net.call("params", self.client.log_batch, self.run_id, params=items[i : i + 100])

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        items = [
            Metric(k, float(v), ts, step)
            for k, v in metrics.items()
            if isinstance(v, (int, float)) and math.isfinite(float(v))
        ]
        ok = self._started()
        for i in range(0, len(items), 500):
            if ok:
                ok = (
                    self.net.call("metrics", self.client.log_batch, self.run_id, metrics=items[i : i + 500])
                    is not FAILED
                )
            if not ok:
                self._metric_steps_lost.append(step)
                self.net.lost.setdefault("metrics", "no run")
                break

    def set_tag(self, key: str, value: Any) -> None:
        if self._started():
            self.net.call(f"tag {key}", self.client.set_tag, self.run_id, key, str(value))
        else:
            self.net.lost.setdefault(f"tag {key}", "no run")

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        what = f"artifact {Path(path).name}"
        if self._started():
            self.net.call(what, self.client.log_artifact, self.run_id, str(path), artifact_path)
        else:
            self.net.lost.setdefault(what, "no run")

    def log_datasets(self, files: Iterable[tuple[str | Path, str]]) -> None:
        """Record data files as the run's dataset inputs: ``[(path, context), ...]`` with context
        ``training`` / ``validation`` / ``evaluation``. A file already recorded for this run with
        the same digest and context is not recorded twice (a resumed run calls this again).

        Two jobs registering the same file at once race in MLflow's store (it looks the dataset up,
        then inserts it: the second insert violates the unique key); the retry looks it up again
        and only links it."""
        files = list(files)
        if self._started():
            self.net.call("datasets", log_dataset_inputs, self.client, self.run_id, files)
        else:
            self.net.lost.setdefault("datasets", "no run")

    def end(self, status: str = "FINISHED") -> None:
        if self._started():
            self.net.call(f"status {status}", self.client.set_terminated, self.run_id, status=status)
        else:
            self.net.lost.setdefault(f"status {status}", "no run")
        if self.net.lost:
            lost = list(self.net.lost)
            if self._metric_steps_lost:
                steps = self._metric_steps_lost
                span = f"{len(steps)} steps, {min(steps)}-{max(steps)}"
                lost = [f"metrics ({span})" if w == "metrics" else w for w in lost]
            where = f"MLflow run {self.run_id}" if self.run_id else "no MLflow run (never created)"
            cmd = f"python -m rspo mlflow-sync --preset {self.preset}" if self.preset else "python -m rspo mlflow-sync"
            warn(
                f"run {self.run_name!r} ({where}) did not record: {', '.join(lost)}. The run folder "
                f"has everything; `{cmd}` records it in the store."
            )


def log_dataset_inputs(client, run_id: str, files: Iterable[tuple[Any, str]]) -> int:
    """Link data files to a run as dataset inputs, ``[(file or dataset, context), ...]`` (a path
    is described by ``file_dataset``), skipping those already linked with the same digest and
    context; -> the number linked now."""
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    have = {
        (d.dataset.name, d.dataset.digest, tuple(sorted((t.key, t.value) for t in d.tags)))
        for d in client.get_run(run_id).inputs.dataset_inputs
    }
    inputs = []
    for item, context in files:
        ds = file_dataset(item) if isinstance(item, (str, Path)) else item
        tags = [InputTag(MLFLOW_DATASET_CONTEXT, context)]
        if (ds.name, ds.digest, ((MLFLOW_DATASET_CONTEXT, context),)) in have:
            continue
        inputs.append(DatasetInput(ds._to_mlflow_entity(), tags=tags))
    if inputs:
        client.log_inputs(run_id, datasets=inputs)
    return len(inputs)


# ---------------------------------------------------------------------------- long tags


def stored_tag(key: str, value: str) -> str:
    """What is kept in tag ``key``: the value, or, past MLflow's limit on a tag (8,000 characters in
    MLflow 3.17), its head and a last line naming the run artifact that holds it whole (set_long_tag)."""
    from mlflow.utils.validation import MAX_TAG_VAL_LENGTH

    if len(value) <= MAX_TAG_VAL_LENGTH:
        return value
    tail = (
        f"\n\n... cut at {MAX_TAG_VAL_LENGTH:,} characters, MLflow's limit on a tag; "
        f"all {len(value):,}: artifact tags/{key}.txt"
    )
    return value[: MAX_TAG_VAL_LENGTH - len(tail)] + tail


def set_long_tag(client, run_id: str, key: str, value: str) -> None:
    """Set a tag whose value may pass MLflow's limit: a longer value is kept whole as the run's
    artifact ``tags/<key>.txt`` and the tag is cut (stored_tag), with a warning that names the key,
    its length and the artifact (MLflow's own warning, which this replaces, names neither)."""
    stored = stored_tag(key, value)
    if stored != value:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            whole = Path(tmp) / f"{key}.txt"
            whole.write_text(value, encoding="utf-8")
            client.log_artifact(run_id, str(whole), "tags")
        warn(
            f"tag {key} of run {run_id} has {len(value):,} characters, more than MLflow keeps in a tag: "
            f"the tag is cut and the whole value is the run's artifact tags/{key}.txt"
        )
    client.set_tag(run_id, key, stored)
