"""The run folder of one RL run: its identity, its metric lines and its checkpoints.

Everything a killed run needs to resume, and everything ``mlflow-sync`` and the report rules
read, lives here (``<out>/``):

- ``run.json``: the run's identity (name, preset, algorithm, seed, config fingerprint, MLflow run
  id, collapsed); a folder whose fingerprint differs from the config's is another run and refused.
- ``config.json``: the resolved ``TrainConfig``.
- ``metrics.jsonl``: one JSON line per logged step (``{"step": s, key: value, ...}``), the source
  of truth that the MLflow run mirrors. On resume, lines after the restored checkpoint are dropped
  (their work is redone).
- ``checkpoints/step_NNNNNN/``: the sharded model and optimizer state, written by every rank in
  parallel, and the trainer state (format and integrity checks: rspo.train.checkpoint). A step
  folder is written under a temporary name and renamed when complete, so a checkpoint exists
  whole or not at all; the older ones are deleted only after the new one is complete, so the
  newest ``keep`` stay and a save needs room for ``keep + 1`` checkpoints for a moment.
- ``time_account.json``: the run's time account (rspo.train.time_account) as of the newest
  checkpoint's end, ``{"step": s, "state": ...}``: written after each save completes and again when
  a job stops at its time limit, so the save's own time, and a stopping job's time after it, count
  (a checkpoint is immutable once renamed; the account it carries was taken before it was written).
- ``final/`` (the final Hugging Face checkpoint) and ``final.json`` (the run's summary), written
  last: a run is complete iff ``final.json`` exists.

Only the main process (rank 0) writes these files (checkpoint shards: every rank); the caller
holds the barriers.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

CKPT_DIR = "checkpoints"


class RunFolderMismatch(RuntimeError):
    pass


class RunFolder:
    def __init__(self, out: str | Path, fingerprint: str) -> None:
        self.out = Path(out)
        self.fingerprint = fingerprint
        self.out.mkdir(parents=True, exist_ok=True)

    @property
    def metrics_path(self) -> Path:
        return self.out / "metrics.jsonl"

    @property
    def checkpoints(self) -> Path:
        return self.out / CKPT_DIR

    def check_owner(self) -> None:
        """Refuse a folder that holds a run with another config."""
        info_path = self.out / "run.json"
        if not info_path.is_file():
            return
        old = json.loads(info_path.read_text())
        if old.get("fingerprint") != self.fingerprint:
            raise RunFolderMismatch(
                f"run folder {self.out} holds a run with another config (fingerprint {old.get('fingerprint')} "
                f"!= {self.fingerprint}); delete the folder or choose another --out"
            )

    def write_identity(self, info: dict[str, Any], config: dict[str, Any] | None = None) -> None:
        (self.out / "run.json").write_text(json.dumps(info, indent=2))
        if config is not None:
            (self.out / "config.json").write_text(json.dumps(config, indent=2, default=list))

    # ------------------------------------------------------------------ checkpoints

    def latest_checkpoint(self) -> Path | None:
        """The newest complete step checkpoint (rspo.train.checkpoint.is_complete), or None."""
        from rspo.train.checkpoint import is_complete

        if not self.checkpoints.is_dir():
            return None
        done = sorted(
            (p for p in self.checkpoints.glob("step_*") if is_complete(p)), key=lambda p: int(p.name.split("_")[1])
        )
        return done[-1] if done else None

    def remove_unfinished_saves(self) -> list[Path]:
        """Delete what saves killed halfway left (``.tmp_step_*``: a save is written there and renamed
        into place only once whole, rspo.train.checkpoint.save; for the paper presets up to 341 GiB
        each). -> the folders removed."""
        left = sorted(self.checkpoints.glob(".tmp_step_*")) if self.checkpoints.is_dir() else []
        for p in left:
            shutil.rmtree(p, ignore_errors=True)
        return left

    def step_dir(self, step: int) -> Path:
        self.checkpoints.mkdir(exist_ok=True)
        return self.checkpoints / f"step_{step:06d}"

    def prune_checkpoints(self, keep: int) -> None:
        """Delete all but the newest ``keep`` complete checkpoints (called after a save completed)."""
        done = sorted(self.checkpoints.glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
        for p in done[:-keep]:
            shutil.rmtree(p, ignore_errors=True)

    # ------------------------------------------------------------------ time account

    @property
    def time_account_path(self) -> Path:
        return self.out / "time_account.json"

    def write_time_account(self, step: int, state: dict[str, Any]) -> None:
        """The account as of the end of step ``step``'s checkpoint (written and renamed: never half)."""
        tmp = self.time_account_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps({"step": step, "state": state}))
        tmp.replace(self.time_account_path)

    def time_account(self, step: int) -> dict[str, Any] | None:
        """The account written for the checkpoint of ``step``, or None (none written, another step's:
        a killed save's, or an unreadable file)."""
        try:
            kept = json.loads(self.time_account_path.read_text())
        except (OSError, ValueError):
            return None
        return kept.get("state") if isinstance(kept, dict) and kept.get("step") == step else None

    # ------------------------------------------------------------------ metric lines

    def reset_metrics(self) -> None:
        """A run starting from step 0: no metric lines, no time account of an earlier attempt."""
        self.metrics_path.unlink(missing_ok=True)
        self.time_account_path.unlink(missing_ok=True)

    def truncate_metrics(self, step: int) -> None:
        """Drop metric lines after ``step`` (work after the restored checkpoint is redone)."""
        if not self.metrics_path.is_file():
            return
        lines = self.metrics_path.read_text().splitlines()
        keep = [ln for ln in lines if ln.strip() and json.loads(ln)["step"] <= step]
        self.metrics_path.write_text("".join(ln + "\n" for ln in keep))

    def append_metrics(self, row: dict[str, Any]) -> None:
        with open(self.metrics_path, "a") as fh:
            fh.write(json.dumps(row) + "\n")

    def last_metrics(self) -> dict[str, float]:
        """The latest value of every key over the whole file (a resumed run's earlier steps too)."""
        last: dict[str, float] = {}
        for ln in self.metrics_path.read_text().splitlines():
            if ln.strip():
                last.update(json.loads(ln))
        return last

    # ------------------------------------------------------------------ the end

    def write_final(self, final: dict[str, Any]) -> Path:
        """``final.json``, written atomically: the run is complete once it exists."""
        tmp = self.out / "final.json.tmp"
        tmp.write_text(json.dumps(final, indent=2))
        path = self.out / "final.json"
        tmp.rename(path)
        return path
