"""rspo.integrations.trl: router-shift weighting inside TRL 1.16's GRPOTrainer and GMPOTrainer.

On one batch the plug-in's loss and every parameter gradient equal ``rspo.losses.compute_policy_loss``
with the gamma of ``rspo.router`` computed here independently (old router logits captured before
the weights move, new ones after); unchanged weights give gamma 1 and plain TRL's loss; the old
router data stay matched to their rows through TRL's shuffle and split; gradient checkpointing
changes nothing; 2 gloo processes train and log the router metrics. Needs the ``trl`` extra."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("trl", reason="TRL is the optional `trl` extra (pip install -e '.[trl]'); `make venv` installs it")

from datasets import Dataset  # noqa: E402
from tiny_moe import ARCHS, make_tiny_moe  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402
from trl.experimental.gmpo import GMPOConfig, GMPOTrainer  # noqa: E402

from rspo.integrations.trl import RSGRPOConfig, RSGRPOTrainer, RSPOConfig, RSPOTrainer  # noqa: E402
from rspo.losses import (  # noqa: E402
    compute_policy_loss,
    rollout_correction,
    router_shift_log_weight,
    router_shift_metrics,
)
from rspo.router import OldRouterCache, capture_router_logits, router_shift_ratio, router_spec  # noqa: E402
from rspo.tokenizer import build_tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TOK = build_tokenizer()
# algo of rspo.losses -> (trainer, config, importance_sampling_level, epsilon, epsilon_high)
OBJECTIVES = {
    "grpo": (RSGRPOTrainer, RSGRPOConfig, "token", 0.2, 0.2),
    "gspo": (RSGRPOTrainer, RSGRPOConfig, "sequence", 3e-4, 4e-4),
    "gmpo": (RSPOTrainer, RSPOConfig, "token", 0.4, 0.4),
}
PLAIN = {RSGRPOTrainer: (GRPOTrainer, GRPOConfig), RSPOTrainer: (GMPOTrainer, GMPOConfig)}


def digit_reward(completions, **_):
    return [sum(ch.isdigit() for ch in c) / max(1, len(c)) for c in completions]


def dataset(n: int = 16) -> Dataset:
    return Dataset.from_list([{"prompt": f"{3 + i} {7 + 2 * i} {11 + i} -> {20 + i}:"} for i in range(n)])


def model_for(arch: str, seed: int = 0):
    return make_tiny_moe(arch, num_experts=4, top_k=2, num_layers=2, hidden=32, vocab=len(TOK), seed=seed).train()


def make_trainer(tmp_path, arch="qwen3_moe", algo="gmpo", plain=False, model=None, **overrides):
    trainer_cls, config_cls, level, eps, eps_high = OBJECTIVES[algo]
    if plain:
        trainer_cls, config_cls = PLAIN[trainer_cls]
    kw = dict(
        output_dir=str(tmp_path / "trl"),
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        per_device_train_batch_size=4,
        num_generations=4,
        steps_per_generation=2,
        max_completion_length=6,
        importance_sampling_level=level,
        epsilon=eps,
        epsilon_high=eps_high,
        beta=0.0,
        router_aux_loss_coef=0.0,
        report_to=[],
        disable_tqdm=True,
        save_strategy="no",
        seed=0,
        dataloader_num_workers=0,
    )
    if algo == "gmpo":
        kw.pop("importance_sampling_level")
    else:
        kw["loss_type"] = "grpo"  # rspo.losses' aggregation: token mean per response, then over responses
    kw.update(overrides)
    return trainer_cls(
        model=model if model is not None else model_for(arch),
        reward_funcs=digit_reward,
        args=config_cls(**kw),
        train_dataset=dataset(),
        processing_class=TOK,
    )


def fixed_batch(B: int = 4, P: int = 5, C: int = 6, seed: int = 0) -> dict:
    """Left-padded prompts, right-padded completions of different lengths, advantages of both signs."""
    g = torch.Generator().manual_seed(seed)
    V = len(TOK)
    prompt_ids = torch.randint(3, V, (B, P), generator=g)
    prompt_mask = torch.ones(B, P, dtype=torch.long)
    prompt_mask[0, :2] = 0
    prompt_ids[0, :2] = TOK.pad_token_id
    completion_ids = torch.randint(3, V, (B, C), generator=g)
    completion_mask = torch.ones(B, C, dtype=torch.long)
    for b, length in enumerate((C, C - 2, C - 1, 3)[:B]):
        completion_mask[b, length:] = 0
        completion_ids[b, length:] = TOK.pad_token_id
    advantages = torch.tensor([1.0, -0.5, 0.7, -1.2][:B])
    return dict(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        advantages=advantages,
    )


def old_pass(trainer, batch: dict) -> dict:
    """The batch as the plug-in's ``_generate_and_score_completions`` returns it: old log-probs and
    the old routers, from the plug-in's own old-pass code path."""
    ids, att, C = full_inputs(batch)
    trainer._rs_phase, trainer._rs_old = "old", None
    with torch.no_grad():
        old_logps, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, att, C)
    cache, trainer._rs_old, trainer._rs_phase = trainer._rs_old, None, None
    return dict(
        batch,
        old_per_token_logps=old_logps,
        rs_old_indices=cache.indices.permute(1, 2, 0, 3).contiguous(),
        rs_old_logp=cache.logp.permute(1, 2, 0, 3).contiguous(),
    )


