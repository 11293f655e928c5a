"""The regime search's trials as steps of the workflow (workflow/rules/trials.smk plans them).

A sweep file (YAML) names a preset, pretrained bases (``pretrain:`` overrides of the preset; or a
base pretrained once and committed: ``{pinned: true}``, the preset's own pinned base, or
``{committed: FOLDER, sha256: HEX}``, so that trials run in pieces on other machines start from the
same weights) and trials. A trial is one RL setting (``set:`` overrides of the preset's ``rl:``) on
one base, run for some methods (``<algo>[+rs][+<routing mode>]``) and seeds; every run is a plain
``python -m rspo train`` with periodic greedy validation on the held-out ``val`` split, so a trial
measures exactly what the study's runs measure.

    make trials TRIALS=configs/sweeps/small-round5.yaml      # = snakemake trials --config trials=...
    make trials TRIALS=... TRIAL_ONLY=r5b-ramp-x150          # one piece: only these trials

Snakemake plans one job per base (``ensure_base``: pretrained on the preset's data and tokenizer, or
a committed base installed with its digest checked), per run (``train_run``), per trial
(``trial_row``: its line of the record, once all its runs finished) and one for the record
(``write_record``); a finished run or line is not redone, so a killed search resumes, and under
``--profile`` each run is a SLURM job. Everything lives under the file's ``work:`` folder:
``bases/``, ``runs/<trial>-<key>/<method>-s<seed>/`` (a run folder, beside it ``sweep_run.json``:
UTC start and end, commit, machine, wall), ``trials/<position>-<trial>.json`` (one line of the record
per entry of the file), ``trials.jsonl``, ``trials.md``
and ``steps.tar.xz`` (every run's folder, reproducibly packed: its metrics.jsonl, config.json, run.json,
final.json and sweep stamp, so a committed record's gates can be recomputed from the steps and each run
read whole; rounds 4-5's records kept only metrics.jsonl and final.json).

For each trial the table records: the setting, the base model's held-out greedy accuracy (the
step-0 validation, the same for every run of the base), the GMPO gain (final minus base,
mean +- std over seeds, n), the best GMPO gain over validation steps, the smallest per-step mean
gamma and the largest per-step share of tokens under gamma_min = 0.8 in GRPO runs, the largest
pg_clipfrac, collapses, the RLVR diagnostics of the runs (rspo.train.group_stats: the share of
groups with zero reward variance and its split into all correct / all wrong, distinct responses
per group, token entropy; means over the first and the last ``WINDOW`` steps), the mean step time,
the trial's wall time (its runs' span), the machines and commits it ran on, its UTC start and end
(each run's own too). Every run is read through rspo.run_record; its ``reward_first`` and
``reward_last`` are the study's first reward (first 10 steps) and late reward (last third). Records
written before 2026-12-06 (rounds 3-5, by the thread-pool executor this replaced) hold the means of
the first 5 and last 5 steps under those keys, the executor's ``jobs`` and ``threads``, and the
trial's wall time as the executor measured it; no gate or table reads the first two.

The selection criteria are not computed here: they are written in the sweep file before its runs
and applied by the gates (rspo.regime_gates).
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rspo import base_pin
from rspo.jsonl import read_json, write_atomic, write_jsonl_atomic
from rspo.preset import Preset
from rspo.regime_gates import WINDOW, gate_measures, router_lr_change, trial_folder
from rspo.report.trials import drift_gate_table, gate_table, provenance_table, table
from rspo.run_record import (
    FIRST_STEPS,
    GAMMA,
    GAMMA_UNDER,
    PG_CLIPFRAC,
    PPO_KL,
    REWARD,
    RUN_FILES,
    STEP_S,
    RunRecord,
    Steps,
    late_window,
    onset,
    val_score,
)
from rspo.subcommand import rspo_argv
from rspo.sweep_file import SweepFile, Trial, method_sets
from rspo.tracking import UTC_FORMAT, utc_now


class SweepError(ValueError):
    pass


def _key(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:12]


def _run(cmd: list[str], log: Path, threads: int) -> float:
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        proc = subprocess.run(
            cmd, stdout=fh, stderr=subprocess.STDOUT, env=dict(os.environ, OMP_NUM_THREADS=str(threads))
        )
    if proc.returncode != 0:
        raise RuntimeError(f"command failed (exit {proc.returncode}), see {log}: {' '.join(cmd)}")
    return time.perf_counter() - t0


def base_folder(spec: SweepFile, name: str) -> Path:
    """Where base ``name`` is pretrained or installed: ``<work>/bases/<name>-<key of its overrides>``."""
    return Path(spec.work) / "bases" / f"{name}-{_key(spec.base(name))}"


def run_folder(spec: SweepFile, trial: Trial, algo: str, seed: int) -> Path:
    """``<work>/runs/<trial>-<key of its base, steps and setting>/<method>-s<seed>``."""
    tkey = _key({"base": spec.bases[trial.base], "set": list(trial.set), "steps": trial.steps})
    return Path(spec.work) / "runs" / f"{trial.name}-{tkey}" / f"{algo}-s{seed}"


def ensure_base(spec: SweepFile, name: str, data: Path, tokenizer: Path, threads: int) -> Path:
    """Pretrain base ``name`` once (its pretrain overrides of the preset, on ``data`` with ``tokenizer``),
    or install a base pretrained once and committed: the preset's pinned base for ``{pinned: true}``, a
    folder for ``{committed: FOLDER, sha256: HEX, <its pretrain overrides, for the record>}`` (digest
    checked: rspo.base_pin); -> its folder (``base_folder``)."""
    out = base_folder(spec, name)
    if (out / "pretrain.json").is_file():
        return out
    committed = committed_base(spec, name)
    if committed is not None:  # pretrained once and committed, so that later pieces start from it
        source, sha256, key = committed
        base_pin.copy_checked(source, sha256, out, key)
        return out
    sets = [f"{k}={json.dumps(v)}" for k, v in spec.base(name).items()]
    cmd = rspo_argv(
        "pretrain",
        preset=spec.preset,
        data=data,
        tokenizer=tokenizer,
        out=out,
        threads=threads,
        no_mlflow=True,
        sets=sets,
    )
    _run(cmd, out.parent / f"{out.name}.log", threads)
    return out


def train_run(
    spec: SweepFile, trial: Trial, algo: str, seed: int, data: Path, threads: int, mlflow: bool = False
) -> Path:
    """Train one run of a trial (``python -m rspo train`` with the trial's overrides, validated every
    ``val_every`` steps on the first ``val_size`` problems of ``data``/val.jsonl) unless its folder holds
    a finished run; stamp when and where it ran (UTC start and end, commit, machine) beside it. With
    ``mlflow`` the run is tracked in the preset's MLflow store under the key
    ``trial/<trial folder>/<method>-s<seed>`` (its folder's name: a trial's run is never mistaken for
    a study run or another trial's)."""
    base = base_folder(spec, trial.base)
    if not (base / "pretrain.json").is_file():
        raise SweepError(f"base {trial.base!r} is not there ({base}): build it first (rspo sweep base)")
    out = run_folder(spec, trial, algo, seed)
    sets = [
        *method_sets(algo),
        f"seed={seed}",
        f"schedule.total_steps={trial.steps}",
        f"schedule.val_every={spec.val_every}",
        f"schedule.val_size={spec.val_size}",
        "schedule.ckpt_every=0",
    ] + list(trial.set)
    if not (out / "final.json").is_file():
        started = utc_now()
        cmd = rspo_argv(
            "train",
            preset=spec.preset,
            base_model=base,
            train_data=data / "train.jsonl",
            val=f"val={data / 'val.jsonl'}",
            out=out,
            threads=threads,
            no_mlflow=not mlflow,
            tracking_key=f"trial/{out.parent.name}/{out.name}" if mlflow else None,
            other_base=not spec.base(trial.base).get("pinned"),  # a trial base, not the pinned one
            sets=sets,
        )
        wall = _run(cmd, out.parent / f"{algo}-s{seed}.log", threads)
        stamp = {"started_utc": started, "ended_utc": utc_now(), "commit": commit(), "machine": machine()}
        write_atomic(out / STAMP, json.dumps({**stamp, "wall_s": wall}))
    return out


STAMP = "sweep_run.json"
"""Beside a trial's run: when it trained (UTC start and end), from which commit, on which machine, its wall."""


def run_summary(spec: SweepFile, trial: Trial, algo: str, seed: int) -> dict[str, Any]:
    """What the trial table and the gates read of one finished run (rspo.run_record)."""
    out = run_folder(spec, trial, algo, seed)
    when = read_json(out / STAMP) if (out / STAMP).is_file() else {}
    wall = when.get("wall_s")
    record = RunRecord.open(out)
    val = list(record.steps.at(val_score()).items())
    train = [{"step": step, **row} for step, row in record.steps.rows.items() if REWARD in row]
    return {
        **group_diagnostics(train),
        "algo": algo,
        "seed": seed,
        "started_utc": when.get("started_utc"),
        "ended_utc": when.get("ended_utc"),
        "wall_s": wall or sum(r.get(STEP_S, 0.0) for r in train),
        "machine": when.get("machine"),
        "commit": when.get("commit"),
        "val": val,
        "base_acc": val[0][1],
        "final_acc": val[-1][1],
        "best_acc": max(v for _, v in val),
        "min_gamma": min(r[GAMMA] for r in train),
        "max_gamma_clip": max(r[GAMMA_UNDER] for r in train),
        "max_pg_clipfrac": max(r[PG_CLIPFRAC] for r in train),
        "max_ppo_kl": max(abs(r[PPO_KL]) for r in train),
        "reward_first": statistics.mean(r[REWARD] for r in train[:FIRST_STEPS]),
        "reward_last": statistics.mean(r[REWARD] for r in late_window(train)),
        "collapsed": record.collapsed,
        "collapse_step": record.final.get("collapse_step"),
        **gate_measures(record.steps, record.onset),
    }


DIAGNOSTICS = {
    "zero_std": "groups/zero_std_frac",
    "all_correct": "groups/all_correct_frac",
    "all_wrong": "groups/all_wrong_frac",
    "distinct": "groups/distinct_responses",
    "entropy": "actor/entropy",
    "step_s": STEP_S,
}


def group_diagnostics(train: list[dict[str, Any]]) -> dict[str, float | None]:
    """The RLVR diagnostics of a run (rspo.train.group_stats), mean over its first and its last
    ``WINDOW`` steps: ``<name>_first`` / ``<name>_last`` (None for runs logged before they existed)."""
    out: dict[str, float | None] = {}
    for name, key in DIAGNOSTICS.items():
        for part, rows in (("first", train[:WINDOW]), ("last", train[-WINDOW:])):
            vals = [r[key] for r in rows if key in r]
            out[f"{name}_{part}"] = statistics.mean(vals) if vals else None
    return out


def machine() -> str:
    """The CPU the trial ran on (results differ between CPU types: other kernels, other rounding)."""
    import platform

    model = ""
    try:
        for ln in Path("/proc/cpuinfo").read_text().splitlines():
            if ln.startswith("model name"):
                model = ln.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model or platform.processor() or platform.machine()}, {os.cpu_count()} cores"


