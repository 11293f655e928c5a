"""The GPU checks' scripts, on a CPU: what can be checked without a GPU (scripts/device_checks.sh runs
them on a lent GPU; docs/cluster.md has what they printed)."""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_allocator_check_builds_its_pool_on_an_allocator_of_its_own(tmp_path):
    """torch refuses expandable segments only for a MemPool with its own allocator (vLLM's case); a
    plain MemPool passes either way. The check's pool is built on a compiled pluggable allocator,
    one case keeps a plain pool to show the difference, and the refusal is expected only under
    expandable segments without the toggle."""
    check = _load("mempool_check")
    case_code = ast.parse(check.CASE)
    calls = {ast.unparse(n.func) for n in ast.walk(case_code) if isinstance(n, ast.Call)}
    assert "torch.cuda.memory.CUDAPluggableAllocator" in calls and "torch.cuda.MemPool" in calls
    assert "alloc.allocator" in calls and "engine_allocator" in calls
    assert {c: ok for c, (_, ok) in check.CASES.items()} == {"off": True, "on": False, "on+toggle": True, "plain": True}
    assert all("expandable_segments:True" in conf for c, (conf, _) in check.CASES.items() if c != "off")
    lib = check.build_allocator(tmp_path)  # the allocator compiles and exports what the pool calls
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True).stdout
    assert " rspo_malloc" in symbols and " rspo_free" in symbols


def test_the_moe_block_check_runs_its_cases_and_counts_the_experts_flops():
    """The four layouts run (on a CPU, a cut block), one JSON line each, and the FLOPs formula is
    the routed experts' three products, forward and backward."""
    check = _load("moe_block_check")
    raw = json.loads(check.CONFIG.read_text())
    assert check.block_flops(raw, 10) == 3 * 2 * 10 * 8 * 3 * 2048 * 768
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "moe_block_check.py"),
            "--device",
            "cpu",
            "--experts",
            "4",
            "--tokens",
            "16",
            "--repeats",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    cases = [(x["experts"], x["weights"], x["autocast_bf16"]) for x in lines if "experts" in x]
    assert cases == list(check.CASES)
    assert lines[0]["default_experts_implementation"] in ("grouped_mm", "eager")
    assert "eager_over_grouped_mm_bf16" in lines[-1]
