"""What each rollout backend can do, stated once (torch-free: the configuration and the memory plan
read it at plan time). Callers ask a capability, never a backend's name: what the hf backend can do
is known here and in rspo/rollout/hf.py, nowhere else.

- ``in_trainer``: it decodes with the training model itself, in the trainer's memory and under its
  precision (autocast to rollout.dtype): no engine to size, start, put to sleep or sync weights into.
- ``routing_for_free``: it reports the experts each token was routed to at no extra cost, so every
  run logs the routing-agreement metric (an engine reports them only for R3, rollout_replay).
- ``tensor_parallel``: one engine can span several GPUs (rollout.tensor_parallel_size > 1).
- ``sleep``: it can release its memory between rollouts (rollout.vllm_sleep).
- ``enforce_eager``: it takes rollout.vllm_enforce_eager (no CUDA graphs).
- ``fp8_decoding``: rollout.dtype fp8 rounds its decoding weights to E4M3 (rspo.rollout.fp8).
- ``package``: the Python package its engine needs (preflight uses a stand-in engine without it).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CAPABILITIES", "Capabilities", "capabilities"]


@dataclass(frozen=True)
class Capabilities:
    name: str
    factory: str
    """``module:Class`` of the backend (rspo.rollout.make_backend imports it)."""
    in_trainer: bool
    routing_for_free: bool
    tensor_parallel: bool
    sleep: bool
    enforce_eager: bool
    fp8_decoding: bool
    package: str | None = None


CAPABILITIES: dict[str, Capabilities] = {
    "hf": Capabilities(
        "hf",
        "rspo.rollout.hf:HFBackend",
        in_trainer=True,
        routing_for_free=True,
        tensor_parallel=False,
        sleep=False,
        enforce_eager=False,
        fp8_decoding=True,
    ),
    "vllm": Capabilities(
        "vllm",
        "rspo.rollout.vllm:VLLMBackend",
        in_trainer=False,
        routing_for_free=False,
        tensor_parallel=True,
        sleep=True,
        enforce_eager=True,
        fp8_decoding=False,
        package="vllm",
    ),
}


def capabilities(backend: str) -> Capabilities:
    """The capabilities of a backend by name (a ValueError names the known ones)."""
    if backend not in CAPABILITIES:
        raise ValueError(f"rollout.backend: unknown backend {backend!r}; choose one of {list(CAPABILITIES)}")
    return CAPABILITIES[backend]