def commit() -> str:
    """The commit the sweep runs from (rspo.tracking.git_commit, the one runs and archives record), with
    ``+dirty`` where tracked files have uncommitted changes; "unknown" outside a git checkout."""
    from rspo.tracking import REPO_ROOT, git_commit

    head = git_commit()
    if head == "unknown":
        return head
    try:
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "-uno"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return head
    return head + ("+dirty" if dirty.strip() else "")


def pack_steps(work: Path, path: str | Path) -> Path:
    """Every trial run under ``work``/runs into one tar.xz at ``path``: each run folder's files
    (rspo.run_record.RUN_FILES: its per-step metrics, resolved config, identity and summary) and its
    sweep stamp (UTC start and end, commit, machine, wall), as ``<trial>-<key>/<method>-s<seed>/<file>``,
    reproducibly (rspo.archive.reproducible_tar: the same files give the same bytes)."""
    from rspo.archive import reproducible_tar

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    runs = work / "runs"
    files = [p for name in (*RUN_FILES, STAMP) for p in runs.glob(f"*/*/{name}")]
    path.write_bytes(reproducible_tar({str(f.relative_to(runs)): f for f in files}))
    return path


def _mean_sd(xs: list[float]) -> tuple[float, float, int]:
    return (statistics.mean(xs), statistics.stdev(xs) if len(xs) > 1 else float("nan"), len(xs))