def perturb(model, scale: float = 0.01, seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))


def full_inputs(batch: dict) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Prompt + completion ids and attention mask, and the completion width C."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    att = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    return ids, att, batch["completion_ids"].shape[1]


def our_forward(model, batch: dict, detach: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Our own forward, written here: the completion tokens' log-probs (B, C) and each MoE layer's
    router logits (B, C, E) at the positions that predict them (S - C - 1 .. S - 2)."""
    ids, att, C = full_inputs(batch)
    B, S = ids.shape
    with capture_router_logits(model, detach=detach) as cap:
        logits = model(input_ids=ids, attention_mask=att).logits.float()
    logp = F.log_softmax(logits[:, S - C - 1 : S - 1], -1).gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1)
    return logp, [lg.view(B, S, -1)[:, S - C - 1 : S - 1] for lg in cap.logits]


def reference(model, batch: dict, old_logits, old_logps, algo, eps, eps_high, gamma_min, stop_gradient, **correction):
    """compute_policy_loss on our own forward, gamma from rspo.router with a cache built here
    (``correction``: compute_policy_loss's rollout-correction arguments)."""
    B, C = batch["completion_ids"].shape
    logp, new = our_forward(model, batch, detach=stop_gradient)
    cache = OldRouterCache.from_logits(
        [lg.reshape(B * C, -1) for lg in old_logits], router_spec(model).top_k, (B, C), indices_list=None
    )
    gamma = router_shift_ratio(cache, new)
    mask = batch["completion_mask"].bool()
    log_gamma = router_shift_log_weight(gamma, mask, gamma_min, stop_gradient, logp.dtype)
    weight = None
    if correction:
        weight = rollout_correction(
            correction["correction"], old_logps, correction["engine_log_prob"], mask, high=correction["correction_high"]
        ).to(logp.dtype)
    loss, metrics = compute_policy_loss(
        algo,
        logp,
        old_logps,
        batch["advantages"],
        batch["completion_mask"],
        log_gamma=log_gamma,
        weight=weight,
        clip=(eps, eps_high),
    )
    metrics.update(router_shift_metrics(gamma, mask, gamma_min))
    return loss, metrics, gamma


def grads(model) -> dict[str, torch.Tensor]:
    return {n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p)) for n, p in model.named_parameters()}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("algo", sorted(OBJECTIVES))
