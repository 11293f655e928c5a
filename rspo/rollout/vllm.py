"""vLLM rollouts (GPU extra, ``envs/gpu.yaml`` / ``pip install -e '.[gpu]'``), colocated with training.

How to run on a GPU node: install the gpu extra, set ``rl.rollout.backend: vllm`` (the
paper_large presets do) and ``rl.model.device: cuda``; the engine is created once in the training
process with ``gpu_memory_utilization = rl.rollout.vllm_gpu_memory_utilization`` and after every
optimiser phase the trainer calls ``sync_weights(model)``, which streams the training model's
state dict into the engine's model (``load_weights``) and resets the prefix cache, so the next
rollout samples from the updated policy (the same colocated scheme TRL uses).
Under torchrun (``resources.train.processes`` = GPUs per node) every rank builds its own engine
on its own GPU and generates its share of the prompts; ``sync_weights`` all-gathers the FSDP2
shards parameter by parameter into each engine. Give the engine and the FSDP shards room
together: ``vllm_gpu_memory_utilization`` is the engine's share of each GPU.

vLLM cannot run on the CPU machines of this project: the import is guarded (a clear error names
the missing extra) and everything around the engine is unit-tested with a fake engine that has
the same ``generate`` / output shape (``RequestOutput.prompt_token_ids``, ``.outputs[j].token_ids``).

Deviation from the hf backend: vLLM returns its own sampled token ids and seeds per prompt (one
seeded SamplingParams per request), not per response row; the batch is rebuilt in the same layout
(left-padded prompts, right-padded responses, EOS included in the mask). Old log-probs are always
recomputed by the training model (paper: the rollout engine's log-probs are not used).
"""

from __future__ import annotations

import torch

from rspo.rollout.base import RolloutBatch, pack_rows, stop_token_ids
from rspo.seeding import row_seed


def _import_vllm():
    try:
        import vllm  # noqa: F401
        from vllm import LLM, SamplingParams
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "rollout.backend=vllm needs the GPU extra: pip install -e '.[gpu]' (or the envs/gpu.yaml "
            "conda env) on a machine with a CUDA GPU"
        ) from e
    return LLM, SamplingParams


class VLLMBackend:
    def __init__(
        self,
        model,
        tokenizer,
        *,
        model_path: str = "",
        gpu_memory_utilization: float = 0.5,
        dtype: str = "bfloat16",
        max_model_len: int | None = None,
        engine=None,
        sampling_params_cls=None,
        **_: object,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.stop_ids = stop_token_ids(tokenizer)  # a response ends at EOS or any other special token
        if engine is None:
            LLM, sampling_params_cls = _import_vllm()
            engine = LLM(
                model=model_path,
                dtype=dtype,
                gpu_memory_utilization=gpu_memory_utilization,
                max_model_len=max_model_len,
                enable_prefix_caching=True,
            )
        self.engine = engine
        self.sampling_params_cls = sampling_params_cls

    def _engine_model(self):
        """The engine's nn.Module, across vLLM's executor layouts (V0 driver_worker, V1 worker)."""
        engine = getattr(self.engine, "llm_engine", self.engine)
        executor = getattr(engine, "model_executor", None)
        worker = getattr(executor, "driver_worker", None)
        for path in ("model_runner.model", "worker.model_runner.model"):
            obj = worker
            for attr in path.split("."):
                obj = getattr(obj, attr, None)
            if obj is not None and hasattr(obj, "load_weights"):
                return obj
        raise RuntimeError(
            "cannot reach the vLLM engine's model to load new weights (unknown vLLM executor layout); "
            "run vLLM in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0) with tensor_parallel_size=1"
        )

    def sync_weights(self, model) -> None:
        """Stream the training model's weights into the engine. Under FSDP2 each parameter is
        all-gathered first (a collective: every rank calls this after every step)."""
        from rspo.distributed import full_tensor

        self.model = model
        target = self._engine_model()
        target.load_weights(((name, full_tensor(p.detach())) for name, p in model.state_dict().items()))
        if hasattr(self.engine, "reset_prefix_cache"):
            self.engine.reset_prefix_cache()

    def generate(
        self,
        prompts: list[str],
        n: int,
        *,
        temperature: float,
        top_p: float = 1.0,
        max_new_tokens: int = 64,
        seed: int = 0,
        row_offset: int = 0,
    ) -> RolloutBatch:
        """One SamplingParams per prompt, seeded by the global row of the prompt's first response,
        so a prompt's n responses do not depend on how prompts are split over calls or ranks."""
        if not prompts:
            raise ValueError("prompts: empty")
        params = [
            self.sampling_params_cls(
                n=n,
                temperature=temperature,
                top_p=top_p if temperature > 0 else 1.0,
                max_tokens=max_new_tokens,
                seed=row_seed(seed, row_offset + i * n),
                stop_token_ids=self.stop_ids,
            )
            for i in range(len(prompts))
        ]
        outputs = self.engine.generate(prompts, params, use_tqdm=False)
        prompt_rows: list[list[int]] = []
        resp_rows: list[list[int]] = []
        for req in outputs:
            for comp in req.outputs:
                prompt_rows.append(list(req.prompt_token_ids))
                resp_rows.append(list(comp.token_ids))
        device = next(self.model.parameters()).device if self.model is not None else torch.device("cpu")
        return pack_rows(prompt_rows, resp_rows, self.tokenizer, device=device)
