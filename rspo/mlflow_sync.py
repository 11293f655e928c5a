"""What ``python -m rspo mlflow-sync`` does (its command: rspo.commands.mlflow, beside ``mlflow-init`` and
``mlflow-ui``): ``Syncer`` brings the store up to date from the files the jobs wrote: every pretraining
run (``models/<m>/pretrain.json``, ``models/<m>.work/metrics.jsonl``), RL run
(``runs/<run>/{run,config,final}.json``, ``metrics.jsonl``), evaluation (``eval/<model>/<family>.json``)
and the report run (``figures/``, ``tables/``) of ``results/<preset>/``. Those files are the source
of truth; a job whose tracking failed (store locked, down, full) leaves its run folder complete,
and ``mlflow-sync`` records what the store is missing. It is idempotent: it only adds what is
missing (params, tags, dataset inputs, metric points, artifacts, a finished status), so a second
run changes nothing and prints zero counts. It never deletes anything from the store.

How ``mlflow-sync`` matches files to MLflow runs: by the tag ``rspo.key`` the jobs set
(``pretrain/<model>``, ``train/<run>``, ``eval/<family>/<model>``, ``report``); an RL run must also
carry the run folder's config fingerprint (tag ``rspo.fingerprint``), else it is a run of an older
config and a new one is created. Runs made by versions without ``rspo.key`` are matched by run
name and kind. Among several matches the latest counts. An RL run folder without ``final.json``
(a job still running, or killed) only fills an MLflow run that already exists; none is created for it.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections import Counter
from pathlib import Path
from typing import Any

from rspo.jsonl import iter_jsonl
from rspo.report.mlflow_run import refresh_report_note, report_run
from rspo.run_record import RunRecord
from rspo.tracking import (
    REPO_ROOT,
    REPORT_RUN,
    configure_clients,
    ensure_experiment,
    eval_run_key,
    eval_run_name,
    file_dataset,
    log_dataset_inputs,
    recorded_dataset,
    set_long_tag,
    source_tags,
    stored_tag,
)

METRIC_BATCH = 1000
METRICS_TAG = "rspo.synced_metrics"
"""Tag: digest of the metric rows a sync found (or made) complete in the store."""


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every line of a metrics file as written (MLflow keeps each logged value, a repeated step too)."""
    return [obj for _, obj in iter_jsonl(path)] if path.is_file() else []


def repo_relative(path: Path, root: Path) -> str:
    """``path`` relative to ``root`` when inside it (also for the relative paths jobs record)."""
    for base in (Path.cwd(), REPO_ROOT):
        p = path if path.is_absolute() else base / path
        try:
            return str(p.resolve().relative_to(root.resolve()))
        except ValueError:
            continue
    return str(path)


def _mtime_ms(path: Path) -> int | None:
    return int(path.stat().st_mtime * 1000) if path.exists() else None