@pytest.mark.parametrize(("gamma_min", "stop_gradient"), [(0.8, True), (0.95, True), (0.8, False)])
def test_the_plugin_loss_and_gradients_equal_compute_policy_loss(tmp_path, arch, algo, gamma_min, stop_gradient):
    """The perturbation moves gamma to about 0.88-0.99: gamma_min 0.8 does not bind, 0.95 binds on some
    tokens and not others (both checked)."""
    _, _, _, eps, eps_high = OBJECTIVES[algo]
    trainer = make_trainer(tmp_path, arch, algo, gamma_min=gamma_min, stop_gradient=stop_gradient)
    trainer.current_gradient_accumulation_steps = 1
    model = trainer.model
    batch = fixed_batch()
    inputs = old_pass(trainer, batch)
    with torch.no_grad():
        ours_old, old_logits = our_forward(model, batch, detach=True)
    # the old pass's log-probs are the ones our forward gives (TRL's fused head vs our log-softmax)
    m = batch["completion_mask"].bool()
    torch.testing.assert_close(inputs["old_per_token_logps"][m], ours_old[m], atol=1e-5, rtol=1e-5)

    perturb(model)
    model.zero_grad()
    loss = trainer._compute_loss(model, inputs)
    loss.backward()
    got = grads(model)
    log = {k: v[-1] for k, v in trainer._metrics["train"].items() if k.startswith("router/")}

    model.zero_grad()
    ref, metrics, gamma = reference(
        model, batch, old_logits, inputs["old_per_token_logps"], algo, eps, eps_high, gamma_min, stop_gradient
    )
    ref.backward()
    want = grads(model)

    clipped = float(((gamma < gamma_min) & m).float().sum() / m.sum())
    assert (0.0 < clipped < 1.0) if gamma_min == 0.95 else (clipped == 0.0)
    assert float(gamma[m].min()) < 0.9999  # the perturbation moved the routers
    torch.testing.assert_close(loss, ref, atol=1e-6, rtol=1e-5)
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=1e-6, rtol=1e-4, msg=name)
    assert log["router/shift_ratio_mean"] == pytest.approx(metrics["router/shift_ratio_mean"], abs=1e-6)
    assert log["router/shift_clipfrac"] == pytest.approx(metrics["router/shift_clipfrac"], abs=1e-6)


def engine_batch(tmp_path, algo: str, seed: int, scale: float):
    """A trainer (RS, gamma_min 0.95) after its old pass on the fixed batch, the old pass's router
    logits, and an engine's log-probs: the old ones plus ``scale`` x N(0, 1) noise (seeded)."""
    trainer = make_trainer(tmp_path, "qwen3_moe", algo, gamma_min=0.95)
    trainer.current_gradient_accumulation_steps = 1
    batch = fixed_batch()
    inputs = old_pass(trainer, batch)
    with torch.no_grad():
        _, old_logits = our_forward(trainer.model, batch, detach=True)
    m = batch["completion_mask"].bool()
    noise = torch.randn(inputs["old_per_token_logps"].shape, generator=torch.Generator().manual_seed(seed))
    engine = torch.where(m, inputs["old_per_token_logps"] + scale * noise, torch.zeros(()))
    return trainer, batch, inputs, old_logits, engine


@pytest.mark.parametrize("algo", ["grpo", "gspo", "gmpo"])
def test_trls_own_vllm_correction_works_beside_rs(tmp_path, algo):
    """TRL's importance-sampling correction of vLLM's rollouts (token_truncate, C = 2) on beside RS: the
    plug-in's loss equals compute_policy_loss with RS and the same correction (omega = min(rho, C) outside
    the clip; for GSPO and GMPO the response's mean of omega), and differs from RS alone. GMPO: TRL's
    GMPOTrainer applies none; RSPOTrainer does (rspo.integrations.trl)."""
    _, _, _, eps, eps_high = OBJECTIVES[algo]
    trainer, batch, inputs, old_logits, engine = engine_batch(tmp_path, algo, seed=3, scale=0.8)
    trainer.use_vllm, trainer.vllm_importance_sampling_correction = True, True  # what use_vllm=True sets
    m = batch["completion_mask"].bool()
    inputs["importance_sampling_ratio"] = torch.exp(inputs["old_per_token_logps"] - engine).clamp(max=2.0) * m
    perturb(trainer.model)
    loss = trainer._compute_loss(trainer.model, inputs)
    args = (trainer.model, batch, old_logits, inputs["old_per_token_logps"], algo, eps, eps_high, 0.95, True)
    ref, _, _ = reference(*args, engine_log_prob=engine, correction="token_truncate", correction_high=2.0)
    plain_rs, _, _ = reference(*args)
    torch.testing.assert_close(loss, ref, atol=1e-6, rtol=1e-5)
    assert abs(float(loss) - float(plain_rs)) > 1e-4  # the correction did something


