"""rspo.gpu_memory.rollout_time: the floor of a step's decoding time at the GPU's memory bandwidth,
from the memory plan's KV cache, checked by hand on paper_large_math (8 x H100, one engine at
tensor parallel 8)."""

import json
import math
from dataclasses import replace
from pathlib import Path

from rspo.commands import plan_memory as cli
from rspo.gpu_memory import plan as MP
from rspo.gpu_memory.rollout_time import GPU_SPECS, rollout_time

ROOT = Path(__file__).resolve().parents[1]
MATH = str(ROOT / "configs" / "paper_large_math.yaml")


def math_plan(max_prompt_tokens=None, **rollout):
    plan = MP.plan_preset(MATH, MP.GPUS["h100-80gb"])[0]
    cfg = plan.cfg
    data = replace(cfg.data, max_prompt_tokens=max_prompt_tokens or cfg.data.max_prompt_tokens)
    plan.cfg = replace(cfg, rollout=replace(cfg.rollout, **rollout), data=data)
    return plan


def test_the_floor_is_waves_of_full_length_decoding_reading_weights_and_kv_at_the_bandwidth():
    plan = math_plan()
    m = plan.model
    r = rollout_time(plan, "h100-80gb")
    # 128 prompts x 8 responses, one engine over the job's 8 GPUs
    assert r.sequences == 1024
    kv_token = m.kv_bytes_per_token(2, 8)
    assert kv_token == 48 * 2 * 1 * 128 * 2  # 4 KV heads over 8 GPUs: one head each (replicated)
    share = 0.3 * 79.19 * MP.GIB
    tokens = (share - 2 * m.params / 8 - (MP.ENGINE_ACTIVATION_GIB + MP.CUDA_GRAPH_GIB) * MP.GIB) / kv_token
    assert math.isclose(r.kv_tokens, tokens)
    assert r.at_once == int(tokens // (1024 + 8192)) and r.waves == math.ceil(1024 / r.at_once)
    assert r.iterations == r.waves * 8192
    per = 2 * m.params / 8 + r.at_once * (1024 + 4096) * kv_token
    assert math.isclose(r.seconds, r.iterations * per / 3.35e12)
    assert 500 < r.seconds < 800  # about 10 min per step: more than preflight's whole training step
    assert "at least" in r.line() and f"{r.waves} waves" in r.line()
    # a faster memory decodes faster; an hf rollout (in the trainer) or an unnamed GPU gets no floor
    assert rollout_time(plan, "h200-141gb").seconds < r.seconds
    assert (
        rollout_time(plan, "40gib") is None
        and rollout_time(math_plan(backend="hf", tensor_parallel_size=1, vllm_sleep=False), "h100-80gb") is None
    )
    assert set(GPU_SPECS) == set(MP.GPUS)


def test_an_engine_that_holds_no_full_sequence_has_no_floor_and_says_so():
    r = rollout_time(math_plan(vllm_gpu_memory_utilization=0.1), "h100-80gb")
    assert r.at_once == 0 and math.isinf(r.seconds) and "cannot hold one full sequence" in r.line()


def test_a_wave_is_capped_at_vllms_max_num_seqs():
    plan = math_plan(max_prompt_tokens=64, max_new_tokens=64)
    r = rollout_time(plan, "a100-80gb")
    assert r.at_once == GPU_SPECS["a100-80gb"].max_num_seqs == 256 and r.waves == 4


def test_plan_memory_prints_the_floor_and_puts_it_in_its_json(capsys):
    assert cli.main(["--preset", MATH, "--gpu", "h100-80gb"]) == 0
    out = capsys.readouterr().out.splitlines()
    floor = json.loads(out[-1])["rollout_s_floor"]
    assert set(floor) == {"math"} and floor["math"] == round(rollout_time(math_plan(), "h100-80gb").seconds, 1)
    assert sum("rollout: at least" in line for line in out) == 1
