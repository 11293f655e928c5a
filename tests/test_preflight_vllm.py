"""`rspo preflight` with vLLM's CPU build: the smoke model's step through the real engine (built,
slept and woken as the trainer does; sleep itself is a no-op on the CPU build), measured per phase."""

import pytest
from test_gpu_memory_preflight import check, preflight, smoke_for_vllm

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
pytest.importorskip("vllm", reason="needs vLLM (its CPU build in .venv-vllm: `make test` runs these tests there)")


def test_the_smoke_step_through_the_engine_is_measured_and_scaled(tmp_path):
    check(preflight(smoke_for_vllm(tmp_path)), "vllm")
