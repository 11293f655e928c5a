"""rspo.train: end-to-end smoke runs of every algorithm x RS x routing mode on a tiny model,
on-policy neutrality, resume equivalence, non-finite handling, config errors, MLflow logging."""

import dataclasses
import hashlib
import json
import math
from pathlib import Path

import pytest
import torch
from dist_runs import MEASURED, assert_weights_close
from tiny_moe import make_train_assets, train_args

from rspo.config import TrainConfig, train_config_from_dict
from rspo.tasks import Task, get_task
from rspo.train.trainer import RunFolderMismatch, TooManyNonFinite, Trainer


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_train_assets(tmp_path_factory.mktemp("train_assets"))


def digit_task() -> Task:
    """Countdown prompts with a dense test reward (share of digit characters), so that a random
    tiny model gets advantages with variance and the parameters must move."""
    base = get_task("countdown")

    def score_batch(completions, records, workers):
        return [(sum(ch.isdigit() for ch in c) / max(1, len(c)), "digits") for c in completions]

    return Task("countdown-digits", base.load, base.prompt, score_batch)


def make_cfg(assets: Path, **algo) -> TrainConfig:
    rl = {
        "model": {"path": str(assets / "base"), "threads": 1},
        "data": {
            "task": "countdown",
            "train_path": str(assets / "data" / "train.jsonl"),
            "val_paths": {"val": str(assets / "data" / "val.jsonl")},
        },
        "rollout": {"group_size": 4, "max_new_tokens": 8, "temperature": 1.0},
        "algorithm": {"algo": "gmpo", **algo},
        "optim": {"lr": 3e-2},
        "schedule": {
            "total_steps": 2,
            "prompts_per_step": 4,
            "mini_batch_prompts": 2,
            "val_every": 2,
            "val_size": 4,
            "ckpt_every": 1,
        },
    }
    return train_config_from_dict(rl, seed=0, run_name="test")


def weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def read_metrics(out: Path) -> list[dict]:
    return [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines() if ln.strip()]


CASES = [
    dict(algo="grpo"),
    dict(algo="grpo", router_shift=True),
    dict(algo="gspo"),
    dict(algo="gspo", router_shift=True),
    dict(algo="gmpo"),
    dict(algo="gmpo", router_shift=True),
    dict(algo="gmpo", router_shift=True, stop_gradient=False),
    dict(algo="gmpo", routing="freeze"),
    dict(algo="gmpo", routing="logit_replay"),
    dict(algo="gmpo", routing="index_replay"),
]


@pytest.mark.parametrize("algo", CASES, ids=lambda a: "-".join(f"{v}" for v in a.values()))
def test_smoke_run_every_algorithm_and_mode(assets, tmp_path, algo):
    cfg = make_cfg(assets, **algo)
    out = tmp_path / "run"
    final = Trainer(cfg, out, task=digit_task()).run()
    rows = read_metrics(out)
    train_rows = [r for r in rows if "critic/score/mean" in r]
    assert [r["step"] for r in train_rows] == [1, 2]
    for r in train_rows:
        for key in (
            "critic/score/mean",
            "actor/ppo_kl",
            "actor/pg_clipfrac",
            "actor/pg_loss",
            "actor/entropy",
            "actor/grad_norm",
            "router/shift_ratio_mean",
            "router/shift_clipfrac",
            "response_length/mean",
            "perf/step_s",
            "perf/tokens_per_s",
        ):
            assert key in r and math.isfinite(r[key]), key
        # the first mini-batch of a step is on-policy: every ratio is 1 and gamma is exactly 1
        assert r["router/onpolicy_shift_ratio_mean"] == 1.0
        assert r["actor/onpolicy_ppo_kl"] == 0.0
        assert r["actor/skipped_updates"] == 0.0
    # the second mini-batch is off-policy: the router moved (all modes: freeze keeps the router
    # weights but not its input hidden states), so gamma < 1 on average over the step
    assert any(r["router/shift_ratio_mean"] < 1.0 for r in train_rows)
    assert "val/val/score" in rows[0] and rows[0]["step"] == 0
    before, after = weights(assets / "base"), weights(out / "final")
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert changed, "no parameter changed"
    gate_keys = [k for k in before if k.endswith("mlp.gate.weight")]
    router_changed = any(not torch.equal(before[k], after[k]) for k in gate_keys)
    if algo.get("routing") in ("freeze", "logit_replay"):
        assert not router_changed, "the router must not learn under freeze / logit replay"
    else:
        assert router_changed
    assert (out / "final.json").is_file() and final["steps"] == 2
    info = json.loads((out / "run.json").read_text())
    assert info["algo"] == algo["algo"] and info["routing"] == algo.get("routing", "none")


