"""The report run: the one MLflow run per preset, named ``report``, that holds every figure and table
(``python -m rspo report ... --mlflow``; ``mlflow-init`` creates it before any job starts,
``mlflow-sync`` fills in what a report job could not log). Its description lists each target with
links to the runs it was built from."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from rspo.tracking import (
    FAILED,
    REPORT_RUN,
    Resilience,
    configure_clients,
    ensure_experiment,
    set_long_tag,
    source_tags,
    store_lock,
    warn,
)


def report_run(uri: str, experiment: str, preset: str) -> str:
    """The id of the preset's report run (named ``report``, tag kind=report), created if missing.

    Several report jobs run at once under Snakemake. On sqlite, find-or-create happens under the
    store's file lock; ``mlflow-init`` (Snakemake's onstart) creates the run before any job
    starts, which also covers a tracking server, where no file lock exists. Should two jobs still
    both create one (a server and no onstart), both converge on the earliest and the other is
    deleted. A job then only adds its own artifacts and its own tag (``runs/<target>``)."""
    from mlflow.tracking import MlflowClient

    exp_id = ensure_experiment(uri, experiment)
    query = f"attributes.run_name = '{REPORT_RUN}' AND tags.kind = 'report'"
    order = ["attributes.start_time ASC"]
    with store_lock(uri):
        client = MlflowClient(tracking_uri=uri)
        found = client.search_runs([exp_id], filter_string=query, order_by=order, max_results=1)
        if found:
            return found[0].info.run_id
        tags = {
            **source_tags("rspo report"),
            "kind": "report",
            "preset": preset,
            "rspo.key": REPORT_RUN,
            "mlflow.note.content": f"Figures and tables of preset `{preset}` (none built yet).",
        }
        mine = client.create_run(exp_id, run_name=REPORT_RUN, tags=tags).info.run_id
        client.set_terminated(mine, "FINISHED")
        first = client.search_runs([exp_id], filter_string=query, order_by=order, max_results=1)[0].info.run_id
        if first != mine:  # another job created one at the same moment: keep the earliest
            client.delete_run(mine)
        return first


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
) -> str | None:
    """Log a figure's or table's files into the report run, tag it with the runs it was built
    from (``runs/<target>``: MLflow run names) and refresh the run's description; -> run id, or
    None when the store could not be reached (warned; the report job still succeeds and
    ``mlflow-sync`` logs the files later)."""
    from mlflow.tracking import MlflowClient

    configure_clients()
    net = Resilience(f"report run ({target})")
    run_id = net.call("the report run", report_run, uri, experiment, preset)
    if run_id is FAILED:
        warn(f"{target} not logged into the report run; `python -m rspo mlflow-sync --preset {preset}` logs it later")
        return None
    client = MlflowClient(tracking_uri=uri)
    folder = "tables" if target.startswith("table") else "figures"
    for f in files:
        net.call(f"artifact {Path(f).name}", client.log_artifact, run_id, str(f), folder)
    if built_from:
        net.call(f"tag runs/{target}", set_long_tag, client, run_id, f"runs/{target}", ", ".join(built_from))
    net.call("the description", refresh_report_note, uri, client, run_id, preset)
    if net.lost:
        warn(f"report run: did not record {net.summary()}; `python -m rspo mlflow-sync --preset {preset}` does")
    return run_id


def refresh_report_note(uri: str, client, run_id: str, preset: str) -> None:
    """Rebuild the report run's description from every job's tags (one writer at a time)."""
    with store_lock(uri):
        set_long_tag(client, run_id, "mlflow.note.content", _report_note(client, client.get_run(run_id), preset))
        client.set_terminated(run_id, "FINISHED")
