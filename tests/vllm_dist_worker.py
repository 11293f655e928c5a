"""Under torchrun (2 gloo processes): a Trainer with rollout.backend=vllm runs 2 steps; after each
step's sync every rank compares its own engine's log-probs with the gathered (full) training model
and writes what it measured to OUT/rank<r>.json. Used by tests/test_distributed_vllm.py."""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from vllm_checks import digit_task, engine_logprob_gap, train_cfg  # noqa: E402

from rspo.train.trainer import Trainer  # noqa: E402


def gathered(model):
    from transformers import AutoModelForCausalLM

    from rspo.distributed import full_tensor

    sd = {k: full_tensor(v.detach()).cpu() for k, v in model.state_dict().items()}  # collective, every rank
    plain = AutoModelForCausalLM.from_config(model.config, dtype=torch.float32)
    plain.load_state_dict(sd, strict=True)
    return plain.eval()


if __name__ == "__main__":
    assets, out = Path(sys.argv[1]), Path(sys.argv[2])
    trainer = Trainer(train_cfg(assets, prompts_per_step=4), out / "run", quiet=True, task=digit_task())
    rank = trainer.dist.rank
    report = {"rank": rank, "world_size": trainer.dist.world_size, "gaps": [], "sync_s": [], "executor": ""}
    engine = trainer.backend.engine.llm_engine
    report["executor"] = type(engine.model_executor).__name__
    report["gaps"].append(engine_logprob_gap(trainer.backend, gathered(trainer.model)))
    for _ in range(2):
        metrics = trainer.train_step()
        trainer.step += 1
        report["sync_s"].append(metrics["perf/sync_s"])
        plain = gathered(trainer.model)
        report["gaps"].append(engine_logprob_gap(trainer.backend, plain))
        report.setdefault("weight_sums", []).append(float(sum(p.double().sum() for p in plain.parameters())))
    (out / f"rank{rank}.json").write_text(json.dumps(report))
    trainer.dist.barrier()
    os._exit(0)  # skip interpreter teardown of the in-process engines (nothing left to write)