def _strip_perf(rows):
    return [{k: v for k, v in r.items() if not k.startswith(MEASURED)} for r in rows]


def test_resume_after_kill_equals_uninterrupted_run(assets, tmp_path, monkeypatch):
    cfg = dataclasses.replace(
        make_cfg(assets, algo="gmpo", router_shift=True),
        schedule=dataclasses.replace(make_cfg(assets).schedule, total_steps=3),
    )
    ref = tmp_path / "ref"
    Trainer(cfg, ref, task=digit_task()).run()

    killed = tmp_path / "killed"
    trainer = Trainer(cfg, killed, task=digit_task())
    real_step = Trainer.train_step

    def dying_step(self):
        if self.step == 2:
            raise KeyboardInterrupt("killed")
        return real_step(self)

    monkeypatch.setattr(Trainer, "train_step", dying_step)
    with pytest.raises(KeyboardInterrupt):
        trainer.run()
    monkeypatch.setattr(Trainer, "train_step", real_step)
    assert not (killed / "final.json").exists()
    assert (killed / "checkpoints").is_dir()
    Trainer(cfg, killed, task=digit_task()).run()  # the same command again resumes
    a, b = _strip_perf(read_metrics(ref)), _strip_perf(read_metrics(killed))
    assert [r["step"] for r in b] == [r["step"] for r in a]
    for ra, rb in zip(a, b):
        assert ra.keys() == rb.keys()
        for k in ra:
            assert ra[k] == pytest.approx(rb[k], rel=1e-5, abs=1e-7), (ra["step"], k)
    wa, wb = weights(ref / "final"), weights(killed / "final")
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-5, atol=1e-6)


def test_run_folder_of_another_config_is_refused(assets, tmp_path):
    out = tmp_path / "run"
    Trainer(make_cfg(assets, algo="grpo"), out, task=digit_task()).run()
    with pytest.raises(RunFolderMismatch, match="another config"):
        Trainer(make_cfg(assets, algo="gspo"), out, task=digit_task()).run()


def test_nonfinite_updates_are_skipped_then_the_run_stops(assets, tmp_path, monkeypatch):
    import rspo.train.update as update

    real = update.compute_policy_loss

    def nan_loss(*args, **kwargs):
        loss, m = real(*args, **kwargs)
        return loss * float("nan"), m

    monkeypatch.setattr(update, "compute_policy_loss", nan_loss)
    cfg = make_cfg(assets, algo="gmpo")
    cfg = dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, max_nonfinite_in_row=3))
    with pytest.raises(TooManyNonFinite, match="3 updates in a row"):
        Trainer(cfg, tmp_path / "run", task=digit_task()).run()


def test_bad_base_model_is_a_clear_error(assets, tmp_path):
    cfg = make_cfg(assets)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path=str(tmp_path / "missing")))
    with pytest.raises(FileNotFoundError, match="missing"):
        Trainer(cfg, tmp_path / "run", task=digit_task())


