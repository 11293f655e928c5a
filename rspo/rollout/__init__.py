"""Rollout backends behind one interface (hf: our own KV-cache sampling loop on the training
model; vllm: a colocated vLLM engine, GPU extra or vLLM's CPU build, see ``rspo.rollout.vllm``).

A backend turns prompts into a ``RolloutBatch``: token ids laid out as LEFT-padded prompts of
width P followed by RIGHT-padded responses of width R, plus the response mask (tokens up to and
including the first stop token), with each sampled token's log-prob under the engine. The trainer
recomputes the old log-probs with the training model on this layout, as in the paper; the engine's
log-probs serve only the train-inference mismatch metrics and the rollout corrections (TIS, MIS:
rspo.losses), never as the old policy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace

from rspo.backend_capabilities import capabilities
from rspo.rollout.base import RolloutBackend, RolloutBatch, Sampling

__all__ = ["RolloutBatch", "RolloutBackend", "Sampling", "generate_chunks", "load_generator", "make_backend"]


def make_backend(name: str, model, tokenizer, **kwargs) -> RolloutBackend:
    """The backend ``name`` (its class from rspo.backend_capabilities), built on the training model."""
    import importlib

    module, cls = capabilities(name).factory.split(":")
    return getattr(importlib.import_module(module), cls)(model, tokenizer, **kwargs)


def generate_chunks(
    backend: RolloutBackend, prompts: list[str], n: int, chunk: int, sampling: Sampling, *, row_offset: int = 0
) -> Iterator[tuple[int, RolloutBatch]]:
    """``backend.generate`` over ``prompts``, ``chunk`` prompts (n responses each) per call; yields
    (index of the call's first prompt, its batch). Row i of the whole is seeded as row
    ``row_offset + i`` (the backends' per-row streams), so the responses do not depend on ``chunk``."""
    step = max(1, chunk)
    for start in range(0, len(prompts), step):
        yield start, backend.generate(prompts[start : start + step], n, sampling, row_offset=row_offset + start * n)


EVAL_SAMPLING = Sampling(temperature=0.0, max_new_tokens=512)  # an evaluation generator's defaults: greedy, 512 tokens


def load_generator(
    model_dir: str,
    backend: str = "hf",
    *,
    sampling: Sampling = EVAL_SAMPLING,
    dtype: str = "float32",
    device: str = "auto",
    batch_size: int = 64,
    progress: Callable[[int], None] | None = None,
    engine_options: dict | None = None,
) -> Callable[..., list[list[str]]]:
    """A ``generate_fn(prompts, n, temperature, *, max_new_tokens, top_p, top_k, seed)
    -> list[list[str]]`` for evaluation suites; what a call leaves out is ``sampling``'s.

    The model is loaded in ``dtype`` (the preset's: evaluate what was trained, in its precision).
    vLLM gets every prompt of a call at once and schedules them itself (continuous batching); the
    hf backend decodes ``batch_size`` rows at a time. Seeds: a call given ``seed`` uses it; else call
    k of the generator uses ``sampling.seed * 1_000_003 + k``. Each prompt's rows are seeded by their
    index in the call, so the samples do not depend on how the hf backend chunks a call. ``progress(k)``
    is called after each batch with the number of prompts it answered. ``generate_fn.settings``
    records what was used (backend, dtype, the default budget and sampling, seeding, batching) and
    ``generate_fn.tokenizer`` is the checkpoint's tokenizer (its chat template renders prompts)."""
    from rspo.hub import resolve_model
    from rspo.models import load_model, load_tokenizer_checked

    model_dir = resolve_model(model_dir)
    tokenizer = load_tokenizer_checked(model_dir)
    model = load_model(model_dir, dtype=dtype, device=device) if backend == "hf" else None
    engine_options = dict(engine_options or {})
    engine = (
        make_backend(backend, model, tokenizer, model_path=model_dir, dtype=dtype, seed=sampling.seed, **engine_options)
        if backend == "vllm"
        else make_backend("hf", model, tokenizer)
    )
    calls = {"k": 0}

    def generate_fn(
        prompts: list[str],
        n: int = 1,
        temperature: float | None = None,
        *,
        max_new_tokens: int | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        seed: int | None = None,
    ) -> list[list[str]]:
        calls["k"] += 1
        given = {"temperature": temperature, "max_new_tokens": max_new_tokens, "top_p": top_p, "top_k": top_k}
        call = replace(
            sampling,
            seed=seed if seed is not None else sampling.seed * 1_000_003 + calls["k"],
            **{k: v for k, v in given.items() if v is not None},
        )
        per = len(prompts) if backend == "vllm" else max(1, batch_size // max(n, 1))
        out: list[list[str]] = []
        for _, batch in generate_chunks(engine, prompts, n, per, call):
            rows = len(batch.responses) // n
            out += [batch.responses[i * n : (i + 1) * n] for i in range(rows)]
            if progress is not None:
                progress(rows)
        return out

    generate_fn.settings = {
        "backend": backend,
        "dtype": dtype,
        "max_new_tokens": sampling.max_new_tokens,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k,
        "seed": sampling.seed,
        "seeding": "a call's seed, else seed * 1000003 + call number; row i of a call: row_seed(call seed, i)",
        "batching": "every prompt of a call at once" if backend == "vllm" else f"{batch_size} rows at a time",
        "tensor_parallel_size": int(engine_options.get("tensor_parallel_size", 1)) if backend == "vllm" else 1,
    }
    generate_fn.tokenizer = tokenizer
    return generate_fn
