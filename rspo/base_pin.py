"""The committed base model a study starts from: a preset's `base_model:` (path and sha256).

Pretraining is not bit-identical between CPUs (other kernels, other rounding), so a study run in
pieces on several machines would start each piece from other weights. A preset that pins its base
(`base_model: {path, sha256}`) is trained from that folder only:

- ``install`` copies the pinned folder into the workflow's models/base (the `install_base` rule, in
  place of `pretrain`), after checking the weights' digest, its marker pretrain.json last;
- ``check`` is what every Countdown train job runs before it loads anything (`rspo train`): a base whose
  model.safetensors has another sha256 is refused in one line that names both digests;
- ``pin`` (`make base`) copies a freshly pretrained folder to the pinned path and rewrites the
  preset's ``sha256:`` line, so a user can rebuild the base with one command and the preset says which.

Not in the paper (its bases are hub checkpoints, pinned by their revision: rspo.hub).
"""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path

from rspo.method import ConfigError
from rspo.preset import Preset

__all__ = [
    "WEIGHTS",
    "BaseMismatch",
    "check",
    "check_digest",
    "copy_checked",
    "install",
    "pin",
    "pinned_dir",
    "weights_sha256",
]

WEIGHTS = "model.safetensors"
MARKER = "pretrain.json"  # written last by `rspo pretrain`; the workflow's output of the base


class BaseMismatch(ConfigError):
    """The base model is not the one the preset pins."""


def weights_sha256(folder: str | Path) -> str:
    """sha256 of a base folder's model.safetensors (a BaseMismatch when there is none)."""
    path = Path(folder) / WEIGHTS
    if not path.is_file():
        raise BaseMismatch(f"{folder}: no {WEIGHTS} (not a base model folder)")
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def pinned_dir(preset: Preset) -> Path:
    """The pinned base's folder (a relative `base_model.path` starts at the preset's root)."""
    pin = _pin(preset)
    path = Path(pin.path)
    return path if path.is_absolute() else preset.root / path


def _pin(preset: Preset):
    pin = preset.base_pin
    if pin is None:
        raise ConfigError(f"{preset.path or preset.name}: base_model: the preset pins no base model")
    return pin


def check(preset: Preset, folder: str | Path) -> None:
    """Refuse ``folder`` unless its weights are the ones the preset pins (no-op without a pin)."""
    pin = preset.base_pin
    if pin is not None:
        check_digest(folder, pin.sha256, "the preset's pinned base", "base_model.sha256")


def check_digest(folder: str | Path, sha256: str, what: str, key: str) -> None:
    """Refuse ``folder`` unless its weights' sha256 is ``sha256`` (``key`` names where that is stated)."""
    found = weights_sha256(folder)
    if found != sha256:
        raise BaseMismatch(
            f"base model {folder} is not {what}: its {WEIGHTS} has sha256 {found[:12]}..., "
            f"{key} is {sha256[:12]}... (install the pinned one, or re-pin with `make base`)"
        )


def install(preset: Preset, out: str | Path) -> Path:
    """Copy the pinned base into ``out`` (checked before and after the copy), the marker last."""
    return copy_checked(pinned_dir(preset), _pin(preset).sha256, out, "base_model")


def copy_checked(src: str | Path, sha256: str, out: str | Path, key: str) -> Path:
    """Copy a committed base folder into ``out``: its weights' digest checked before and after the
    copy, its marker (pretrain.json) written last, so a copy cut short is never taken for a base."""
    src, out = Path(src), Path(out)
    if not (src / MARKER).is_file():
        raise BaseMismatch(f"{key}.path: {src} holds no {MARKER} (not a finished base model folder)")
    check_digest(src, sha256, f"the base {key} pins", f"{key}.sha256")
    out.mkdir(parents=True, exist_ok=True)
    for p in sorted(p for p in src.iterdir() if p.is_file() and p.name != MARKER):
        shutil.copyfile(p, out / p.name)
    check_digest(out, sha256, f"the base {key} pins", f"{key}.sha256")
    shutil.copyfile(src / MARKER, out / MARKER)
    return out


_SHA_LINE = re.compile(r"^(\s+sha256:\s*)([0-9a-f]{64})(.*)$", re.M)


def pin(preset_file: str | Path, folder: str | Path) -> str:
    """Make ``folder`` (a finished `rspo pretrain` output) the preset's pinned base: copy its files to
    `base_model.path` and rewrite the preset's one `sha256:` line. -> the new digest."""
    preset = Preset.load(preset_file)
    old = _pin(preset).sha256
    folder = Path(folder)
    if not (folder / MARKER).is_file():
        raise BaseMismatch(f"{folder}: no {MARKER} (pretraining did not finish)")
    new = weights_sha256(folder)
    text = Path(preset_file).read_text()
    lines = [m for m in _SHA_LINE.finditer(text) if m.group(2) == old]
    if len(lines) != 1:
        raise ConfigError(
            f"{preset_file}: expected one `sha256: {old[:12]}...` line under base_model, found {len(lines)}"
        )
    dest = pinned_dir(preset)
    if dest.resolve() != folder.resolve():
        for p in dest.iterdir() if dest.is_dir() else ():
            if p.is_file():
                p.unlink()
        copy_checked(folder, new, dest, "base_model")
    m = lines[0]
    Path(preset_file).write_text(text[: m.start(2)] + new + text[m.end(2) :])
    return new
