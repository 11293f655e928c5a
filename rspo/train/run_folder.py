"""The run folder of one RL run: its identity, its metric lines and its checkpoints.

Everything a killed run needs to resume, and everything ``mlflow-sync`` and the report rules
read, lives here (``<out>/``):

- ``run.json``: the run's identity (name, preset, algorithm, seed, config fingerprint, MLflow run
  id, collapsed); a folder whose fingerprint differs from the config's is another run and refused.
- ``config.json``: the resolved ``TrainConfig``.
- ``metrics.jsonl``: one JSON line per logged step (``{"step": s, key: value, ...}``), the source
  of truth that the MLflow run mirrors. On resume, lines after the restored checkpoint are dropped
  (their work is redone).
- ``checkpoints/step_NNNNNN/{model.safetensors, state.pt}``: full (unsharded) model and optimizer
  state, written into a temporary folder that is renamed at the end, so a checkpoint exists whole
  or not at all; the newest ``keep`` are kept.
- ``final/`` (the final Hugging Face checkpoint) and ``final.json`` (the run's summary), written
  last: a run is complete iff ``final.json`` exists.

Only the main process (rank 0) writes; the caller holds the barriers.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

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
        if not self.checkpoints.is_dir():
            return None
        done = sorted(
            (p for p in self.checkpoints.glob("step_*") if (p / "state.pt").is_file()),
            key=lambda p: int(p.name.split("_")[1]),
        )
        return done[-1] if done else None

    def save_checkpoint(self, step: int, model_sd: dict[str, torch.Tensor], state: dict[str, Any], keep: int) -> Path:
        """Write ``checkpoints/step_<step>`` atomically; drop all but the newest ``keep``."""
        from safetensors.torch import save_file

        d = self.checkpoints
        d.mkdir(exist_ok=True)
        final = d / f"step_{step:06d}"
        tmp = d / f".tmp_step_{step:06d}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        # clones: tied embeddings share storage, which safetensors refuses
        save_file({k: v.detach().contiguous().clone() for k, v in model_sd.items()}, str(tmp / "model.safetensors"))
        torch.save(state, tmp / "state.pt")
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)  # atomic: a checkpoint either exists whole or not at all
        olds = sorted(d.glob("step_*"), key=lambda p: int(p.name.split("_")[1]))[:-keep]
        for p in olds:
            shutil.rmtree(p, ignore_errors=True)
        return final

    @staticmethod
    def load_checkpoint(ckpt: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """(model state dict, trainer state) of a checkpoint; a clear error when it is corrupt."""
        from safetensors.torch import load_file

        try:
            model_sd = load_file(str(ckpt / "model.safetensors"))
            state = torch.load(ckpt / "state.pt", map_location="cpu", weights_only=False)
        except Exception as e:  # corrupt checkpoint: say which and why
            raise RuntimeError(
                f"checkpoint {ckpt} is corrupt or unreadable: {e}; delete it to resume from the previous one"
            ) from e
        return model_sd, state

    # ------------------------------------------------------------------ metric lines

    def reset_metrics(self) -> None:
        self.metrics_path.unlink(missing_ok=True)

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