def test_cli_config_errors_name_the_key(assets, tmp_path, capsys):
    from rspo.commands.train import main

    root = Path(__file__).resolve().parents[1]
    rc = main(
        [
            "--preset",
            str(root / "configs" / "smoke.yaml"),
            "--out",
            str(tmp_path / "r"),
            "--set",
            "algorithm.gamma_min=1.5",
            "--no-mlflow",
        ]
    )
    assert rc == 2
    assert "rl.algorithm.gamma_min" in capsys.readouterr().err
    for spelling in (["--run-name", "nope-s0"], ["--run", "nope-s0"], ["--run=nope-s0"]):
        rc = main(
            ["--preset", str(root / "configs" / "smoke.yaml"), *spelling, "--out", str(tmp_path / "r"), "--no-mlflow"]
        )
        assert rc == 2
        err = capsys.readouterr().err
        assert "nope-s0" in err  # the earlier spelling --run still names the run, with a message
        assert ("--run is now --run-name" in err) == (spelling[0] != "--run-name"), err
    assert not (tmp_path / "r").exists()


def test_cli_run_logs_to_mlflow(assets, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    from rspo.commands.train import main

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "gmpo-rs0.8-s0"
    sets = ("schedule.total_steps=1", "rollout.max_new_tokens=6")
    rc = main(train_args(assets, out, root / "configs" / "smoke.yaml", *sets, run="gmpo-rs0.8-s0"))
    assert rc == 0
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("rspo-smoke")
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.info.run_name == "gmpo-rs0.8-s0" and run.info.status == "FINISHED"
    assert run.data.params["algorithm/router_shift"] == "True"
    assert run.data.tags["algo"] == "gmpo" and run.data.tags["git_commit"]
    for key in ("critic/score/mean", "actor/ppo_kl", "router/shift_ratio_mean", "val/val/score"):
        assert key in run.data.metrics
    info = json.loads((out / "run.json").read_text())
    assert info["mlflow_run_id"] == run.info.run_id
    # the UI's Source / Version columns, the Dataset column, and the runs table as the experiment's view
    assert run.data.tags["mlflow.source.name"] == "rspo train" and run.data.tags["mlflow.source.type"] == "LOCAL"
    assert run.data.tags["mlflow.source.git.commit"] == run.data.tags["git_commit"]
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    inputs = {
        (d.dataset.name, {t.key: t.value for t in d.tags}["mlflow.data.context"]): d.dataset
        for d in client.get_run(run.info.run_id).inputs.dataset_inputs
    }
    assert set(inputs) == {("data/train", "training"), ("data/val", "validation")}
    train = assets / "data" / "train.jsonl"
    assert inputs[("data/train", "training")].digest == hashlib.sha256(train.read_bytes()).hexdigest()[:10]
    assert json.loads(inputs[("data/train", "training")].source)["uri"] == str(train.resolve())
    assert json.loads(inputs[("data/train", "training")].profile)["num_rows"] == 64


def test_cli_run_in_a_log_writes_one_parseable_progress_line_per_step(assets, tmp_path, capsys):
    """Not a terminal (pytest captures stderr, as a Snakemake log does): one plain line per step,
    plus the validation before the first step, with the numbers of metrics.jsonl; --quiet: none."""
    from rspo.commands.train import main
    from rspo.progress import parse_line

    preset = Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml"

    def args(out, *sets):
        return [*train_args(assets, out, preset, "rollout.max_new_tokens=6", *sets, run="gmpo-rs0.8-s0"), "--no-mlflow"]

    out = tmp_path / "run"
    assert main(args(out, "schedule.total_steps=3", "schedule.val_every=2")) == 0
    captured = capsys.readouterr()
    rows = [r for r in map(parse_line, captured.err.splitlines()) if r is not None]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert {r["label"] for r in rows} == {"train gmpo-rs0.8-s0"} and {r["total"] for r in rows} == {3}
    logged = {r["step"]: r for r in read_metrics(out)}
    for r in rows:
        m = r["metrics"]
        assert list(m) == ["s/step", "reward", "val", "gamma", "gamma_clip", "ppo_kl", "clipfrac", "entropy"]
        assert (m["val"] is None) == (r["step"] == 1)  # validation at 0, 2 and the last step
        if m["val"] is not None:
            assert m["val"] == pytest.approx(logged[r["step"]]["val/val/score"], abs=1e-4)
        if r["step"] > 0:
            assert r["eta_s"] is not None and r["metrics"]["s/step"] > 0
            assert m["reward"] == pytest.approx(logged[r["step"]]["critic/score/mean"], rel=1e-3, abs=1e-4)
            assert m["gamma"] == pytest.approx(logged[r["step"]]["router/shift_ratio_mean"], rel=1e-3)
            for key in ("gamma_clip", "ppo_kl", "clipfrac", "entropy"):
                assert isinstance(m[key], float), (key, r)
    assert json.loads(captured.out.strip().splitlines()[-1])["steps"] == 3  # stdout keeps the JSON line

    assert main([*args(tmp_path / "quiet", "schedule.total_steps=1"), "--quiet"]) == 0
    assert not [ln for ln in capsys.readouterr().err.splitlines() if parse_line(ln)]


@pytest.mark.parametrize("algo", ["grpo", "gspo", "gmpo"])
def test_the_trainer_learns_a_dense_reward(assets, tmp_path, algo):
    """Sign and alignment check of the whole loop: the share of digit characters, rewarded at
    every step, climbs from ~0.05 to most of the response in 15 steps (a flipped advantage or a
    shifted log-prob would push it down)."""
    cfg = make_cfg(assets, algo=algo, router_shift=True)
    cfg = dataclasses.replace(
        cfg,
        rollout=dataclasses.replace(cfg.rollout, group_size=8, max_new_tokens=12),
        optim=dataclasses.replace(cfg.optim, lr=1e-2, warmup_steps=0),
        schedule=dataclasses.replace(
            cfg.schedule, total_steps=15, prompts_per_step=8, mini_batch_prompts=4, val_every=0, ckpt_every=0
        ),
    )
    Trainer(cfg, tmp_path / "run", task=digit_task()).run()
    scores = [r["critic/score/mean"] for r in read_metrics(tmp_path / "run") if "critic/score/mean" in r]
    first, last = sum(scores[:3]) / 3, sum(scores[-3:]) / 3
    assert first < 0.2 and last > first + 0.4, (algo, [round(s, 3) for s in scores])


def test_onpolicy_shortcut_equals_a_separate_old_pass(assets, tmp_path):
    """The first mini-batch recording its own old values gives the step a separate no-grad old
    pass gives (metrics and weights), for plain and RS runs."""
    for algo in (dict(algo="grpo"), dict(algo="gmpo", router_shift=True)):
        cfg = make_cfg(assets, **algo)
        runs = []
        for shortcut in (True, False):
            tr = Trainer(cfg, tmp_path / f"{shortcut}-{algo['algo']}", task=digit_task())
            assert tr.policy.onpolicy_shortcut  # one process, routing none, no dropout
            tr.policy.onpolicy_shortcut = shortcut
            metrics = [tr.train_step() for tr.step in range(2)]
            runs.append((metrics, {k: v.detach().clone() for k, v in tr.model.state_dict().items()}))
        (ma, wa), (mb, wb) = runs
        for ra, rb in zip(ma, mb):
            for k in ra:
                if not k.startswith(MEASURED):
                    assert ra[k] == pytest.approx(rb[k], rel=1e-5, abs=1e-7), k
        for k in wa:
            torch.testing.assert_close(wa[k], wb[k], rtol=1e-5, atol=1e-6)


def test_model_mode_per_phase_and_special_stops(assets, tmp_path):
    """Rollouts and the old pass run in eval mode, the updates in train mode; every response that
    ended on a special token other than EOS is counted."""
    cfg = make_cfg(assets, algo="gmpo")
    tr = Trainer(cfg, tmp_path / "run", task=digit_task())
    tr.policy.onpolicy_shortcut = False
    seen = []
    handle = tr.model.register_forward_pre_hook(lambda mod, args, kw: seen.append(mod.training), with_kwargs=True)
    calls = {}
    real_generate, real_old = tr.backend.generate, tr.policy._old_pass

    def generate(*a, **kw):
        calls["rollout"] = len(seen)
        return real_generate(*a, **kw)

    def old_pass(*a, **kw):
        calls["old"] = len(seen)
        out = real_old(*a, **kw)
        calls["update"] = len(seen)
        return out

    tr.backend.generate, tr.policy._old_pass = generate, old_pass
    metrics = tr.train_step()
    handle.remove()
    assert not any(seen[calls["rollout"] : calls["update"]])  # rollout and old pass
    assert seen[calls["update"] :] and all(seen[calls["update"] :])  # updates
    assert not tr.model.training
    batch = tr.last_batch
    special = {tr.tokenizer.pad_token_id, tr.tokenizer.bos_token_id, tr.tokenizer.unk_token_id}
    ends = [batch.response_ids[i, int(batch.response_mask[i].sum()) - 1].item() for i in range(len(batch.responses))]
    assert metrics["response/special_stop_frac"] == pytest.approx(sum(e in special for e in ends) / len(ends))


def test_router_lr_multiplier_scales_only_the_router(assets, tmp_path):
    cfg = make_cfg(assets, algo="grpo")
    cfg = dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, router_lr_mult=30.0, warmup_steps=0))
    tr = Trainer(cfg, tmp_path / "run", task=digit_task())
    groups = tr.policy.optimizer.param_groups
    assert len(groups) == 2 and groups[1]["lr"] == pytest.approx(30.0 * groups[0]["lr"])
    gates = {id(p) for n, p in tr.model.named_parameters() if n.endswith("mlp.gate.weight")}
    assert {id(p) for p in groups[1]["params"]} == gates
    assert not gates & {id(p) for p in groups[0]["params"]}


