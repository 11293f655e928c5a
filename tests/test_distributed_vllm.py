"""Data parallel with engines: 2 gloo processes under torchrun, every rank builds its own vLLM
engine (external_launcher executor inside the training process group), runs 2 Trainer steps, and
after each sync its engine's log-probs equal the gathered training model's (tests/vllm_checks.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
pytest.importorskip("vllm", reason="needs vLLM (its CPU build in .venv-vllm: `make test` runs these tests there)")

from tiny_moe import make_tiny_moe, make_train_assets  # noqa: E402
from vllm_checks import TOL  # noqa: E402

from rspo.tokenizer import build_tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_two_ranks_each_with_an_engine_stay_in_sync(tmp_path):
    tok = build_tokenizer()
    model = make_tiny_moe("qwen2_moe", num_experts=4, top_k=1, num_layers=2, hidden=128, vocab=len(tok))
    assets = make_train_assets(tmp_path / "assets", model=model)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += [str(ROOT / "tests" / "vllm_dist_worker.py"), str(assets), str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for rep in reports:
        print(f"rank {rep['rank']}: executor {rep['executor']}, max |dlogp| {rep['gaps']}, sync s {rep['sync_s']}")
        assert rep["world_size"] == 2 and rep["executor"] == "ExecutorWithExternalLauncher"
        assert len(rep["gaps"]) == 3 and max(rep["gaps"]) < TOL, rep
    # both ranks gathered the same model after each step (FSDP2 kept them one model)
    assert reports[0]["weight_sums"] == reports[1]["weight_sums"]
    assert reports[0]["weight_sums"][0] != reports[0]["weight_sums"][1]  # and it moved
