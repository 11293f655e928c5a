"""rspo.gpu_memory.plan: a per-phase plan of the whole training step, in the trainer's order, and a
JSON line for every preset and GPU; the paper presets fit 8 x H100 80GB with every phase (resume and
sync included) and the memory outside torch's tensors counted; a plan that does not fit names its
phase and what to change; the terms agree with what the trainer allocates (the simulation of the
trainer's own step: tests/test_gpu_memory_simulate.py; the workflow's refusal: tests/test_workflow.py)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rspo.commands import plan_memory as cli
from rspo.gpu_memory import advice as MA
from rspo.gpu_memory import plan as MP
from rspo.gpu_memory import verdict as MV
from rspo.gpu_memory.shape import PlanError, model_shape
from rspo.phase_memory import PHASES
from rspo.preset import Preset

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ["smoke", "small", "paper_small", "paper_large_math", "paper_large_code"]
STEP = [ph for ph in PHASES if ph != "evaluation"]  # a train job's phases, in the order the trainer runs them


@pytest.mark.parametrize("gpu", list(MP.GPUS))
def test_every_preset_gets_a_per_phase_table_and_a_json_line(gpu, capsys):
    for preset in PRESETS:
        assert cli.main(["--preset", str(ROOT / "configs" / f"{preset}.yaml"), "--gpu", gpu]) == 0
        out = capsys.readouterr().out
        line = json.loads(out.strip().splitlines()[-1])
        assert {"preset", "gpu", "fits", "peak_gib", "peak_phase", "limit_gib", "phases"} <= set(line)
        assert line["preset"] == preset and line["gpu"] == gpu
        assert line["limit_gib"] == pytest.approx(MP.GPUS[gpu])  # the allowances are lines of their own now
        assert list(line["phases"])[: len(STEP)] == STEP  # every phase, in the trainer's order
        for phase in STEP:
            assert f"-- {phase}:" in out, (preset, phase)
        assert "fp32 parameter shards" in out and "B x" in out and "CUDA context" in out  # terms with formulas


def test_the_paper_presets_fit_eight_h100s_and_say_where_they_peak():
    for preset in ("paper_small", "paper_large_math", "paper_large_code"):
        plans = MP.plan_preset(str(ROOT / "configs" / f"{preset}.yaml"), MP.GPUS["h100-80gb"])
        s = MV.summary(preset, "h100-80gb", plans)
        assert s["fits"], (preset, s)
        assert s["peak_gib"] <= s["limit_gib"] and s["engine"] == "ok" and s["host"] == "ok"
    math = MP.plan_preset(str(ROOT / "configs" / "paper_large_math.yaml"), MP.GPUS["h100-80gb"])[0]
    assert math.model.params == pytest.approx(30.53e9, rel=1e-3)  # Qwen3-30B-A3B: 30.5B published


def test_the_paper_step_holds_no_gradient_beside_the_engine_and_counts_what_torch_does_not():
    """paper_large_math on an H100: gradients live from the first backward of a mini-batch through its
    optimizer step, and in the resume; the sync holds the engine's weights alone plus one gathered layer,
    the KV cache wakes after it; every phase carries the CUDA context, the NCCL communicators counted from
    the code (FSDP2's, vLLM's tensor-parallel pynccl and device group, its expert-parallel pynccl) and the
    fragmentation allowance; the engine's CUDA graphs count while it is awake."""
    plan = MP.plan_preset(str(ROOT / "configs" / "paper_large_math.yaml"), MP.GPUS["h100-80gb"])[0]
    terms = {ph.name: {t.name: t for t in ph.terms} for ph in plan.phases}
    gib = {ph.name: ph.total / MP.GIB for ph in plan.phases}
    with_grads = {n for n, t in terms.items() if "fp32 gradient shards" in t}
    assert with_grads == {"resume", "update", "optimizer_step"}
    assert "vLLM engine weights (awake)" in terms["sync"] and "a gathered layer (sync)" in terms["sync"]
    assert "vLLM engine (reserved)" not in terms["sync"] and "vLLM engine (reserved)" in terms["kv_wake"]
    assert "vLLM engine (asleep)" in terms["old_pass"] and "vLLM engine (asleep)" in terms["update"]
    assert not any(t.startswith("vLLM") for t in terms["resume"])  # the checkpoint is read before the engine
    assert len(MP.nccl_communicators(8, 8, True)) == 4 and len(MP.nccl_communicators(1, 1, False)) == 0
    for name, t in terms.items():
        assert "CUDA context" in t and "allocator fragmentation" in t, name
        comms = {"resume": 1, "evaluation": 2}.get(name, 4)  # before the engine: FSDP2's; an evaluation: vLLM's
        assert t["NCCL communicators"].bytes == comms * MP.NCCL_COMM_GIB * MP.GIB, name
    # vLLM 0.32's graphs: inside the engine's share while it is awake, in host memory while it sleeps,
    # back on the GPU beside the weights alone at the sync (every non-deferrable tag wakes with them)
    assert terms["rollout"]["vLLM CUDA graph pool (in the engine's share)"].bytes == 0
    assert terms["evaluation"]["vLLM CUDA graph pool (in the engine's share)"].bytes == 0
    assert terms["update"]["vLLM CUDA graph pool (offloaded)"].bytes == 0
    assert terms["sync"]["vLLM CUDA graph pool (woken with the weights)"].bytes == MP.CUDA_GRAPH_GIB * MP.GIB
    # ... and while it sleeps, vLLM's pinned host copies of its runtime and graph tags, every rank of the node
    host = {ph.name: {t.name: t.bytes for t in ph.host} for ph in plan.phases}
    asleep = {n for n, t in host.items() if "vLLM's sleep copies (node)" in t}
    assert asleep == {"old_pass", "update", "optimizer_step"}
    assert host["update"]["vLLM's sleep copies (node)"] == 8 * MP.SLEEP_HOST_COPY_GIB * MP.GIB
    # a gathered layer streams at the engine's first load (its whole share held) and in the final save
    layer = terms["sync"]["a gathered layer (sync)"].bytes
    assert terms["engine_start"]["a gathered layer (the engine's first load)"].bytes == layer > 0
    assert terms["checkpoint_save"]["a gathered layer (the final checkpoint)"].bytes == layer
    assert "a gathered layer (the engine's first load)" not in terms["rollout"]
    # the GPU's size is CUDA's (what vLLM's share is a fraction of), not nvidia-smi's 79.65 GiB
    assert MP.GPUS["h100-80gb"] == 79.19
    assert terms["rollout"]["vLLM engine (reserved)"].bytes == 0.3 * 79.19 * MP.GIB
    # the faults this plan now sees: gradients through the KV wake, the checkpoint read beside an awake engine
    grads = terms["update"]["fp32 gradient shards"].bytes / MP.GIB
    engine = terms["rollout"]["vLLM engine (reserved)"].bytes / MP.GIB
    assert gib["kv_wake"] + grads > MP.GPUS["h100-80gb"] and gib["resume"] + engine > MP.GPUS["h100-80gb"]


