"""Training checkpoints written and read by every rank in parallel, and the final Hugging Face
checkpoint written without a second copy of the model.

Layout of one checkpoint (``<run>/checkpoints/step_NNNNNN/``, rspo.train.run_folder):

- ``state/``: the model and optimizer state as torch's distributed checkpoint
  (``torch.distributed.checkpoint``, DCP) of their FSDP2 state dicts: each rank writes the shards
  it holds (``__<rank>_0.distcp``) and rank 0 the ``.metadata`` that maps every tensor's global
  shape to the shards. In one process the same format holds whole tensors.
- ``trainer.pt``: the small trainer state (step, scheduler, RNG, collapse detector, MLflow run id).
- ``manifest.json``: written last, once every rank has finished: format version, step, world
  size, and each file's size and sha256 (every rank hashes the files it wrote). A step folder is
  complete iff its manifest exists; it is written under a temporary name and renamed, so a killed
  save leaves no half checkpoint.

Reading: every rank checks the manifest (each file present with its size; the sha256s are split
over the ranks, so the whole checkpoint is hashed once, in parallel) and refuses a corrupt or
missing shard naming it; then it allocates its own shards (``get_state_dict``: the model's and the
optimizer's own tensors; DCP's one zero-gradient step gives a fresh optimizer its Adam moments) and
DCP reads into them, in place, only the bytes of those shards. ``set_state_dict`` is not called
when DCP read every tensor in place (it would copy the optimizer's state once more: 3 GiB of
transient GPU memory per 1.9B parameters over 8 ranks, measured in the memory simulation); only the
parameter groups' settings are copied back. Were a tensor replaced instead, ``set_state_dict``
runs as before. No rank ever holds the whole model or optimizer state, and
DCP reshards by the metadata: a checkpoint written by N processes resumes with M (2 -> 1 and
1 -> 2 are tested). Host memory of a rank during resume: its shard of the state plus DCP's read
buffers (``tests/test_checkpoint.py`` measures the peak).

Checkpoints written before this format (``model.safetensors`` + ``state.pt``, full state dicts,
rank 0 alone) are still read, so runs in progress resume after an upgrade; each rank then reads
the whole state once (the old cost), and the next save writes the new format.

The memory simulation (rspo.gpu_memory.simulate) runs the trainer's save and resume on a model of
fake tensors (shapes without storage): there the shards are neither written nor read (there are no
bytes), and everything else runs: the state dicts DCP allocates (on resume, the optimizer state
through one zero-gradient step), ``set_state_dict``, the trainer state and the manifest.

The final checkpoint (``write_hf_checkpoint``): the weights in checkpoint format (the names and
shapes ``save_pretrained`` writes), gathered one decoder layer at a time
(``rspo.rollout.vllm.checkpoint_weights``: under FSDP2 a collective every rank iterates), cast to
the preset's dtype and appended by rank 0 to safetensors files of at most ``max_shard_bytes``
with a ``model.safetensors.index.json`` when there are several: rank 0 holds at most one file's
tensors (``FINAL_SHARD_BYTES``, 4 GiB), never a second full model.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch

from rspo.distributed import Dist, load_full_state_dicts
from rspo.phase_memory import host_allocation

FORMAT = 2
MANIFEST = "manifest.json"
STATE_DIR = "state"
TRAINER_FILE = "trainer.pt"
LEGACY_FILES = ("model.safetensors", "state.pt")  # format 1: full state dicts, rank 0 alone
EXECUTION_KEYS = ("foreach", "fused", "capturable")  # optimizer options that change how, not what
FINAL_SHARD_BYTES = 4 * 2**30  # the largest safetensors file of a final checkpoint (rank 0 holds one)


class CheckpointError(RuntimeError):
    """A checkpoint is incomplete, corrupt or of another model; the message names the file."""


def is_complete(step_dir: Path) -> bool:
    """Whether a step folder holds a whole checkpoint (this format or the legacy one)."""
    return (step_dir / MANIFEST).is_file() or all((step_dir / f).is_file() for f in LEGACY_FILES)


def is_legacy(step_dir: Path) -> bool:
    return not (step_dir / MANIFEST).is_file() and all((step_dir / f).is_file() for f in LEGACY_FILES)


def _sha256(path: Path, chunk: int = 16 * 2**20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


@contextlib.contextmanager
def _quiet_single_process():
    """DCP warns that it assumes one process when no process group exists: that is the intent here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def _state_dicts(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """This rank's shards of the model and optimizer state (sharded DTensors under FSDP2, whole
    tensors in one process), keyed by parameter name; allocates Adam's moments if the optimizer
    has not stepped yet, so they can be read into."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": model_sd, "optim": optim_sd}


def _fake(state: dict[str, Any]) -> bool:
    """Whether the state is made of fake tensors (shapes without storage: the memory simulation)."""
    from torch._subclasses.fake_tensor import is_fake

    for t in state["model"].values():
        if isinstance(t, torch.Tensor):
            return bool(is_fake(t))
    return False


def save(
    step_dir: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    trainer_state: dict[str, Any],
    dist: Dist,
) -> Path:
    """Write the checkpoint of ``step_dir`` (every rank calls this; collective). Files go to a
    temporary sibling folder, renamed by rank 0 once the manifest is written."""
    import torch.distributed.checkpoint as dcp

    tmp = step_dir.with_name(".tmp_" + step_dir.name)
    if dist.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / STATE_DIR).mkdir(parents=True)
    dist.barrier()
    state = _state_dicts(model, optimizer)
    if not _fake(state):  # a simulated model's state has no bytes to write (module docstring)
        with _quiet_single_process():
            dcp.save(state, storage_writer=dcp.FileSystemWriter(str(tmp / STATE_DIR)), no_dist=not dist.enabled)
    del state
    # every rank hashes the shard files it wrote (DCP names them __<rank>_<i>.distcp)
    mine = sorted((tmp / STATE_DIR).glob(f"__{dist.rank}_*.distcp"))
    rows = [{"file": f"{STATE_DIR}/{p.name}", "bytes": p.stat().st_size, "sha256": _sha256(p)} for p in mine]
    rows = [r for part in dist.all_gather_object(rows) for r in part]
    if dist.is_main:
        with host_allocation():
            torch.save(trainer_state, tmp / TRAINER_FILE)
        meta = tmp / STATE_DIR / ".metadata"
        for p in [f for f in (meta, tmp / TRAINER_FILE) if f.is_file()]:  # no .metadata: a simulated save
            rows.append({"file": str(p.relative_to(tmp)), "bytes": p.stat().st_size, "sha256": _sha256(p)})
        manifest = {"format": FORMAT, "step": trainer_state.get("step"), "world_size": dist.world_size, "files": rows}
        (tmp / (MANIFEST + ".tmp")).write_text(json.dumps(manifest, indent=1))
        os.replace(tmp / (MANIFEST + ".tmp"), tmp / MANIFEST)
        shutil.rmtree(step_dir, ignore_errors=True)
        tmp.rename(step_dir)  # atomic: a checkpoint exists whole or not at all
    dist.barrier()
    return step_dir


def verify(step_dir: Path, dist: Dist) -> dict[str, Any]:
    """The manifest of a complete checkpoint, every file checked (sizes on every rank, sha256s
    split over the ranks); raises CheckpointError naming the first bad file on every rank."""
    error = None
    try:
        manifest = json.loads((step_dir / MANIFEST).read_text())
        if manifest.get("format") != FORMAT:
            raise CheckpointError(f"checkpoint {step_dir}: format {manifest.get('format')}, expected {FORMAT}")
        for i, row in enumerate(manifest["files"]):
            path = step_dir / row["file"]
            if not path.is_file():
                raise CheckpointError(f"checkpoint {step_dir}: {row['file']} is missing")
            size = path.stat().st_size
            if size != row["bytes"]:
                raise CheckpointError(
                    f"checkpoint {step_dir}: {row['file']} has {size} bytes, the manifest says {row['bytes']}"
                )
            if i % dist.world_size == dist.rank and _sha256(path) != row["sha256"]:
                raise CheckpointError(
                    f"checkpoint {step_dir}: {row['file']} is corrupt (sha256 differs from the manifest)"
                )
    except (OSError, ValueError, KeyError, CheckpointError) as e:
        error = str(e) if isinstance(e, CheckpointError) else f"checkpoint {step_dir}: unreadable manifest: {e}"
        manifest = {}
    errors = [e for e in dist.all_gather_object(error) if e]
    if errors:
        raise CheckpointError(f"{errors[0]}; delete it to resume from the previous one")
    return manifest


def load(step_dir: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, dist: Dist) -> dict[str, Any]:
    """Read a checkpoint into this rank's shards of ``model`` and ``optimizer`` (collective);
    -> the trainer state. Any world size reads any other's checkpoint."""
    # how the optimizer runs is this process's choice, not the checkpoint's (one process steps with
    # foreach kernels, FSDP2's DTensors beside plain tensors cannot)
    how = [{k: g[k] for k in EXECUTION_KEYS if k in g} for g in optimizer.param_groups]
    if is_legacy(step_dir):
        trainer_state = _load_legacy(step_dir, model, optimizer)
    else:
        trainer_state = _load_sharded(step_dir, model, optimizer, dist)
    for group, keys in zip(optimizer.param_groups, how):
        group.update(keys)
    return trainer_state


def _load_sharded(step_dir: Path, model, optimizer, dist: Dist) -> dict[str, Any]:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    verify(step_dir, dist)
    state = _state_dicts(model, optimizer)
    live = [id(t) for t in _tensors(state)]  # the model's and the optimizer's own tensors (shared storage)
    try:
        if not _fake(state):  # a simulated model's state has no bytes to read (module docstring)
            with _quiet_single_process():
                dcp.load(
                    state, storage_reader=dcp.FileSystemReader(str(step_dir / STATE_DIR)), no_dist=not dist.enabled
                )
        if [id(t) for t in _tensors(state)] == live:  # read in place: only the groups' settings are left
            _restore_param_groups(optimizer, state["optim"]["param_groups"])
        else:
            set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    except (KeyError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"checkpoint {step_dir} does not match the model or optimizer: {e}") from e
    del state
    with host_allocation():  # host objects (a simulation reads them as real tensors)
        return torch.load(step_dir / TRAINER_FILE, map_location="cpu", weights_only=False)


def _tensors(state: dict[str, Any]) -> list[torch.Tensor]:
    from torch.utils._pytree import tree_leaves

    return [t for t in tree_leaves(state) if isinstance(t, torch.Tensor)]


def _restore_param_groups(optimizer: torch.optim.Optimizer, groups: list[dict[str, Any]]) -> None:
    """The loaded groups' settings (lr, betas, ...; not their parameters) into the optimizer's groups."""
    if len(groups) != len(optimizer.param_groups):
        raise ValueError(
            f"the checkpoint has {len(groups)} parameter groups, the optimizer {len(optimizer.param_groups)}"
        )
    for group, saved in zip(optimizer.param_groups, groups):
        group.update({k: v for k, v in saved.items() if k != "params"})


def _load_legacy(step_dir: Path, model, optimizer) -> dict[str, Any]:
    """Format 1 (full state dicts): every rank reads the whole state and keeps its shard."""
    from safetensors.torch import load_file

    try:
        model_sd = load_file(str(step_dir / "model.safetensors"))
        state = torch.load(step_dir / "state.pt", map_location="cpu", weights_only=False)
    except Exception as e:  # corrupt checkpoint: say which and why
        raise CheckpointError(
            f"checkpoint {step_dir} is corrupt or unreadable: {e}; delete it to resume from the previous one"
        ) from e
    try:
        load_full_state_dicts(model, model_sd, optimizer, state.pop("optimizer"))
    except (KeyError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"checkpoint {step_dir} does not match the model or optimizer: {e}") from e
    return state


# ------------------------------------------------------------------------------ final checkpoint


def write_hf_checkpoint(
    model: torch.nn.Module,
    tokenizer,
    out_dir: Path,
    *,
    dtype: torch.dtype,
    meta: dict[str, Any],
    dist: Dist,
    max_shard_bytes: int | None = None,
) -> Path:
    """``out_dir`` as a Hugging Face checkpoint in ``dtype`` (collective under FSDP2: every rank
    iterates the gathered layers; rank 0 writes). Written into a temporary folder, then renamed."""
    from safetensors.torch import save_file

    from rspo.models import META_FILE
    from rspo.rollout.vllm import checkpoint_weights

    out_dir = Path(out_dir)
    max_shard_bytes = max_shard_bytes or FINAL_SHARD_BYTES
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    main = dist.is_main
    if main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    files: list[str] = []
    weight_map: dict[str, str] = {}
    shard: dict[str, torch.Tensor] = {}
    size = total = 0

    def flush() -> None:
        nonlocal shard, size
        name = f"part-{len(files):05d}.safetensors"
        save_file(shard, str(tmp / name), metadata={"format": "pt"})
        files.append(name)
        weight_map.update(dict.fromkeys(shard, name))
        shard, size = {}, 0

    for name, t in checkpoint_weights(model, dtype=dtype):
        if not main:
            continue
        t = t.detach().to("cpu", dtype).contiguous()
        if shard and size + t.nbytes > max_shard_bytes:
            flush()
        shard[name] = t.clone() if t.untyped_storage().nbytes() != t.nbytes else t  # no shared storage
        size += t.nbytes
        total += t.nbytes
    if main:
        if shard or not files:
            flush()
        names = (
            ["model.safetensors"]
            if len(files) == 1
            else [f"model-{i + 1:05d}-of-{len(files):05d}.safetensors" for i in range(len(files))]
        )
        rename = dict(zip(files, names))
        for old, new in rename.items():
            (tmp / old).rename(tmp / new)
        if len(files) > 1:
            index = {"metadata": {"total_size": total}, "weight_map": {k: rename[v] for k, v in weight_map.items()}}
            (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True))
        config = model.config.__class__.from_dict(model.config.to_dict())
        config.dtype = dtype
        config.save_pretrained(tmp)
        gen = getattr(model, "generation_config", None)
        if gen is not None:
            gen.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / META_FILE).write_text(json.dumps(meta or {}, indent=2, sort_keys=True))
        shutil.rmtree(out_dir, ignore_errors=True)
        tmp.rename(out_dir)
    dist.barrier()
    return out_dir
