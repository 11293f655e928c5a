"""Under torchrun (2 gloo processes): a Trainer with rollout.backend=vllm runs 2 steps; after each
step's sync every rank compares its own engine's log-probs with the gathered (full) training model
(tests/vllm_checks.py: against the model in float32 and float64) and writes what it measured to
OUT/rank<r>.json: the log-prob checks, the sync times, the first step's rollout rows, and the most
bytes of gathered weight tensors a sync held at once (each tensor the sync hands to the engine is
tracked until it is freed; resident memory cannot show it, the allocator reuses what the step just
freed). Then two faulty syncs, each measured the same way (the negative cases of the check): a
third step whose sync leaves out decoder layer 1 (the engine keeps that layer of step 2), and a
sync where one tensor-parallel shard of one weight is 1% off (the input columns of layer 0's
attention output projection that rank 1 of a tensor-parallel-2 engine holds). Used by
tests/test_distributed_vllm.py.

    worker.py ASSETS OUT [TENSOR_PARALLEL_SIZE]"""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from vllm_checks import digit_task, engine_logprobs, train_cfg  # noqa: E402

from rspo.train.trainer import Trainer  # noqa: E402


def gathered(model):
    from transformers import AutoModelForCausalLM

    from rspo.distributed import full_tensor

    sd = {k: full_tensor(v.detach()).cpu() for k, v in model.state_dict().items()}  # collective, every rank
    plain = AutoModelForCausalLM.from_config(model.config, dtype=torch.float32)
    plain.load_state_dict(sd, strict=True)
    return plain.eval()


def track_held_weights(live: dict) -> None:
    """Count the bytes of the gathered tensors a weight sync holds at once (peak in live["peak"])."""
    import weakref

    import rspo.rollout.vllm as V

    real = V.checkpoint_weights

    def released(nbytes: int) -> None:
        live["now"] -= nbytes

    def tracked(model, dtype=None):
        for name, t in real(model, dtype):
            live["now"] += t.nbytes
            live["peak"] = max(live["peak"], live["now"])
            weakref.finalize(t, released, t.nbytes)
            yield name, t

    V.checkpoint_weights = tracked


def faulty_sync(fault: str, model):
    """Replace the weights a sync hands over: ``stale-layer`` hands decoder layer 1's tensors as they
    are now (the next sync then leaves that layer one step behind; leaving them out altogether makes
    vLLM's reload raise, which is not the silent fault to catch), ``shard`` scales the second half of
    the input columns of layer 0's o_proj (row parallel: the shard rank 1 of a tensor-parallel-2
    engine loads) by 1.01. Returns the function that undoes it."""
    import rspo.rollout.vllm as V

    real = V.checkpoint_weights
    stale = {n: t.clone() for n, t in real(model) if ".layers.1." in n} if fault == "stale-layer" else {}

    def faulty(model, dtype=None):
        for name, t in real(model, dtype):
            if name in stale:
                t = stale[name].to(t.dtype)
            if fault == "shard" and name.endswith("layers.0.self_attn.o_proj.weight"):
                t = t.clone()
                t[:, t.shape[1] // 2 :] *= 1.01
            yield name, t

    V.checkpoint_weights = faulty
    return lambda: setattr(V, "checkpoint_weights", real)


def as_dict(check) -> dict:
    return {"gap": check.gap, "error": check.error, "scale": check.scale, "bound": check.bound, "ok": check.ok}


if __name__ == "__main__":
    assets, out = Path(sys.argv[1]), Path(sys.argv[2])
    tp = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    trainer = Trainer(
        train_cfg(assets, prompts_per_step=4, tensor_parallel_size=tp), out / "run", quiet=True, task=digit_task()
    )
    rank = trainer.dist.rank
    report = {"rank": rank, "world_size": trainer.dist.world_size, "gaps": [], "sync_s": [], "executor": ""}
    engine = trainer.backend.engine.llm_engine
    report["executor"] = type(engine.model_executor).__name__
    report["tp"] = engine.vllm_config.parallel_config.tensor_parallel_size
    report["gaps"].append(as_dict(engine_logprobs(trainer.backend, gathered(trainer.model))))
    live = {"now": 0, "peak": 0}
    track_held_weights(live)
    real_sync = trainer.backend.sync_weights

    def measured_sync(model):
        live["now"] = live["peak"] = 0
        real_sync(model)
        report.setdefault("sync_held_mib", []).append(live["peak"] / 2**20)

    trainer.backend.sync_weights = measured_sync
    for _ in range(2):
        first = trainer.step == 0
        metrics = trainer.train_step()
        if first:
            report["rollout_rows"] = trainer.last_batch.token_rows()
        report["sync_s"].append(metrics["perf/sync_s"])
        plain = gathered(trainer.model)
        report["gaps"].append(as_dict(engine_logprobs(trainer.backend, plain)))
        report.setdefault("weight_sums", []).append(float(sum(p.double().sum() for p in plain.parameters())))
    report["model_mib"] = sum(p.numel() * 4 for p in gathered(trainer.model).parameters()) / 2**20
    trainer.backend.sync_weights = real_sync
    # the negative cases: a third step whose sync leaves layer 1 stale, then a sync with one shard off
    undo = faulty_sync("stale-layer", trainer.model)
    trainer.train_step()
    undo()
    report["faults"] = {"stale-layer": as_dict(engine_logprobs(trainer.backend, gathered(trainer.model)))}
    undo = faulty_sync("shard", trainer.model)
    trainer.backend.sync_weights(trainer.model)
    undo()
    report["faults"]["shard"] = as_dict(engine_logprobs(trainer.backend, gathered(trainer.model)))
    (out / f"rank{rank}.json").write_text(json.dumps(report))
    trainer.dist.barrier()
    os._exit(0)  # skip interpreter teardown of the in-process engines (nothing left to write)