@pytest.mark.parametrize("mode", ["token_mask", "sequence_truncate", "sequence_mask"])
def test_rspo_trainer_applies_trls_other_correction_modes_as_compute_policy_loss_does(tmp_path, mode):
    """GMPO + RS with TRL's other modes: the ratio as TRL's generation step leaves it ((B, T) for token
    modes, zero where masked; (B, 1) for sequence modes) gives the loss of compute_policy_loss with
    rspo.losses' omega of the same mode and bounds; and with the correction off the loss is RS's alone,
    whatever ratio the batch carries."""
    _, _, _, eps, eps_high = OBJECTIVES["gmpo"]
    scale = 0.8 if mode == "token_mask" else 0.15  # sequence ratios: some responses inside [lo, C], some not
    trainer, batch, inputs, old_logits, engine = engine_batch(tmp_path, "gmpo", seed=5, scale=scale)
    m = batch["completion_mask"].bool()
    lo, hi = 0.5, 2.0
    diff = (inputs["old_per_token_logps"] - engine) * m  # TRL: masked difference, then its mode
    ratio = torch.exp(diff.sum(-1, keepdim=True) if mode.startswith("sequence") else diff)
    if mode.endswith("truncate"):  # TRL's default vllm_importance_sampling_clip_min: None (no lower bound)
        ratio = ratio.clamp(max=hi)
    else:
        ratio = ratio.masked_fill((ratio < lo) | (ratio > hi), 0.0)
    inputs["importance_sampling_ratio"] = ratio
    perturb(trainer.model)
    args = (trainer.model, batch, old_logits, inputs["old_per_token_logps"], "gmpo", eps, eps_high, 0.95, True)
    plain_rs, _, _ = reference(*args)
    off = trainer._compute_loss(trainer.model, inputs)  # use_vllm off: the ratio is not read
    torch.testing.assert_close(off, plain_rs, atol=1e-6, rtol=1e-5)
    trainer.use_vllm, trainer.vllm_importance_sampling_correction = True, True
    trainer.vllm_importance_sampling_mode = mode
    loss = trainer._compute_loss(trainer.model, inputs)
    ref, _, _ = reference(*args, engine_log_prob=engine, correction=mode, correction_high=hi)
    torch.testing.assert_close(loss, ref, atol=1e-6, rtol=1e-5)
    assert abs(float(loss) - float(plain_rs)) > 1e-5  # the correction did something
    trainer.vllm_importance_sampling_correction = False  # a config that turns it off: RS alone
    torch.testing.assert_close(trainer._compute_loss(trainer.model, inputs), plain_rs, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("algo", sorted(OBJECTIVES))
def test_unchanged_weights_give_gamma_one_and_plain_trls_loss(tmp_path, algo):
    torch.manual_seed(0)
    rs = make_trainer(tmp_path, "qwen2_moe", algo)
    plain = make_trainer(tmp_path, "qwen2_moe", algo, plain=True)
    for t in (rs, plain):
        t.current_gradient_accumulation_steps = 1
    inputs = old_pass(rs, fixed_batch())
    loss_rs = rs._compute_loss(rs.model, inputs)
    plain_inputs = {k: v for k, v in inputs.items() if not k.startswith("rs_")}
    loss_plain = plain._compute_loss(plain.model, plain_inputs)
    assert rs._metrics["train"]["router/shift_ratio_mean"][-1] == 1.0
    assert rs._metrics["train"]["router/shift_clipfrac"][-1] == 0.0
    assert torch.equal(loss_rs, loss_plain)


def test_old_routers_stay_with_their_rows_through_trls_shuffle_and_split(tmp_path):
    """The real _prepare_inputs: one generation (model.generate), shuffled and split into
    steps_per_generation slices. Unchanged weights: every slice's gamma is 1 up to the fp16 cache's
    rounding; the same slices with their old-router rows rolled by one give a clearly lower gamma."""
    trainer = make_trainer(tmp_path, "olmoe", "gmpo", steps_per_generation=4, per_device_train_batch_size=4)
    trainer.current_gradient_accumulation_steps = 1
    trainer.model.train()
    generation = [dataset()[i // 4] for i in range(16)]  # 4 prompts x num_generations 4, as TRL's sampler
    slices = []
    for step in range(4):  # one generation, shuffled, split into 4 slices of 4 rows
        trainer._step = step
        slices.append(trainer._prepare_inputs(generation))
    assert len({id(s) for s in slices}) == 4 and all(len(s["completion_ids"]) == 4 for s in slices)
    seen = torch.cat([s["completion_ids"] for s in slices])
    assert len({tuple(r.tolist()) for r in seen}) > 1
    for s in slices:
        trainer._compute_loss(trainer.model, s)
        assert trainer._metrics["train"]["router/shift_ratio_mean"][-1] > 1 - 1e-3
        rolled = dict(s, rs_old_indices=s["rs_old_indices"].roll(1, 0), rs_old_logp=s["rs_old_logp"].roll(1, 0))
        trainer._compute_loss(trainer.model, rolled)
        assert trainer._metrics["train"]["router/shift_ratio_mean"][-1] < 0.99


def test_gradient_checkpointing_gives_the_same_loss_and_gradients(tmp_path):
    out = {}
    for gc in (False, True):
        trainer = make_trainer(tmp_path / str(gc), "qwen3_moe", "gmpo", gradient_checkpointing=gc, stop_gradient=False)
        trainer.current_gradient_accumulation_steps = 1
        trainer.model.train()
        if gc:  # what Trainer.train() does with the args (TRL's default: gradient_checkpointing=True)
            trainer.model.activation_checkpointing_enable(trainer.args.gradient_checkpointing_kwargs)
            assert trainer.model.is_activation_checkpointing
        inputs = old_pass(trainer, fixed_batch())
        perturb(trainer.model)
        trainer.model.zero_grad()
        loss = trainer._compute_loss(trainer.model, inputs)
        loss.backward()
        out[gc] = (loss.detach(), grads(trainer.model), trainer._metrics["train"]["router/shift_ratio_mean"][-1])
    torch.testing.assert_close(out[True][0], out[False][0], atol=1e-6, rtol=1e-6)
    for name, g in out[False][1].items():
        torch.testing.assert_close(out[True][1][name], g, atol=1e-6, rtol=1e-5, msg=name)
    assert out[True][2] == out[False][2] < 1.0


def test_refusals_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="gamma_min"):
        RSPOConfig(output_dir=str(tmp_path), use_cpu=True, gamma_min=0.0, report_to=[])
    with pytest.raises(ValueError, match="on-policy"):
        make_trainer(tmp_path, algo="gmpo", steps_per_generation=1)
    with pytest.raises(ValueError, match="loss_type='sapo'|sapo"):
        make_trainer(tmp_path, algo="grpo", loss_type="sapo")
    from transformers import LlamaConfig, LlamaForCausalLM

    dense = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(TOK), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4
        )
    )
    with pytest.raises(ValueError, match="Llama"):
        make_trainer(tmp_path, algo="grpo", model=dense)
    trainer = make_trainer(tmp_path, algo="gmpo")
    with pytest.raises(RuntimeError, match="rs_old"):
        trainer._compute_loss(trainer.model, fixed_batch())