def summarise(trial: Trial, runs: list[dict[str, Any]], base_wall: float, wall: float) -> dict[str, Any]:
    by = {}
    for r in runs:
        by.setdefault(r["algo"], []).append(r)
    out: dict[str, Any] = {
        **trial.record(),
        "base_acc": runs[0]["base_acc"],
        "pretrain_wall_s": base_wall,
        "wall_s": wall,
        "runs": runs,
    }
    for algo, rs in by.items():
        gains = [r["final_acc"] - r["base_acc"] for r in rs]
        best = [r["best_acc"] - r["base_acc"] for r in rs]
        out[algo] = {
            "gain": _mean_sd(gains),
            "best_gain": _mean_sd(best),
            "min_gamma": min(r["min_gamma"] for r in rs),
            "max_gamma_clip": max(r["max_gamma_clip"] for r in rs),
            "max_pg_clipfrac": max(r["max_pg_clipfrac"] for r in rs),
            "collapsed": sum(r["collapsed"] for r in rs),
            "collapse_steps": [onset(r) for r in rs],
            "n": len(rs),
            **{
                k: statistics.mean(r[k] for r in rs) if all(r.get(k) is not None for r in rs) else None
                for k in (f"{name}_{part}" for name in DIAGNOSTICS for part in ("first", "last"))
            },
        }
    return out