CHECKPOINTING_CASES = [*CASES, dict(algo="gmpo", router_shift=True, router_aux_loss_coef=0.01)]


@pytest.mark.parametrize("algo", CHECKPOINTING_CASES, ids=lambda a: "-".join(f"{v}" for v in a.values()))
def test_gradient_checkpointing_trains_like_the_plain_backward(assets, tmp_path, algo):
    """Two steps with model.gradient_checkpointing on and off give the same metrics (fp32; the
    checkpointed run forwards each row's prompt itself instead of sharing it over the group, so
    values agree to float rounding: rel 1e-4, abs 1e-6) and the same weights. The paper presets
    turn checkpointing on; before the router capture spanned the backward the first update
    raised torch.utils.checkpoint.CheckpointError."""
    cfg = make_cfg(assets, **algo)
    on = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, gradient_checkpointing=True))
    runs = {}
    for name, c in (("plain", cfg), ("checkpointed", on)):
        tr = Trainer(c, tmp_path / name, task=digit_task())
        assert tr.model.model.layers[0].gradient_checkpointing == (name == "checkpointed")
        tr.run()
        runs[name] = _strip_perf(read_metrics(tmp_path / name))
    a, b = runs["plain"], runs["checkpointed"]
    assert [r["step"] for r in a] == [r["step"] for r in b] == [0, 1, 2]
    for ra, rb in zip(a, b):
        assert ra.keys() == rb.keys()
        for k in ra:
            assert rb[k] == pytest.approx(ra[k], rel=1e-4, abs=1e-6), (ra["step"], k)
    if algo.get("router_aux_loss_coef"):
        assert all(r["actor/router_aux_loss"] > 0 for r in b if "critic/score/mean" in r)
    # weights move by ~0.1 at this lr; float noise through Adam (which turns the ~0 gradient of a
    # key bias into lr-sized steps) leaves up to ~1e-4: the 1-vs-2-rank test's tolerance, with its
    # allowance for isolated elements (tests/dist_runs.py, assert_weights_close)
    wa, wb = weights(tmp_path / "plain" / "final"), weights(tmp_path / "checkpointed" / "final")
    assert_weights_close(wb, wa, rtol=1e-3, atol=2e-4)


