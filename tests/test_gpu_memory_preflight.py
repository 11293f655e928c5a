"""`rspo preflight` on this machine: the preset's real step (cut to its layers, random weights) in two
processes (first step and save; resume and second step), each phase measured and scaled, a JSON
line. Where vLLM is not installed (the main venv) a preset with the vLLM backend runs on the
stand-in engine and says so; with vLLM's CPU build: tests/test_preflight_vllm.py."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
STEP = [
    "engine_start",
    "rollout",
    "old_pass",
    "update",
    "optimizer_step",
    "sync",
    "kv_wake",
    "checkpoint_save",
    "resume",
]


def smoke_for_vllm(tmp_path: Path) -> Path:
    """The smoke preset with one attention head per layer (head size 32: vLLM's CPU kernels serve it)."""
    preset = yaml.safe_load((ROOT / "configs" / "smoke.yaml").read_text())
    preset["pretrain"]["model"].update(num_heads=1, num_kv_heads=1)
    path = tmp_path / "smoke_vllm.yaml"
    path.write_text(yaml.safe_dump(preset))
    return path


def preflight(preset: Path, *args: str, python: str = sys.executable, printed: list | None = None) -> dict:
    """The JSON line; what the command printed goes into ``printed`` when given."""
    cmd = [python, "-m", "rspo", "preflight", "--preset", str(preset), "--set", "rollout.backend=vllm", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert "GiB per phase, measured and scaled to the full depth" in r.stdout
    if printed is not None:
        printed.append(r.stdout)
    return json.loads(r.stdout.strip().splitlines()[-1])


def check(line: dict, engine: str) -> None:
    assert {"preset", "fits", "measured", "planned", "margin_gib", "step_s_estimate"} <= set(line)
    assert line["preset"] == "smoke" and line["device"] == "cpu" and line["engine"].startswith(engine)
    assert set(STEP) <= set(line["measured"]) and set(line["measured"]) == set(line["planned"])
    assert all(v > 0 for v in line["measured"].values()) and line["fits"] and line["step_s_estimate"] > 0


@pytest.mark.skipif(
    __import__("importlib").util.find_spec("vllm") is not None, reason="vLLM is installed: the real engine runs"
)
def test_without_vllm_the_step_runs_on_the_stand_in_engine_and_says_so(tmp_path):
    printed: list[str] = []
    line = preflight(smoke_for_vllm(tmp_path), printed=printed)
    check(line, "stand-in (vLLM is not installed here)")
    # the stand-in has no log-probs: the parity gate says plainly that it did not run, and what to run
    assert line["parity"]["checked"] is False and line["parity"]["k3_kl"] is None
    assert "parity: NOT CHECKED: the stand-in engine decodes nothing" in printed[0]
    assert "pip install -e '.[gpu]'" in printed[0]
    # the stand-in decodes nothing: the step adds the rollout's floor at an H100's bandwidth (the
    # default --gpu-gib) to the measured training part (the smoke model's floor rounds to 0.0 s)
    assert line["rollout_s_floor"] is not None and line["rollout_s_floor"] >= 0
    assert abs(line["step_s_estimate"] - line["train_s_estimate"] - line["rollout_s_floor"]) <= 0.11


def test_a_preflight_finds_its_gpu_by_cudas_name_or_by_the_size_it_plans_for():
    from rspo.gpu_memory.preflight import gpu_named

    assert gpu_named("NVIDIA H100 80GB HBM3", 79.19) == "h100-80gb"
    assert gpu_named("NVIDIA A100-SXM4-80GB", 79.2) == "a100-80gb"
    assert gpu_named("", 79.19) == "h100-80gb" and gpu_named("", 40.0) == ""
    assert gpu_named("NVIDIA L40S", 44.4) == ""


def test_the_parity_gate_passes_agreement_and_refuses_a_mismatch_naming_it():
    from rspo.gpu_memory.preflight import PARITY_KL, parity

    ok = parity([{"rollout_corr/k3_kl": 1e-4, "rollout_corr/routing_agreement": 0.99}, {"rollout_corr/k3_kl": 3e-4}])
    assert ok["k3_kl"] == pytest.approx(2e-4) and (ok["routing_agreement"], ok["threshold"], ok["ok"]) == (
        0.99,
        PARITY_KL,
        True,
    )
    bad = parity([{"rollout_corr/k3_kl": 0.02}, {"rollout_corr/k3_kl": 0.03}])
    assert not bad["ok"] and bad["k3_kl"] == pytest.approx(0.025) and bad["routing_agreement"] is None
    assert parity([{}, {}])["ok"]  # an engine that reports no log-probs: nothing to refuse
    assert PARITY_KL == 0.015  # prime-rl's gate (the module docstring)