def committed_base(spec: SweepFile, name: str) -> tuple[Path, str, str] | None:
    """Base ``name`` if it was pretrained once and committed: (its folder, its weights' sha256, the key
    that states them) for the preset's pinned base (``pinned: true``) or a committed folder; None for a
    base the sweep pretrains itself."""
    over = spec.base(name)
    if over.get("committed"):
        return Path(over["committed"]), over["sha256"], f"bases.{name}"
    if over.get("pinned"):
        preset = Preset.load(spec.preset)
        return base_pin.pinned_dir(preset), preset.base_pin.sha256, "base_model"
    return None


def bases_table(spec: SweepFile, rows: list[dict[str, Any]] = ()) -> str:
    """The bases of a sweep: the ones its trials (``rows``, done here or on other machines) ran on and
    any pretrained here; overrides, held-out greedy accuracy, pretraining time, weights. A committed
    base is read from its committed folder where this machine has not installed it."""
    lines = [
        "| base | pretrain overrides | held-out greedy acc. (%) | examples | pretraining wall | weights sha256 |",
        "|---|---|---|---|---|---|",
    ]
    used = {r.get("base") for r in rows}
    for name, over in spec.bases.items():
        summary = base_folder(spec, name) / "pretrain.json"
        committed = committed_base(spec, name)
        if not summary.is_file() and name in used and committed is not None:
            summary = committed[0] / "pretrain.json"
        if not summary.is_file():
            continue
        data = read_json(summary)
        weights = summary.parent / "model.safetensors"
        digest = base_pin.weights_sha256(weights.parent)[:16] + "…" if weights.is_file() else "-"
        recipe = " ".join(f"{k}={v}" for k, v in (over or {}).items() if k not in ("committed", "sha256"))
        if (over or {}).get("pinned"):
            how = "the preset's pinned base (base_model)"
        elif (over or {}).get("committed"):
            how = f"committed: {over['committed']}, pretrained with {recipe}"
        else:
            how = recipe or "(preset)"
        lines.append(
            f"| {name} | {how} | "
            f"{100 * data['heldout']['accuracy']:.1f} (n={data['heldout']['n']}) | {data['examples']} | "
            f"{data['wall_time_s'] / 60:.1f} min | {digest} |"
        )
    return "\n".join(lines) + "\n"


def steps_in_work(work: Path) -> Callable[[str, str, int], Steps]:
    """(trial name, method, seed) -> that run's per-step metrics, from a sweep's work folder."""

    def steps_of(name: str, method: str, seed: int) -> Steps:
        found = [
            p
            for p in (work / "runs").glob(f"{name}-*/{method}-s{seed}/metrics.jsonl")
            if trial_folder(name, p.parent.parent.name)
        ]
        if len(found) != 1:
            raise SweepError(f"{work}: {len(found)} metrics.jsonl for {name} {method} seed {seed}, expected one")
        return Steps.parse(found[0])

    return steps_of