@pytest.mark.slow
def test_two_gloo_processes_train_and_log_the_router_metrics(tmp_path):
    """torchrun, 2 processes (accelerate picks up the gloo group on CPU): 2 generations of 2
    updates with RSPOTrainer under Trainer.train() with TRL's default gradient checkpointing; both
    ranks finish and the logged history holds the router metrics, reduced over the ranks."""
    script = tmp_path / "run.py"
    script.write_text(
        "import json, sys\n"
        f"sys.path.insert(0, {str(ROOT / 'tests')!r})\n"
        "from test_integrations_trl import make_trainer\n"
        "from pathlib import Path\n"
        "import torch.distributed as dist\n"
        "out = Path(sys.argv[1])\n"
        "t = make_trainer(out, 'qwen2_moe', 'gmpo', max_steps=4, logging_steps=1, per_device_train_batch_size=2,"
        " learning_rate=3e-2, gradient_checkpointing=True)\n"
        "t.train()\n"
        "rank = dist.get_rank() if dist.is_initialized() else -1\n"
        "(out / f'rank{rank}.json').write_text(json.dumps({'world': t.accelerator.num_processes,"
        " 'gc': t.model.is_activation_checkpointing, 'log': t.state.log_history}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), ACCELERATE_USE_CPU="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)]
    proc = subprocess.run(cmd + [str(tmp_path)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    per_rank = []
    for rank in (0, 1):
        info = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert info["world"] == 2 and info["gc"]
        rows = [r for r in info["log"] if "router/shift_ratio_mean" in r]
        assert len(rows) == 4
        assert all(0.0 < r["router/shift_ratio_mean"] <= 1.0 and 0.0 <= r["router/shift_clipfrac"] <= 1.0 for r in rows)
        assert any(r["router/shift_ratio_mean"] < 1.0 for r in rows)  # the second update of a generation moved
        per_rank.append([(r["router/shift_ratio_mean"], r["router/shift_clipfrac"]) for r in rows])
    assert per_rank[0] == per_rank[1]  # one value for the job: both ranks' tokens counted


@pytest.mark.slow
def test_the_documented_install_beside_trl_alone_runs_the_example_and_rs_acts(tmp_path):
    """docs/trl.md's two install lines in an empty venv (the repository without its dependencies,
    then TRL 1.16.0 with what it needs; versions held to the main lock, installed by uv), then the
    page's example run there from a folder of its own: no Snakemake, MLflow, math-verify or
    matplotlib in the venv, RS floors tokens at gamma_min at some logging step (shift_clipfrac > 0),
    and nothing is written into the working folder."""
    import re
    import shutil

    uv = Path(sys.executable).parent / "uv"
    if not uv.exists():
        pytest.skip("uv is not in this venv (make venv installs it from envs/locks/uv.txt)")
    lock = ROOT / "envs" / "locks" / "main.txt"
    src = tmp_path / "src"  # the repository's package, copied: a build would write into the checkout
    shutil.copytree(ROOT / "rspo", src / "rspo", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    venv = tmp_path / "venv"
    python = venv / "bin" / "python"
    pip = [
        str(uv),
        "pip",
        "install",
        "--quiet",
        "--python",
        str(python),
        "-c",
        str(lock),
        "--build-constraint",
        str(lock),
    ]
    torch_from = subprocess.run(["make", "-s", "torch-find-links"], cwd=ROOT, capture_output=True, text=True).stdout
    pip += ["--find-links", torch_from.strip()]  # the CPU torch where make venv takes it from
    for cmd in (
        [str(uv), "venv", "--quiet", "--python", sys.executable, str(venv)],
        [*pip, "--no-deps", str(src)],
        [*pip, "trl==1.16.0", f"torch=={torch.__version__}"],
    ):
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, (cmd, r.stderr[-3000:])
    names = subprocess.run(
        [
            str(python),
            "-c",
            "import importlib.metadata as m; print(' '.join(d.metadata['Name'].lower() for d in m.distributions()))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert not {"snakemake", "mlflow", "math-verify", "matplotlib", "seaborn"} & set(names), sorted(names)
    assert {"rspo", "trl", "torch", "transformers"} <= set(names)
    example = re.search(r"```python\n(.*?)```", (ROOT / "docs" / "trl.md").read_text(), re.S).group(1)
    here = tmp_path / "cwd"
    here.mkdir()
    (tmp_path / "example.py").write_text(example)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    r = subprocess.run(
        [str(python), str(tmp_path / "example.py")],
        cwd=here,
        env={**env, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    clip = [float(x) for x in re.findall(r"'shift_clipfrac': ([0-9.]+)", r.stdout)]
    assert clip and max(clip) > 0, r.stdout[-2000:]
    assert not list(here.iterdir())  # it wrote into its temporary folder only
