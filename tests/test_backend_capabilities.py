"""rspo.backend_capabilities: callers ask a rollout backend what it can do, never its name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rspo.backend_capabilities import CAPABILITIES, Capabilities, capabilities
from rspo.config import BACKENDS, ConfigError, train_config_from_dict

ROOT = Path(__file__).resolve().parents[1]


def test_no_module_outside_the_backends_asks_a_backend_its_name():
    asks = re.compile(r"""backend\s*[!=]=\s*["'](hf|vllm)["']""")
    found = [
        f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
        for p in sorted((ROOT / "rspo").rglob("*.py"))
        if "rollout" not in p.relative_to(ROOT / "rspo").parts[:1]
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if asks.search(line)
    ]
    assert not found, "ask rspo.backend_capabilities instead:\n" + "\n".join(found)


def test_the_backends_state_their_capabilities():
    assert BACKENDS == tuple(CAPABILITIES) == ("hf", "vllm")
    hf, vllm = capabilities("hf"), capabilities("vllm")
    assert hf.in_trainer and hf.routing_for_free and hf.fp8_decoding and not (hf.tensor_parallel or hf.sleep)
    assert not vllm.in_trainer and vllm.tensor_parallel and vllm.sleep and vllm.package == "vllm"
    with pytest.raises(ValueError, match="unknown backend 'sglang'"):
        capabilities("sglang")
    # the configuration refuses what the backend cannot do, by capability
    with pytest.raises(ConfigError, match="need backend: vllm"):
        train_config_from_dict({"rollout": {"backend": "hf", "tensor_parallel_size": 2}})
    with pytest.raises(ConfigError, match="rollout.dtype"):
        train_config_from_dict({"rollout": {"backend": "vllm", "dtype": "fp8"}})


def test_preflight_stands_in_for_an_engine_whose_package_is_missing(monkeypatch):
    from rspo.gpu_memory.preflight import _needs_standin

    assert not _needs_standin("hf")
    ghost = Capabilities("ghost", "x:Y", False, False, True, True, True, False, package="no_such_package_here")
    monkeypatch.setitem(CAPABILITIES, "ghost", ghost)
    assert _needs_standin("ghost")
