"""Rollout backends behind one interface (hf: our own KV-cache sampling loop on the training
model; vllm: a colocated vLLM engine, GPU extra or vLLM's CPU build, see ``rspo.rollout.vllm``).

A backend turns prompts into a ``RolloutBatch``: token ids laid out as LEFT-padded prompts of
width P followed by RIGHT-padded responses of width R, plus the response mask (tokens up to and
including the first stop token). The trainer recomputes old log-probs with the training model on
this layout (the rollout engine's own log-probs are never used, as in the paper).
"""

from __future__ import annotations

from collections.abc import Callable

from rspo.rollout.base import RolloutBackend, RolloutBatch

__all__ = ["RolloutBatch", "RolloutBackend", "load_generator", "make_backend"]


def make_backend(name: str, model, tokenizer, **kwargs) -> RolloutBackend:
    if name == "hf":
        from rspo.rollout.hf import HFBackend

        return HFBackend(model, tokenizer, **kwargs)
    if name == "vllm":
        from rspo.rollout.vllm import VLLMBackend

        return VLLMBackend(model, tokenizer, **kwargs)
    raise ValueError(f"rollout.backend: unknown backend {name!r}; choose hf or vllm")


def load_generator(
    model_dir: str,
    backend: str = "hf",
    *,
    max_new_tokens: int = 512,
    top_p: float = 1.0,
    dtype: str = "float32",
    device: str = "auto",
    batch_size: int = 64,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
) -> Callable[[list[str], int, float], list[list[str]]]:
    """A ``generate_fn(prompts, n, temperature) -> list[list[str]]`` for evaluation suites.

    ``progress(k)`` is called after each batch with the number of prompts it answered."""
    from rspo.models import load_model, load_tokenizer_checked

    tokenizer = load_tokenizer_checked(model_dir)
    model = load_model(model_dir, dtype=dtype, device=device) if backend == "hf" else None
    engine = (
        make_backend(backend, model, tokenizer, model_path=model_dir, dtype=dtype, seed=seed)
        if backend == "vllm"
        else make_backend("hf", model, tokenizer)
    )
    calls = {"k": 0}

    def generate_fn(prompts: list[str], n: int = 1, temperature: float = 0.0) -> list[list[str]]:
        out: list[list[str]] = []
        for start in range(0, len(prompts), max(1, batch_size // max(n, 1))):
            chunk = prompts[start : start + max(1, batch_size // max(n, 1))]
            calls["k"] += 1
            batch = engine.generate(
                chunk,
                n,
                temperature=temperature,
                top_p=top_p,
                max_new_tokens=max_new_tokens,
                seed=seed * 1_000_003 + calls["k"],
            )
            for i in range(len(chunk)):
                out.append(batch.responses[i * n : (i + 1) * n])
            if progress is not None:
                progress(len(chunk))
        return out

    return generate_fn
