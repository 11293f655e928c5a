"""The NVIDIA driver a node needs, and telling "the driver is too old" from "no GPU".

The pinned GPU stack is CUDA 13 (torch 2.13 requires cuda-toolkit 13.0.3; vLLM 0.32 ships the cu13
CUTLASS DSL), and a CUDA 13 program needs an NVIDIA driver of the 580 series or later (NVIDIA's CUDA
13.0 release notes: minimum driver 580). Under an older driver torch reports no GPU at all
(``torch.cuda.is_available()`` is False, with only a warning), which sends a user looking for a
missing GPU; ``gpu_check`` names the driver instead. The driver's version comes from ``nvidia-smi``
(installed with the driver; where it is missing or fails, the machine is taken to have no GPU).
"""

from __future__ import annotations

import shutil
import subprocess

DRIVER_FLOOR = 580
"""The oldest NVIDIA driver series CUDA 13 runs on."""
CUDA_MAJOR = 13


def driver_version() -> str | None:
    """The installed NVIDIA driver's version ("580.159.04"), or None where no driver answers."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [x.strip() for x in out.stdout.splitlines() if x.strip()]
    return lines[0] if out.returncode == 0 and lines else None


def floor_line() -> str:
    """What the GPU stack needs, in one line."""
    return f"the GPU stack is CUDA {CUDA_MAJOR} (torch 2.13, vLLM 0.32): NVIDIA driver >= {DRIVER_FLOOR} needed"


def gpu_check() -> tuple[bool, str]:
    """(usable, one line): a usable GPU with the driver found, or why not: no driver (no GPU), or a
    driver older than the floor, or a driver that is new enough beside a torch that still sees no GPU."""
    import torch

    found = driver_version()
    if torch.cuda.is_available():
        return True, f"{floor_line()}; found {found or 'a driver nvidia-smi does not report'}"
    if found is None:
        return False, "this machine has no GPU (no NVIDIA driver answers: nvidia-smi is missing or fails)"
    try:
        major = int(found.split(".")[0])
    except ValueError:
        major = None
    if major is not None and major < DRIVER_FLOOR:
        return False, (
            f"the NVIDIA driver is older than CUDA {CUDA_MAJOR} needs (found {found}; needs >= {DRIVER_FLOOR}): "
            "torch sees no GPU under it; update the driver or run on nodes that have it"
        )
    built = torch.version.cuda or "none (a CPU build of torch)"
    return False, (
        f"the NVIDIA driver {found} is present but torch sees no GPU (torch {torch.__version__}, CUDA {built}): "
        "install the GPU stack (pip install -e '.[gpu]') or check CUDA_VISIBLE_DEVICES"
    )
