"""The Table 1 path through vLLM's CPU build (.venv-vllm): `rspo evaluate math|code --backend vllm`
with the smoke preset's settings on a tiny model carrying Qwen3's chat template (thinking on for
math with top-p/top-k sampling and avg@2 on AIME24, off and greedy for code), and the engine
applying top-k: at top-k 1 any temperature samples the greedy tokens."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm", reason="needs vLLM (its CPU build in .venv-vllm: `make test` runs these tests there)")

from test_evaluate_cli import SMOKE, check_table1_results  # noqa: E402
from tiny_moe import make_chat_checkpoint  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    return make_chat_checkpoint(tmp_path_factory.mktemp("chat") / "model", num_heads=1)  # head size 32


def evaluate(family: str, model: Path, out: Path, *extra: str) -> dict:
    """One process per engine (each evaluation starts and frees its own)."""
    cmd = [sys.executable, "-m", "rspo", "evaluate", family, "--preset", str(SMOKE), "--model", str(model)]
    cmd += ["--out", str(out), "--backend", "vllm", "--no-mlflow", "--quiet", *extra]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(out.read_text())


def test_table1_path_through_vllm(chat_model, tmp_path):
    math = evaluate("math", chat_model, tmp_path / "math.json")
    code = evaluate("code", chat_model, tmp_path / "code.json")
    check_table1_results(math, code, "vllm")


def test_the_engine_applies_top_k(chat_model):
    from transformers import AutoTokenizer

    from rspo.chat import resolve_format
    from rspo.prompts import math_item_prompt
    from rspo.rollout.base import Sampling
    from rspo.rollout.vllm import VLLMBackend

    tok = AutoTokenizer.from_pretrained(str(chat_model))
    fmt = resolve_format("math", "chat", True, tok, "eval.math")
    prompts = [math_item_prompt(q, fmt) for q in ("What is 2+3?", "Find x if 2x = 10.")]
    engine = VLLMBackend(None, tok, model_path=str(chat_model), dtype="float32", seed=0)
    try:
        greedy = engine.generate(prompts, 1, Sampling(temperature=0.0, max_new_tokens=12, seed=0))
        one = engine.generate(prompts, 2, Sampling(temperature=2.0, top_k=1, max_new_tokens=12, seed=1))
        free = engine.generate(prompts, 2, Sampling(temperature=2.0, max_new_tokens=12, seed=1))
    finally:
        engine.release()
    assert one.responses == [r for r in greedy.responses for _ in range(2)]
    assert free.responses != one.responses  # temperature 2 without the cut leaves the greedy path
