"""`rspo preflight` with vLLM's CPU build: the smoke model's step through the real engine (built,
slept and woken as the trainer does; sleep itself is a no-op on the CPU build), measured per phase."""

import pytest
from test_gpu_memory_preflight import check, preflight, smoke_for_vllm

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
pytest.importorskip("vllm", reason="needs vLLM (its CPU build in .venv-vllm: `make test` runs these tests there)")


def test_the_smoke_step_through_the_engine_is_measured_and_scaled(tmp_path):
    line = preflight(smoke_for_vllm(tmp_path))
    check(line, "vllm")
    # the parity gate: the engine runs the trainer's weights in the trainer's dtype
    assert line["parity"]["ok"] and 0 <= line["parity"]["k3_kl"] < 1e-3


PERTURB = """
import torch
from rspo.rollout import vllm as V

_reload = V.VLLMBackend._reload


def perturbed(self, weights):  # every weight the engine loads, 3 sd of noise: not the trainer's model
    gen = torch.Generator().manual_seed(0)
    _reload(self, ((n, t * (1 + 3.0 * torch.randn(t.shape, generator=gen, dtype=t.dtype))) for n, t in weights))


V.VLLMBackend._reload = perturbed
"""


def test_the_parity_gate_refuses_an_engine_that_runs_other_weights(tmp_path):
    """The same preflight with every weight the engine loads perturbed (a sitecustomize module on
    PYTHONPATH patches the engine's reload in each stage's process, nothing in the library): the
    gate names the KL and the command exits 3. The preflight's weights are random, so its policy is
    near uniform: 30% noise moved the KL to 0.0015 only (passes), 3 sd of noise to 0.98."""
    import os
    import subprocess
    import sys

    from test_gpu_memory_preflight import ROOT

    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(PERTURB)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(ROOT)])}
    cmd = [sys.executable, "-m", "rspo", "preflight", "--preset", str(smoke_for_vllm(tmp_path))]
    r = subprocess.run(
        [*cmd, "--set", "rollout.backend=vllm"], capture_output=True, text=True, timeout=900, cwd=ROOT, env=env
    )
    assert r.returncode == 3, r.stdout[-2000:] + r.stderr[-3000:]
    assert "parity: engine-trainer k3 KL" in r.stdout and "REFUSED" in r.stdout
    assert "the engine does not run the model the trainer trains: k3 KL" in r.stderr