def test_a_bf16_preset_at_lr_1e_6_moves_nearly_every_weight(assets, tmp_path):
    """bf16 compute over fp32 master weights (rspo.train.precision). One update at the paper
    presets' lr of 1e-6 (an entropy bonus gives every logit row a gradient): with the weights
    themselves in bf16 an Adam step of ~1e-6 is below bf16's spacing at a weight's magnitude:
    2.5% of the elements changed (the code before); with fp32 master weights 99.8% do.
    final/ is written in bf16, the preset's dtype."""
    cfg = make_cfg(assets, algo="gmpo", router_shift=True, entropy_coef=0.01)
    cfg = dataclasses.replace(
        cfg,
        model=dataclasses.replace(cfg.model, dtype="bfloat16"),
        optim=dataclasses.replace(cfg.optim, lr=1e-6),
        schedule=dataclasses.replace(cfg.schedule, total_steps=1, mini_batch_prompts=4, val_every=0, ckpt_every=0),
    )
    tr = Trainer(cfg, tmp_path / "run", task=digit_task())
    before = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
    assert all(p.dtype == torch.float32 for p in before.values())  # master weights
    tr.run()
    moved = total = 0
    for n, p in tr.model.named_parameters():
        if p.numel():
            moved += int((p.detach() != before[n]).sum())
            total += p.numel()
    assert moved / total > 0.9, f"{moved / total:.3f} of the weights moved"
    final = weights(tmp_path / "run" / "final")
    assert {t.dtype for t in final.values()} == {torch.bfloat16}
    rows = read_metrics(tmp_path / "run")
    assert math.isfinite(rows[-1]["actor/pg_loss"]) and rows[-1]["actor/skipped_updates"] == 0.0


