"""One update (or old pass) of a preset's run simulated on fake tensors: what a GPU would hold,
measured by torch's memory trackers without allocating anything (the check of rspo.memory_plan).

``simulate`` builds the model from its config under ``FakeTensorMode`` (tensors with shapes,
dtypes and devices but no storage) and runs the trainer's own code path: under torchrun's world
size W > 1 it shards the model with ``rspo.distributed.shard_model`` (fp32 master shards, the
compute-dtype mixed-precision policy) over a fake process group (collectives that do nothing but
allocate their outputs); with W = 1 it keeps the fp32 model whole and runs the forwards under
autocast, as one process does (rspo.train.precision). Then, for the update: the raw router capture
(kept through backward), activation checkpointing, the log-probs (whole logits or chunked from the
hidden states), the router-shift ratio from an old-router cache slice, a loss that uses both, the
backward and the AdamW step, twice (the second update is the steady state, with Adam's moments); for
the old pass: the no-grad forward with the capture and the log-probs and entropy.
``FSDPMemTracker`` (W > 1) or ``MemTracker`` (W = 1) from ``torch.distributed._tools`` records the
peak of every tensor alive on the device.

Not simulated: the vLLM engine (its memory is what it reserves, rspo.memory_plan), kernel
workspaces (cuBLAS, attention), NCCL buffers, allocator fragmentation (RESERVED_GIB stands for
those). The loss has GMPO's shape (a per-response mean of log-probs weighted by gamma) instead of
the full rspo.losses call, whose metrics read values fake tensors do not have. One process (W = 1)
runs on real tensors: its experts take transformers' eager loop (rspo.train.precision), whose shapes
depend on the routing, which fake tensors cannot follow; use a model that fits in memory there. Run
it in a fresh process (``python -m rspo plan-memory --simulate``): the fake process group becomes
the default.
"""

from __future__ import annotations

import contextlib

import torch

GIB = 2**30


def simulate(cfg, config, world: int, tokens: int, row: int, phase: str = "update") -> float:
    """Peak GiB one GPU holds in ``phase`` (update | old pass) for ``tokens`` tokens in rows of
    ``row``; ``cfg`` a TrainConfig (settings), ``config`` a transformers config (the model)."""
    import torch.distributed as tdist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from transformers import AutoModelForCausalLM

    from rspo.distributed import Dist, shard_model
    from rspo.models import position_ids_from_mask, response_logprobs
    from rspo.router import OldRouterCache, capture_router_logits, router_shift_ratio, router_spec
    from rspo.train.memory import enable_activation_checkpointing, lm_head_returns_hidden, response_logprobs_chunked
    from rspo.train.optim import build_optimizer
    from rspo.train.precision import MASTER_DTYPE, Precision, one_process_mixed

    sharded = world > 1
    if sharded and not tdist.is_initialized():
        tdist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    dist = Dist(rank=0, world_size=world, local_rank=0, local_world_size=world)
    mesh = init_device_mesh("cpu", (world,)) if sharded else None
    precision = Precision.of(cfg.model.dtype, torch.device("cpu"), dist)
    rows = max(1, tokens // row)
    prompt = min(row - 1, cfg.data.max_prompt_tokens)
    chunk = cfg.model.logits_chunk_tokens
    update = phase == "update"
    # one process runs transformers' eager experts loop (rspo.train.precision), whose shapes depend on the
    # routing: fake tensors cannot follow it, so W = 1 runs on real tensors (small models only)
    with FakeTensorMode(allow_non_fake_inputs=True) if sharded else contextlib.nullcontext():
        model = AutoModelForCausalLM.from_config(config, dtype=MASTER_DTYPE)
        if cfg.model.gradient_checkpointing:
            enable_activation_checkpointing(model)
        model.config.use_cache = False
        if sharded:
            shard_model(
                model,
                dist,
                torch.device("cpu"),
                master_dtype=MASTER_DTYPE,
                mp_policy=precision.fsdp_policy(),
                mesh=mesh,
            )
        else:
            one_process_mixed(model, precision)
        optimizer, _ = build_optimizer(model, cfg.optim, sharded=sharded)
        spec = router_spec(model)
        ids = torch.randint(0, config.vocab_size, (rows, row))
        attn = torch.ones_like(ids)
        cache = OldRouterCache.zeros(spec.num_moe_layers, (rows, row), spec.top_k, spec.num_experts)
        if sharded:
            tracker = FSDPMemTracker(model, optimizer)
            tracker.track_inputs((ids,))
        else:
            tracker = MemTracker()
            tracker.track_external(model, optimizer)
        model.train(update)

        def one_pass():
            with (
                contextlib.nullcontext() if update else torch.no_grad(),
                capture_router_logits(model, raw=True, detach=not update) as cap,
                lm_head_returns_hidden(model) if chunk else contextlib.nullcontext() as head,
            ):
                with precision.autocast():
                    pos = position_ids_from_mask(attn)
                    out = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False)
                cap.stop()
                if chunk:
                    with precision.autocast():
                        logp, ent = response_logprobs_chunked(
                            out.logits, head.weight, ids, prompt, not update, 1.0, chunk
                        )
                else:
                    logp, ent = response_logprobs(out.logits, ids, prompt, not update, 1.0)
                if not update:  # the old pass: the cache of these rows from the captured logits
                    part = OldRouterCache.from_logits(cap.logits, spec.top_k, (rows, row), indices_list=cap.indices)
                    del part, out, logp, ent
                    return
                gamma = router_shift_ratio(cache, cap.logits)[:, prompt - 1 : -1].detach()  # (rows, R)
                loss = -(logp * gamma).mean(dim=1).mean()
                loss.backward()
                del out, logp, gamma, loss
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        # a first update allocates Adam's moments outside the tracked pass (the steady state has them)
        phase_update, update = update, True
        model.train()
        one_pass()
        update = phase_update
        model.train(update)
        if sharded:
            tracker.reset_mod_stats()
        with tracker:
            one_pass()
        peak = tracker.get_tracker_snapshot("peak")
    return max(d["Total"] for d in peak.values()) / GIB
