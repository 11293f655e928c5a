"""`rspo train` with rl.rollout.backend=vllm and `evaluate countdown` with the vLLM generator,
from the smoke preset through Snakemake (a copy of the preset with the vllm backend and a head
size the CPU attention kernels serve), with the train job killed after a checkpoint and resumed by
the same Snakemake command: the resumed run rebuilds its engine, syncs it from the checkpoint and
ends with the metrics of an uninterrupted `rspo train` of the same run."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
pytest.importorskip("vllm", reason="needs vLLM (its CPU build in .venv-vllm: `make test` runs these tests there)")

from test_workflow import make_workspace, snakemake  # noqa: E402

from rspo.progress import parse_line  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RUN = "gmpo-rs0.8-s0"


def vllm_smoke_preset(ws: Path) -> str:
    """configs/smoke_vllm.yaml in the workspace: the smoke preset with backend vllm, 3 RL steps,
    and one attention head (head size 32: the CPU kernels do not serve the smoke model's 16)."""
    preset = yaml.safe_load((ROOT / "configs" / "smoke.yaml").read_text())
    preset["preset"] = "smoke_vllm"
    preset["mlflow"]["experiment"] = "rspo-smoke-vllm"
    preset["pretrain"]["model"].update(num_heads=1, num_kv_heads=1)
    preset["rl"]["rollout"]["backend"] = "vllm"
    preset["rl"]["schedule"].update(total_steps=3, ckpt_every=1, keep_checkpoints=3)
    (ws / "configs" / "smoke_vllm.yaml").write_text(yaml.safe_dump(preset, sort_keys=False))
    return "smoke_vllm"


def steps_in(log: Path) -> list[int]:
    rows = [parse_line(x) for x in log.read_text().splitlines()]
    return [r["step"] for r in rows if r is not None and r["label"] == f"train {RUN}"]


def test_train_and_evaluate_with_vllm_through_snakemake_with_a_kill(tmp_path):
    (tmp_path / "ws").mkdir()
    ws = make_workspace(tmp_path / "ws")
    name = vllm_smoke_preset(ws)
    res = ws / "results" / name
    target = f"results/{name}/eval/{RUN}/countdown.json"
    ckpts = res / "runs" / RUN / "checkpoints"
    # 1. start, kill everything (Snakemake and the train job) once the first checkpoint exists
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "snakemake", "--cores", "1", target, "--config", f"preset={name}"],
        cwd=ws,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.time() + 900
    try:
        while not (ckpts / "step_000001" / "manifest.json").is_file():
            assert proc.poll() is None, "snakemake ended before the first checkpoint"
            assert time.time() < deadline, "no checkpoint after 15 minutes"
            time.sleep(0.5)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    done = sorted(p.name for p in ckpts.glob("step_*") if (p / "manifest.json").is_file())
    last = int(done[-1].split("_")[1])
    assert last < 3 and not (res / "runs" / RUN / "final.json").exists()
    # 2. the same command again (after Snakemake's own unlock) resumes and finishes, then evaluates
    assert snakemake(ws, "--unlock", target, "--config", f"preset={name}").returncode == 0
    r = snakemake(ws, "--cores", "1", "--rerun-incomplete", target, "--config", f"preset={name}", timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    log = res / "logs" / "train" / f"{RUN}.log"
    assert "CPUUnquantizedExperts" in log.read_text()  # the rollouts ran on a vLLM CPU engine
    resumed_steps = [s for s in steps_in(log) if s > 0]
    assert resumed_steps and min(resumed_steps) == last + 1 and max(resumed_steps) == 3, resumed_steps
    final = json.loads((res / "runs" / RUN / "final.json").read_text())
    assert final["steps"] == 3
    metrics = [json.loads(x) for x in (res / "runs" / RUN / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert [m["step"] for m in metrics if "critic/score/mean" in m] == [1, 2, 3]
    assert all(m["perf/sync_s"] > 0 for m in metrics if "perf/sync_s" in m)
    ev = json.loads((ws / target).read_text())
    assert ev["splits"]["val"]["n"] == 16 and 0.0 <= ev["splits"]["val"]["accuracy"] <= 1.0
    assert "CPUUnquantizedExperts" in (res / "logs" / "eval" / f"{RUN}.countdown.log").read_text()
    # 3. an uninterrupted run of the same job gives the same per-step metrics
    ref = tmp_path / "ref"
    data = res / "data" / "countdown"
    cmd = [sys.executable, "-m", "rspo", "train", "--preset", f"configs/{name}.yaml", "--run-name", RUN]
    cmd += ["--base-model", str(res / "models" / "base"), "--train-data", str(data / "train.jsonl")]
    cmd += ["--val", f"val={data / 'val.jsonl'}", "--val", f"val_target={data / 'val_target.jsonl'}"]
    cmd += ["--out", str(ref), "--threads", "1", "--no-mlflow", "--quiet"]
    p = subprocess.run(cmd, cwd=ws, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-4000:]
    ref_metrics = [json.loads(x) for x in (ref / "metrics.jsonl").read_text().splitlines() if x.strip()]
    keys = ("critic/score/mean", "val/val/score", "val/val_target/score", "response_length/mean", "actor/ppo_kl")
    for a, b in zip(metrics, ref_metrics, strict=True):
        assert a["step"] == b["step"]
        for k in keys:
            if k in a or k in b:
                assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-6), (a["step"], k)