def write_tables(spec: SweepFile, work: Path, rows: list[dict[str, Any]], table_path: str) -> None:
    path = Path(table_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = (
        "Pretrained bases\n\n"
        + bases_table(spec, rows)
        + "\nTrials (one line per trial, in the order run)\n\n"
        + table(rows)
    )
    if any(router_lr_change(t) is None for t in rows):
        text += (
            "\nPlug-in gate P(X) (round 4; configs/sweeps/small.yaml states it; p3 reads X+freeze's runs of the "
            "same setting, run only where p1, p2 and p4 hold)\n\n" + gate_table(rows)
        )
    if any(router_lr_change(t) is not None for t in rows):
        text += (
            "\nDrift after learning (round 5; configs/sweeps/small-round5.yaml states the gates; read from the "
            "runs' per-step metrics)\n\n" + drift_gate_table(rows, steps_in_work(work))
        )
    text += "\nWhen and where each trial ran (its runs' stamps)\n\n" + provenance_table(rows)
    path.write_text(text)


def _utc(text: str) -> float:
    import calendar

    return calendar.timegm(time.strptime(text, UTC_FORMAT))


def _joined(values: list[Any]) -> str | None:
    kept = sorted({str(v) for v in values if v})
    return "; ".join(kept) if kept else None


def trial_row(spec: SweepFile, index: int) -> dict[str, Any]:
    """The record's line of the file's ``index``-th trial, from its finished runs' folders: the table's
    summaries, each run's measures, the span of its runs (first UTC start to last UTC end, the trial's
    wall), the commits and machines they ran from, and the pretraining of its base where the sweep
    pretrained it (counted once: for the first trial of the file on that base)."""
    trial = spec.trials[index]
    runs = [run_summary(spec, trial, algo, seed) for algo, seed in trial.methods()]
    first_on_base = next(t for t in spec.trials if t.base == trial.base) is trial
    summary = base_folder(spec, trial.base) / "pretrain.json"
    base_wall = 0.0
    if first_on_base and committed_base(spec, trial.base) is None and summary.is_file():
        base_wall = float(read_json(summary).get("wall_time_s", 0.0))
    starts = [r["started_utc"] for r in runs if r["started_utc"]]
    ends = [r["ended_utc"] for r in runs if r["ended_utc"]]
    span = _utc(max(ends)) - _utc(min(starts)) if starts and ends else sum(r["wall_s"] for r in runs)
    row = summarise(trial, runs, base_wall, span)
    row["runs_spec"] = {method: list(seeds) for method, seeds in trial.runs.items()}
    row["machine"] = _joined([r["machine"] for r in runs]) or machine()
    row["started_utc"], row["ended_utc"] = (min(starts) if starts else None), (max(ends) if ends else None)
    row["commit"] = _joined([r["commit"] for r in runs])
    return row


def row_path(spec: SweepFile, line: str) -> Path:
    """Where a trial's line of the record is written (``line``: one of ``spec.lines()``)."""
    return Path(spec.work) / "trials" / f"{line}.json"


def write_record(spec: SweepFile, table_path: str | Path, steps_path: str | Path | None = None) -> Path:
    """The record of the sweep: every trial whose line has been written (``row_path``), in the file's
    order, as JSON lines in ``<work>/trials.jsonl``; the Markdown tables at ``table_path``; the runs'
    per-step metrics packed at ``steps_path``. -> the JSON lines' path."""
    work = Path(spec.work)
    done = [row_path(spec, line) for line in spec.lines()]
    rows = [read_json(path) for path in done if path.is_file()]
    if not rows:
        raise SweepError(f"{work}: no trial has finished (no {work / 'trials'}/<line>.json)")
    record = work / "trials.jsonl"
    write_jsonl_atomic(record, rows)
    write_tables(spec, work, rows, str(table_path))
    if steps_path:
        pack_steps(work, steps_path)
    return record