def test_cpu_offload_without_torchrun_on_gpus_is_refused(assets, tmp_path):
    cfg = make_cfg(assets)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, cpu_offload=True))
    with pytest.raises(ValueError, match="model.cpu_offload: FSDP2's CPU offload needs torchrun on GPUs"):
        Trainer(cfg, tmp_path / "run", task=digit_task())


def test_tensor_parallel_rollouts_need_vllm(assets):
    from rspo.config import ConfigError

    rl = {"model": {"path": str(assets / "base")}, "rollout": {"tensor_parallel_size": 2}}
    with pytest.raises(ConfigError, match="tensor_parallel_size > 1 and vllm_sleep need backend: vllm"):
        train_config_from_dict(rl, run_name="t")


def test_old_values_from_the_rollout_match_the_old_pass(assets, tmp_path):
    """rollout.old_values=rollout: the log-probs, entropy and router cache the hf backend records while
    it samples are the old pass's on the same rows, to float rounding (the decoding's KV-cache shapes);
    the router cache's experts are the same at every position that predicts a response token."""
    cfg = make_cfg(assets, algo="gmpo", router_shift=True)
    cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, old_values="rollout"))
    tr = Trainer(cfg, tmp_path / "run", task=digit_task())
    p = tr.policy
    assert p.old_from_rollout and not p.onpolicy_shortcut
    batch, rewards, _ = tr.rollouts.rollout(0, p.device)
    adv = torch.zeros(len(rewards))
    st = p.old_pass(batch, adv, 0)
    mbs = p.mini_batches(0, 0)
    tokens = st.row_tokens
    old_logp, entropy, cache = p._old_pass(batch, mbs, mbs, tokens)
    mask = batch.response_mask.bool()
    assert mask.sum() > 0
    torch.testing.assert_close(st.old_logp[mask], old_logp[mask], rtol=0, atol=1e-4)
    torch.testing.assert_close(st.entropy[mask], entropy[mask], rtol=0, atol=1e-4)
    P, R = batch.prompt_width, mask.shape[1]
    # the position that predicts response token j is P - 1 + j
    pred = torch.zeros(batch.input_ids.shape, dtype=torch.bool)
    pred[:, P - 1 : P - 1 + R] = mask
    rows = torch.arange(len(mask))
    a, b = st.cache[rows], cache[rows]
    for layer in range(a.num_layers):
        assert torch.equal(a.indices[layer][pred].sort(-1).values, b.indices[layer][pred].sort(-1).values)
        # same experts in the same order, log-probs as the cache rounds them (fp16: 2^-10 relative)
        torch.testing.assert_close(a.logp[layer][pred].float(), b.logp[layer][pred].float(), rtol=2e-3, atol=2e-3)
    # a run with it trains, and its first on-policy update sees gamma ~ 1
    tr = Trainer(cfg, tmp_path / "train", task=digit_task())
    metrics = [tr.train_step() for tr.step in range(2)]
    assert all(math.isfinite(v) for m in metrics for v in m.values() if isinstance(v, float))
    for m in metrics:
        assert m["router/onpolicy_shift_ratio_mean"] == pytest.approx(1.0, abs=1e-3)
        assert abs(m["actor/onpolicy_ppo_kl"]) < 1e-5