def test_a_plan_that_does_not_fit_names_the_phase_and_the_settings(tmp_path):
    import yaml

    preset = yaml.safe_load((ROOT / "configs" / "paper_large_math.yaml").read_text())
    preset["rl"]["rollout"]["tensor_parallel_size"] = 1
    del preset["rl"]["schedule"]["max_tokens_per_micro_batch"]
    path = tmp_path / "oversized.yaml"
    path.write_text(yaml.safe_dump(preset))
    plans = MP.plan_preset(str(path), MP.GPUS["h100-80gb"])
    s = MV.summary("oversized", "h100-80gb", plans)
    assert not s["fits"] and s["peak_phase"] == "update" and s["peak_gib"] > 400
    assert "weights 56.9 at tensor parallel 1" in s["engine"]
    assert "`rspo plan-memory` ranks the settings" in MV.advice(s)  # the workflow's message points there
    # each setting not at its limit, planned alone: a token budget of one row and a wider engine help
    s["advice"] = MA.rank(str(path), MP.GPUS["h100-80gb"], "results/hub", [], 0, plans)
    labels = [c["set"] for c in s["advice"]["changes"]]
    saved = [c["saved_gib"] for c in s["advice"]["changes"]]
    assert "schedule.max_tokens_per_micro_batch=9216" in labels  # (a wider engine lowers no phase's peak here)
    assert saved == sorted(saved, reverse=True) and min(saved) > 0
    assert "schedule.max_tokens_per_micro_batch=9216 (-" in MV.advice(s)
    r = subprocess.run(
        [sys.executable, "-m", "rspo", "plan-memory", "--preset", str(path), "--gpu", "nope"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "unknown GPU 'nope'" in r.stderr


def test_the_command_says_its_verdict_first_and_exits_1_when_a_preset_does_not_fit(capsys):
    """paper_large_math on a 40 GiB card: 'does not fit', by how much, the ranked advice and the
    host memory per node, first and again under the terms (the budget line above it); exit 1; the
    JSON line stays last."""
    preset = str(ROOT / "configs" / "paper_large_math.yaml")
    assert cli.main(["--preset", preset, "--gpu-gib", "40"]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    first = lines[0]
    assert first.startswith("does not fit (35.9 GiB over): the update phase of task math needs 75.9 GiB per GPU")
    assert "model.cpu_offload=true (-" in first and "host memory per node: 455.0 of 878.9 GiB" in first
    assert lines[-2] == first and json.loads(lines[-1])["fits"] is False
    assert lines[-3].startswith("budget: 12 runs x 8 GPUs")
    assert cli.main(["--preset", preset, "--gpu", "h100-80gb"]) == 0
    fits = capsys.readouterr().out.splitlines()[0]
    assert fits.startswith("fits: the peak is the evaluation phase of task math, 76.31 of 79.19 GiB per GPU")


def test_a_hub_model_without_a_config_is_a_clear_error(tmp_path):
    with pytest.raises(PlanError, match="no config.json for someone/unknown-moe: fetch the model first"):
        model_shape("someone/unknown-moe", Preset({}), "math", str(tmp_path))


def test_a_hub_models_shape_is_kept_on_disk_and_rebuilt_when_unreadable(tmp_path, monkeypatch):
    """The shape of a config.json is built once (transformers on the meta device) and read back by
    the next Snakemake start; a broken cache file is built again; another config is another entry."""
    from rspo.gpu_memory import shape as S

    monkeypatch.setenv("RSPO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(S, "_SHAPES", {})
    built = S.model_shape("Qwen/Qwen3-30B-A3B", Preset({}), "math", str(tmp_path / "hub"))
    (entry,) = (tmp_path / "cache" / "model_shapes").glob("*.json")

    def no_build(*args):
        raise AssertionError("built again although the shape is on disk")

    monkeypatch.setattr(S, "_SHAPES", {})
    monkeypatch.setattr(S, "shape_from_config", no_build)
    assert S.model_shape("Qwen/Qwen3-30B-A3B", Preset({}), "math", str(tmp_path / "hub")) == built
    entry.write_text("{not json")
    with pytest.raises(AssertionError, match="built again"):
        S.model_shape("Qwen/Qwen3-30B-A3B", Preset({}), "math", str(tmp_path / "hub"))
    monkeypatch.undo()
    monkeypatch.setenv("RSPO_CACHE_DIR", str(tmp_path / "cache"))
    assert S.model_shape("Qwen/Qwen3-30B-A3B", Preset({}), "math", str(tmp_path / "hub")) == built  # rebuilt, rewritten
    assert json.loads(entry.read_text())["params"] == built.params and built.params > 30e9


def test_the_terms_are_what_the_trainer_allocates():
    """The old-router cache the plan counts per rank is the RowCache the trainer allocates, and the
    state shards are 4 / 8 bytes per parameter over the ranks."""
    from rspo.config import load_preset
    from rspo.grid import load_train_config
    from rspo.train.row_cache import RowCache

    preset_file = ROOT / "configs" / "small.yaml"
    preset = load_preset(preset_file)
    cfg = load_train_config(preset_file, "gmpo-rs0.8-s0")
    shape = model_shape("", Preset(preset), "countdown")
    plan = MP.plan_run(cfg, shape, MP.preset_setup(preset, 80.0), "countdown")
    rows = cfg.schedule.prompts_per_step * cfg.rollout.group_size
    width = cfg.data.max_prompt_tokens + cfg.rollout.max_new_tokens
    cache = RowCache.zeros(
        torch.arange(rows), rows, width, shape.moe_layers, shape.top_k, shape.experts, keep_logits=False
    )
    terms = {t.name: t.bytes for t in plan.phase("old_pass").host}
    assert terms["old-router caches (node)"] == cache.nbytes
    state = {t.name: t.bytes for t in plan.phase("rollout").terms}
    assert state["fp32 parameter shards"] == 4 * shape.params and state["Adam moments (fp32)"] == 8 * shape.params


def test_plan_memory_at_40_gib_suggests_no_setting_at_its_limit_and_names_what_fits():
    """paper_large_math on a 40 GiB card: the preset already checkpoints, chunks the logits, puts the
    engine to sleep, spreads it over the node's 8 GPUs and runs one row per micro-batch, so the advice
    names none of those; CPU offload alone leaves the host short, 16 GPUs alone the GPU: only the two
    together fit, and the advice says so. `--set` and `--gpus` try that without editing the preset."""
    preset = str(ROOT / "configs" / "paper_large_math.yaml")

    def run(*extra):
        r = subprocess.run(
            [sys.executable, "-m", "rspo", "plan-memory", "--preset", preset, "--gpu-gib", "40", *extra],
            capture_output=True,
            text=True,
        )
        return r.returncode, r.stdout.splitlines()[0], json.loads(r.stdout.strip().splitlines()[-1])

    rc, first, s = run()
    assert rc == 1 and not s["fits"]
    labels = [c["set"] for c in s["advice"]["changes"]]
    at_limit = ("gradient_checkpointing", "logits_chunk_tokens", "vllm_sleep", "tensor_parallel_size")
    assert not any(k in label for label in labels for k in (*at_limit, "max_tokens_per_micro_batch")), labels
    assert labels[0] == "model.cpu_offload=true" and labels[1].startswith("16 GPUs (2 nodes")
    assert not any(c["fits"] for c in s["advice"]["changes"]) and s["advice"]["together"]["fits"]
    assert s["advice"]["only"] and "only CPU offload or more GPUs can make it fit" in first
    rc, first, s = run("--set", "model.cpu_offload=true", "--gpus", "16")
    assert rc == 0 and s["fits"] and first.startswith("fits:"), first


def test_the_budget_line_counts_runs_gpus_hours_and_disk():
    """plan-memory's budget: 12 RL runs of 8 GPUs for paper_large_math, at least the rollout's decoding
    floor times the steps per run on an H100, and the disk of the checkpoints each keeps (fp32 weights
    and Adam's two moments: 12 B per parameter) and its final model."""
    from rspo.gpu_memory.budget import budget, budget_line
    from rspo.gpu_memory.rollout_time import rollout_time

    preset = str(ROOT / "configs" / "paper_large_math.yaml")
    plans = MP.plan_preset(preset, MP.GPUS["h100-80gb"])
    b = budget(preset, plans, gpu="h100-80gb")
    p = plans[0]
    floor_h = rollout_time(p, "h100-80gb").seconds * p.cfg.schedule.total_steps / 3600
    assert (b["runs"], b["gpus_per_run"], b["job_h"]) == (12, 8, 72.0)
    assert b["run_h_floor"] == {"math": round(floor_h, 1)} and b["gpu_hours_floor"] == round(12 * 8 * floor_h)
    disk = 12 * p.model.params * (12 * p.cfg.schedule.keep_checkpoints + p.model.ckpt_bytes) / MP.GIB
    assert b["disk_gib"] == round(disk) and b["host_gib_per_node"] == round(max(pl.host_peak for pl in plans) / MP.GIB)
    assert budget_line(b).startswith("budget: 12 runs x 8 GPUs, math at least ")
    assert budget(preset, plans, gpus=16)["gpus_per_run"] == 16
