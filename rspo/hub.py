"""Model weights from the Hugging Face hub, fetched once per study and read from a local folder.

A preset may name its base model by hub id (the paper presets: ``Qwen/Qwen3-30B-A3B``, 57 GiB of
bf16 weights). Downloading it in every train and evaluate job would fetch it dozens of times, on
nodes that may have no internet, and vLLM reads weights from a folder, not from a hub id. So:

- ``python -m rspo fetch-model --model ORG/NAME --out DIR`` (the workflow's ``fetch_model`` rule,
  one per hub model, before any job that reads it) makes DIR a complete model folder (config,
  tokenizer, safetensors weights) and writes ``DIR/rspo_snapshot.json`` last (hub id, resolved
  commit, each file's size). Online it downloads straight into DIR (``snapshot_download`` with
  ``local_dir``: resumable, no second copy in the hub cache). Offline (``HF_HUB_OFFLINE=1``) it
  takes the snapshot from the local hub cache (``HF_HOME`` / ``HF_HUB_CACHE``), hard-linked into
  DIR where both are on one filesystem and copied otherwise; with no cached snapshot it fails
  naming the model and what to do. A DIR whose marker names the same model is left as it is.
- ``resolve_model(path)`` is what every loader calls: a local folder is returned as it is; a hub
  id becomes its snapshot in the hub cache (downloaded there if online; a clear error naming the
  model if offline and not cached). So ``rspo train|evaluate --model ORG/NAME`` also work outside
  the workflow, the vLLM backend included (its weights loader reads files).

Only what a checkpoint needs is fetched (``PATTERNS``: JSON configs, tokenizer files, safetensors);
``*.bin`` / ``*.pth`` copies of the same weights are skipped.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

SNAPSHOT_FILE = "rspo_snapshot.json"
PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.jinja", "tokenizer*"]


class ModelFetchError(RuntimeError):
    """A hub model could not be fetched or found; the message names it."""


def is_hub_id(path: str | os.PathLike) -> bool:
    """``org/name`` that is not an existing path (nor written as one: ./x, /x, ~/x)."""
    s = str(path)
    parts = s.split("/")
    return len(parts) == 2 and all(parts) and not s.startswith((".", "/", "~")) and not Path(s).exists()


def slug(repo_id: str) -> str:
    """The folder name of a hub model: ``Qwen/Qwen3-30B-A3B`` -> ``Qwen--Qwen3-30B-A3B``."""
    return repo_id.replace("/", "--")


def offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _fetch_error(repo_id: str, e: Exception) -> ModelFetchError:
    if offline():
        return ModelFetchError(
            f"model {repo_id}: not in the local hub cache and HF_HUB_OFFLINE is set ({type(e).__name__}); "
            f"fetch it once where there is internet (python -m rspo fetch-model --model {repo_id} --out DIR, "
            "or huggingface-cli download) into the cache this job sees (HF_HOME / HF_HUB_CACHE), or name a "
            "local folder as model.path"
        )
    return ModelFetchError(f"model {repo_id}: could not be fetched from the hub: {type(e).__name__}: {e}")


def cached_snapshot(repo_id: str, revision: str | None = None) -> Path:
    """The model's snapshot folder in the hub cache, downloaded there first when online."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=PATTERNS, local_files_only=offline()))
    except Exception as e:  # offline without a cached copy, unknown repo, no network ...
        raise _fetch_error(repo_id, e) from e


def resolve_model(path: str | os.PathLike) -> str:
    """A local model folder as it is; a hub id -> its snapshot folder in the hub cache."""
    return str(cached_snapshot(str(path))) if is_hub_id(path) else str(path)


def read_marker(out: str | os.PathLike) -> dict[str, Any] | None:
    f = Path(out) / SNAPSHOT_FILE
    try:
        return json.loads(f.read_text())
    except (OSError, ValueError):
        return None


def _link_or_copy(src: Path, dst: Path) -> None:
    src = src.resolve()  # the cache's snapshot entries are links to its blobs
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.exists() and dst.stat().st_size == src.stat().st_size:
        return
    dst.unlink(missing_ok=True)
    try:
        os.link(src, dst)
    except OSError:  # another filesystem
        shutil.copyfile(src, dst)


def fetch_model(repo_id: str, out: str | os.PathLike, revision: str | None = None) -> dict[str, Any]:
    """Make ``out`` a complete local folder of hub model ``repo_id`` (see the module docstring)."""
    out = Path(out)
    marker = read_marker(out)
    if marker and marker.get("repo_id") == repo_id and (revision is None or marker.get("requested") == revision):
        return marker
    out.mkdir(parents=True, exist_ok=True)
    (out / SNAPSHOT_FILE).unlink(missing_ok=True)
    if offline():
        src = cached_snapshot(repo_id, revision)
        for f in sorted(p for p in src.rglob("*") if not p.is_dir()):
            _link_or_copy(f, out / f.relative_to(src))
        commit, how = src.name, "hub cache"
    else:
        from huggingface_hub import snapshot_download

        try:
            snapshot_download(repo_id, revision=revision, allow_patterns=PATTERNS, local_dir=out)
        except Exception as e:
            raise _fetch_error(repo_id, e) from e
        commit, how = _local_dir_commit(out), "hub"
    files = sorted(
        (p for p in out.rglob("*") if p.is_file() and ".cache" not in p.parts and p.name != SNAPSHOT_FILE),
        key=lambda p: str(p),
    )
    if not (out / "config.json").is_file() or not any(p.suffix == ".safetensors" for p in files):
        raise ModelFetchError(f"model {repo_id}: the snapshot has no config.json or no *.safetensors weights")
    marker = {
        "repo_id": repo_id,
        "requested": revision,
        "commit": commit,
        "from": how,
        "files": [{"name": str(p.relative_to(out)), "bytes": p.stat().st_size} for p in files],
        "bytes": sum(p.stat().st_size for p in files),
    }
    tmp = out / (SNAPSHOT_FILE + ".tmp")
    tmp.write_text(json.dumps(marker, indent=2))
    os.replace(tmp, out / SNAPSHOT_FILE)  # written last: the folder is complete once it exists
    return marker


def _local_dir_commit(out: Path) -> str | None:
    """The commit huggingface_hub recorded for a ``local_dir`` download (its .cache metadata)."""
    for meta in sorted((out / ".cache" / "huggingface" / "download").rglob("*.metadata")):
        first = meta.read_text().splitlines()[:1]
        if first:
            return first[0].strip()
    return None