@pytest.mark.parametrize(
    ("change", "needs"),
    [
        ({"rollout": {"backend": "vllm"}}, "backend hf"),
        ({"rollout": {"dtype": "bfloat16"}}, "backend hf"),
        ({"algorithm": {"routing": "index_replay"}}, "routing none or freeze"),
    ],
)
def test_old_values_from_the_rollout_refused_where_they_are_not_the_old_policy(assets, change, needs):
    from rspo.config import ConfigError

    rl = make_cfg(assets).to_dict()
    rl["rollout"]["old_values"] = "rollout"
    for section, values in change.items():
        rl[section].update(values)
    for key in ("seed", "preset", "run_name"):
        rl.pop(key)
    with pytest.raises(ConfigError, match=f"old_values.*{needs}"):
        train_config_from_dict(rl, seed=0, run_name="test")


def test_router_lr_schedule_steps_and_ramps_by_rollout_step():
    """optim.router_lr_mult_final / router_lr_change: a step function at S, a linear rise between two
    steps; without a schedule the plain multiplier (and the run's fingerprint does not change)."""
    from rspo.config import OptimConfig
    from rspo.train.optim import router_lr_mult_at

    step = OptimConfig(router_lr_mult=1.0, router_lr_mult_final=150.0, router_lr_change=(80, 80))
    assert [router_lr_mult_at(step, t) for t in (0, 79, 80, 229)] == [1.0, 1.0, 150.0, 150.0]
    ramp = OptimConfig(router_lr_mult=1.0, router_lr_mult_final=151.0, router_lr_change=(0, 200))
    assert [router_lr_mult_at(ramp, t) for t in (0, 100, 199, 200, 229)] == [1.0, 76.0, 150.25, 151.0, 151.0]
    assert router_lr_mult_at(OptimConfig(router_lr_mult=30.0), 500) == 30.0


def test_router_lr_schedule_sets_the_router_lr_of_each_step(assets, tmp_path):
    """The trainer gives the router group lr * the step's multiplier before the step's updates (x1 for
    step 0, x30 from step 1), logs it as actor/router_lr_mult (only a scheduled run), leaves the other
    group at lr; the schedule is part of the run's identity (shipped runs keep theirs: test_config)."""
    cfg = make_cfg(assets, algo="grpo")
    optim = dataclasses.replace(cfg.optim, warmup_steps=0, router_lr_mult_final=30.0, router_lr_change=(1, 1))
    cfg = dataclasses.replace(cfg, optim=optim)
    tr = Trainer(cfg, tmp_path / "run", task=digit_task())
    groups = tr.policy.optimizer.param_groups
    seen = []
    step_fn = tr.policy.optimizer.step

    def spy(*a, **k):
        seen.append(groups[1]["lr"] / groups[0]["lr"])
        return step_fn(*a, **k)

    tr.policy.optimizer.step = spy
    m0 = tr.train_step()
    m1 = tr.train_step()
    updates = cfg.schedule.prompts_per_step // cfg.schedule.mini_batch_prompts
    assert seen == pytest.approx([1.0] * updates + [30.0] * updates)
    assert (m0["actor/router_lr_mult"], m1["actor/router_lr_mult"]) == (1.0, 30.0)
    assert groups[0]["lr"] == cfg.optim.lr
    plain = make_cfg(assets, algo="grpo")
    assert "actor/router_lr_mult" not in Trainer(plain, tmp_path / "plain", task=digit_task()).train_step()
    assert (
        cfg.fingerprint()
        != dataclasses.replace(cfg, optim=dataclasses.replace(optim, router_lr_change=(2, 2))).fingerprint()
    )