class Syncer:
    """Adds to one experiment what the result files hold and the store lacks (see the module docstring).

    ``counts`` says what was written: runs created, params, tags, datasets, metric points,
    artifacts, statuses; all zero when the store was already complete."""

    def __init__(self, uri: str, experiment: str, preset: str) -> None:
        from mlflow.tracking import MlflowClient

        configure_clients()
        self.uri, self.preset = uri, preset
        self.client = MlflowClient(tracking_uri=uri)
        self.exp_id = ensure_experiment(uri, experiment)
        self.counts: Counter[str] = Counter()
        self.skipped: list[str] = []
        self.results = REPO_ROOT / "results" / preset
        self.archived_data: dict[str, dict[str, Any]] = {}
        self.archived_mtimes: dict[str, float] = {}
        self._listed: dict[tuple[str, str | None], dict[str, int]] = {}
        self.runs = self.client.search_runs([self.exp_id], max_results=50000, order_by=["attributes.start_time DESC"])

    # -- finding or creating the MLflow run of a file set

    def find(self, key: str, name: str, kind: str, fingerprint: str | None = None, run_id: str | None = None):
        def matches(r) -> bool:
            tags = r.data.tags
            if fingerprint and tags.get("rspo.fingerprint", fingerprint) != fingerprint:
                return False
            if tags.get("rspo.key") == key:
                return True
            legacy = "rspo.key" not in tags and r.info.run_name == name
            return legacy and tags.get("kind", kind if kind == "train" else "") == kind

        if run_id:
            for r in self.runs:
                if r.info.run_id == run_id and matches(r):
                    return r
        return next((r for r in self.runs if matches(r)), None)

    def create(self, name: str, tags: dict[str, str], start_ms: int | None):
        run = self.client.create_run(self.exp_id, run_name=name, tags=tags, start_time=start_ms)
        self.counts["runs created"] += 1
        self.runs.insert(0, self.client.get_run(run.info.run_id))
        return self.runs[0]

    # -- filling one run

    def ensure(
        self,
        run,
        *,
        params: dict[str, str] | None = None,
        tags: dict[str, str] | None = None,
        datasets: list[tuple[Path, str]] | None = None,
        metrics: list[dict[str, Any]] | None = None,
        artifacts: list[tuple[Path, str | None]] | None = None,
        finished_ms: int | None = None,
    ) -> None:
        from mlflow.entities import Param, RunTag

        rid = run.info.run_id
        have_params = run.data.params
        new_params = [Param(k, str(v)[:6000]) for k, v in (params or {}).items() if k not in have_params]
        for i in range(0, len(new_params), 100):
            self.client.log_batch(rid, params=new_params[i : i + 100])
        self.counts["params"] += len(new_params)
        changed = {k: str(v) for k, v in (tags or {}).items() if run.data.tags.get(k) != stored_tag(k, str(v))}
        new_tags = [RunTag(k, v) for k, v in changed.items() if stored_tag(k, v) == v]
        if new_tags:
            self.client.log_batch(rid, tags=new_tags)
        for k, v in changed.items():
            if stored_tag(k, v) != v:  # past MLflow's limit: cut, the whole value an artifact
                set_long_tag(self.client, rid, k, v)
        self.counts["tags"] += len(changed)
        found = [(d, c) for d, c in ((self._dataset(p), c) for p, c in (datasets or [])) if d is not None]
        linked = {
            (d.dataset.name, d.dataset.digest, t.value)
            for d in (run.inputs.dataset_inputs if run.inputs else [])
            for t in d.tags
        }
        if any((d.name, d.digest, c) not in linked for d, c in found):
            self.counts["dataset inputs"] += log_dataset_inputs(self.client, rid, found)
        if metrics:
            # a digest of the rows the store holds in full: a later sync skips reading their history back
            digest = hashlib.sha256(json.dumps(metrics, sort_keys=True).encode()).hexdigest()[:16]
            if run.data.tags.get(METRICS_TAG) != digest:
                self.counts["metric points"] += self._metrics(run, metrics)
                self.client.set_tag(rid, METRICS_TAG, digest)
        for path, folder in artifacts or []:
            self._artifact(rid, path, folder)
        if finished_ms is not None and run.info.status != "FINISHED":
            self.client.set_terminated(rid, "FINISHED", end_time=finished_ms)
            self.counts["statuses"] += 1

    def _metrics(self, run, rows: list[dict[str, Any]]) -> int:
        from mlflow.entities import Metric

        wanted: dict[str, dict[int, float]] = {}
        for row in rows:
            step = row.get("step")
            for k, v in row.items():
                if k == "step" or isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                    continue
                wanted.setdefault(k, {})[int(step)] = float(v)  # a repeated step: the last line wins
        rid = run.info.run_id
        now = int(time.time() * 1000)
        todo: list[Metric] = []
        for key, points in wanted.items():
            have: dict[int, set[float]] = {}
            if key in run.data.metrics:
                for m in self.client.get_metric_history(rid, key):
                    have.setdefault(m.step, set()).add(m.value)
            for step, value in sorted(points.items()):
                if not any(math.isclose(value, h, rel_tol=1e-12, abs_tol=0.0) for h in have.get(step, ())):
                    todo.append(Metric(key, value, now, step))
        for i in range(0, len(todo), METRIC_BATCH):
            self.client.log_batch(rid, metrics=todo[i : i + METRIC_BATCH])
        return len(todo)

    def _artifact(self, rid: str, path: Path, folder: str | None) -> None:
        if not path.is_file():
            return
        key = (rid, folder)
        if key not in self._listed:
            self._listed[key] = {Path(a.path).name: a.file_size for a in self.client.list_artifacts(rid, folder)}
        if self._listed[key].get(path.name) == path.stat().st_size:
            return
        self.client.log_artifact(rid, str(path), folder)
        self._listed[key][path.name] = path.stat().st_size
        self.counts["artifacts"] += 1

    def _dataset(self, path: Path):
        """The dataset of a data file: the file itself, or the record a run archive kept of it."""
        path = Path(path)
        if path.is_file():
            return file_dataset(path)
        rel = repo_relative(path, self.results)
        record = self.archived_data.get(rel) or self.archived_data.get(str(path))
        if record is None and self.archived_data:
            # a shipped run's config names the folder it trained in, results/<preset>/, not the
            # archive's results/<preset>-archive/: its training and validation files went unrecorded
            rel = repo_relative(path, REPO_ROOT / "results" / self.preset)
            record = self.archived_data.get(rel)
        return recorded_dataset(record, self.results / rel) if record else None

    def _time_ms(self, path: Path) -> int | None:
        """When a job wrote a file: the run archive's record of it, else the file's mtime."""
        mtime = self.archived_mtimes.get(repo_relative(path, self.results))
        return int(mtime * 1000) if mtime else _mtime_ms(path)

    # -- the kinds of result files

    def pretrain(self, model_dir: Path) -> None:
        summary = json.loads((model_dir / "pretrain.json").read_text())
        meta_path = model_dir / "rspo_meta.json"
        meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
        task = summary.get("task", meta.get("task", "countdown"))
        key, name = f"pretrain/{model_dir.name}", f"pretrain-{task}"
        tags = {"kind": "pretrain", "task": task, "preset": self.preset, "rspo.key": key}
        work = model_dir.with_name(model_dir.name + ".work")
        finished = self._time_ms(model_dir / "pretrain.json")
        run = self.find(key, name, "pretrain") or self.create(
            name, {**source_tags("rspo pretrain"), **tags}, self._pretrain_start_ms(work, summary, finished)
        )
        rows = _read_jsonl(work / "metrics.jsonl")
        last = max((r["step"] for r in rows), default=summary.get("steps", 0))
        rows.append({"step": last, "pretrain/wall_time_s": summary.get("wall_time_s")})
        data = self.results / "data" / task
        self.ensure(
            run,
            params={f"pretrain/{k}": json.dumps(v) for k, v in (meta.get("pretrain") or {}).items()},
            tags=tags,
            datasets=[(data / "train.jsonl", "training"), (data / "val.jsonl", "validation")],
            metrics=rows,
            finished_ms=finished,
        )

    def _pretrain_start_ms(self, work: Path, summary: dict, finished: int | None) -> int | None:
        """When a pretraining started: its metrics file's first write, or, where none is kept (a run
        archive ships the base model without its .work folder), its end less the wall time its
        summary records. Without either, a run created now would end before it started (the shipped
        study's pretraining showed a duration of -640,690 s)."""
        started = self._time_ms(work / "metrics.jsonl")
        if started is not None or finished is None:
            return started
        wall = summary.get("wall_time_s")
        return finished - int(1000 * wall) if isinstance(wall, (int, float)) and wall >= 0 else finished

    def train(self, folder: Path) -> None:
        from rspo.config import flatten

        record = RunRecord.open(folder)
        info, config = record.identity, record.config
        final_path = folder / "final.json"
        final = record.final if record.finished else None
        name, fp = info["run_name"], info["fingerprint"]
        key = f"train/{name}"
        skip = {"fingerprint", "mlflow_run_id", "collapsed", "world_size"}
        tags = {**{k: str(v) for k, v in info.items() if k not in skip}, "kind": "train"}
        tags.update({"rspo.key": key, "rspo.fingerprint": fp})
        if final and record.collapsed:
            tags.update({"collapse": "true", "collapse_step": str(final.get("collapse_step"))})
        run = self.find(key, name, "train", fingerprint=fp, run_id=info.get("mlflow_run_id"))
        if run is None:
            if final is None:
                self.skipped.append(f"{folder} (no final.json: running or killed; no MLflow run to fill)")
                return
            run = self.create(name, {**source_tags("rspo train"), **tags}, self._time_ms(folder / "config.json"))
        data = config.get("data") or {}
        datasets = [(Path(data.get("train_path", "")), "training")]
        datasets += [(Path(p), "validation") for p in (data.get("val_paths") or {}).values()]
        self.ensure(
            run,
            params=flatten(config),
            tags=tags,
            datasets=[(p, c) for p, c in datasets if str(p) not in ("", ".")],
            metrics=_read_jsonl(record.metrics_path),
            artifacts=[(folder / "config.json", None), (final_path, None)],
            finished_ms=self._time_ms(final_path) if final else None,
        )

    def evaluation(self, path: Path) -> None:
        family = path.stem
        result = json.loads(path.read_text())
        model = str(result.get("model") or path.parent.name)
        key, name = eval_run_key(family, model), eval_run_name(family, model)
        tags = {"kind": "eval", "family": family, "model": model, "preset": self.preset, "rspo.key": key}
        run = self.find(key, name, "eval") or self.create(
            name, {**source_tags(f"rspo evaluate {family}"), **tags}, self._time_ms(path)
        )
        metrics: dict[str, float] = {}
        datasets: list[tuple[Path, str]] = []
        if family == "countdown":
            for split, r in (result.get("splits") or {}).items():
                metrics[f"eval/countdown/{split}/accuracy"] = r["accuracy"]
                datasets.append((self.results / "data" / "countdown" / f"{split}.jsonl", "evaluation"))
        else:
            for bench, r in (result.get("benchmarks") or {}).items():
                metrics[f"eval/{family}/{bench}/pass_at_1"] = r["pass@1"]
            if "average" in result:
                metrics[f"eval/{family}/average"] = result["average"]
        self.ensure(
            run, tags=tags, datasets=datasets, metrics=[{"step": 0, **metrics}], finished_ms=self._time_ms(path)
        )

    def report(self, plan) -> None:
        from rspo.plan import FIGURES, TABLES

        files: list[tuple[Path, str]] = []
        built: dict[str, list[str]] = {}
        for target in FIGURES:
            pdf = self.results / "figures" / f"{target}.pdf"
            if pdf.is_file():
                files += [(pdf.with_suffix(".png"), "figures"), (pdf, "figures")]
                built[target] = plan.figure_runs(target)
        for target in TABLES:
            md = self.results / "tables" / f"{target}.md"
            if md.is_file():
                from rspo.report.tables import table_sources

                files += [(md, "tables"), (md.with_suffix(".tex"), "tables")]
                built[target] = table_sources(plan, target, str(self.results / "eval"))
        if not files:
            return
        existed = any(r.info.run_name == REPORT_RUN and r.data.tags.get("kind") == "report" for r in self.runs)
        rid = report_run(self.uri, self.client.get_experiment(self.exp_id).name, self.preset)
        self.counts["runs created"] += not existed
        run = self.client.get_run(rid)
        tags = {f"runs/{t}": ", ".join(names) for t, names in built.items() if names}
        before = sum(self.counts.values())
        self.ensure(run, tags=tags, artifacts=files)
        if sum(self.counts.values()) > before:  # the description lists every target's runs
            refresh_report_note(self.uri, self.client, rid, self.preset)

    def sync(self, results: Path, plan=None) -> None:
        self.results = results
        archived = results / "archive.json"  # the run files came from a run archive (rspo.archive)
        manifest = json.loads(archived.read_text()) if archived.is_file() else {}
        self.archived_data = manifest.get("datasets") or {}
        self.archived_mtimes = {m["path"]: m.get("mtime") for m in manifest.get("members") or []}
        models = results / "models"
        for summary in sorted(models.glob("*/pretrain.json")) if models.is_dir() else []:
            self.pretrain(summary.parent)
        for info in sorted((results / "runs").glob("*/run.json")):
            self.train(info.parent)
        for path in sorted((results / "eval").glob("*/*.json")):
            self.evaluation(path)
        if plan is not None:
            self.report(plan)
