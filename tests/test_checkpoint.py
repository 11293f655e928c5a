"""rspo.train.checkpoint: sharded checkpoints (round trip, integrity, atomicity, the legacy format),
a rank's memory during resume, and the final Hugging Face checkpoint written file by file."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from tiny_moe import ARCHS, make_tiny_moe, make_train_assets

from rspo.distributed import Dist
from rspo.train import checkpoint
from rspo.train.run_folder import RunFolder


def model_and_optimizer(seed=0, steps=2):
    model = make_tiny_moe("qwen3_moe", seed=seed).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = torch.randint(3, 60, (2, 6), generator=torch.Generator().manual_seed(1))
    for _ in range(steps):
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def test_a_checkpoint_round_trips_model_optimizer_and_trainer_state(tmp_path):
    model, opt = model_and_optimizer()
    step_dir = checkpoint.save(tmp_path / "step_000002", model, opt, {"step": 2, "x": [1, 2]}, Dist())
    assert checkpoint.is_complete(step_dir) and not checkpoint.is_legacy(step_dir)
    manifest = json.loads((step_dir / checkpoint.MANIFEST).read_text())
    assert manifest["format"] == checkpoint.FORMAT and manifest["world_size"] == 1
    assert {r["file"] for r in manifest["files"]} == {"state/__0_0.distcp", "state/.metadata", "trainer.pt"}
    fresh, fresh_opt = model_and_optimizer(seed=3, steps=0)  # other weights, no optimizer state yet
    state = checkpoint.load(step_dir, fresh, fresh_opt, Dist())
    assert state == {"step": 2, "x": [1, 2]}
    for (n, a), b in zip(model.named_parameters(), fresh.parameters()):
        assert torch.equal(a, b), n
        sa, sb = opt.state[a], fresh_opt.state[b]
        assert torch.equal(sa["exp_avg"], sb["exp_avg"]) and torch.equal(sa["exp_avg_sq"], sb["exp_avg_sq"]), n
        assert float(sa["step"]) == float(sb["step"]) == 2.0


@pytest.mark.parametrize(
    "damage, message",
    [
        ("flip", r"state/__0_0\.distcp is corrupt"),
        ("truncate", r"state/__0_0\.distcp has \d+ bytes, the manifest says \d+"),
        ("delete", r"state/__0_0\.distcp is missing"),
        ("manifest", r"unreadable manifest"),
    ],
)
def test_a_damaged_checkpoint_is_refused_naming_the_file(tmp_path, damage, message):
    model, opt = model_and_optimizer()
    step_dir = checkpoint.save(tmp_path / "step_000002", model, opt, {"step": 2}, Dist())
    shard = step_dir / "state" / "__0_0.distcp"
    if damage == "flip":
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
    elif damage == "truncate":
        shard.write_bytes(shard.read_bytes()[:-10])
    elif damage == "delete":
        shard.unlink()
    else:
        (step_dir / checkpoint.MANIFEST).write_text("{not json")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with pytest.raises(checkpoint.CheckpointError, match=message) as err:
        checkpoint.load(step_dir, model, opt, Dist())
    assert "delete it to resume from the previous one" in str(err.value)
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())  # nothing was read


def test_a_killed_save_leaves_no_checkpoint_and_old_ones_go_only_after_a_new_one(tmp_path, monkeypatch):
    folder = RunFolder(tmp_path / "run", "f")
    model, opt = model_and_optimizer()
    checkpoint.save(folder.step_dir(1), model, opt, {"step": 1}, Dist())
    import torch.distributed.checkpoint as dcp

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed during the save")

    monkeypatch.setattr(dcp, "save", killed)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save(folder.step_dir(2), model, opt, {"step": 2}, Dist())
    assert folder.latest_checkpoint().name == "step_000001"  # the half-written step 2 does not count
    assert (folder.checkpoints / ".tmp_step_000002").is_dir()
    monkeypatch.undo()
    checkpoint.save(folder.step_dir(2), model, opt, {"step": 2}, Dist())
    assert not (folder.checkpoints / ".tmp_step_000002").exists()
    assert sorted(p.name for p in folder.checkpoints.iterdir()) == ["step_000001", "step_000002"]
    folder.prune_checkpoints(1)
    assert [p.name for p in folder.checkpoints.iterdir()] == ["step_000002"]


def test_a_checkpoint_of_the_earlier_format_still_resumes(tmp_path):
    """Format 1 (model.safetensors + state.pt with the full optimizer state) of runs in progress."""
    from safetensors.torch import save_file

    from rspo.distributed import full_state_dicts

    model, opt = model_and_optimizer()
    model_sd, optim_sd = full_state_dicts(model, opt)
    step_dir = tmp_path / "step_000002"
    step_dir.mkdir()
    save_file({k: v.contiguous().clone() for k, v in model_sd.items()}, str(step_dir / "model.safetensors"))
    torch.save({"step": 2, "optimizer": optim_sd}, step_dir / "state.pt")
    assert checkpoint.is_complete(step_dir) and checkpoint.is_legacy(step_dir)
    fresh, fresh_opt = model_and_optimizer(seed=3, steps=0)
    assert checkpoint.load(step_dir, fresh, fresh_opt, Dist()) == {"step": 2}
    for (n, a), b in zip(model.named_parameters(), fresh.parameters()):
        assert torch.equal(a, b), n
        assert torch.equal(opt.state[a]["exp_avg"], fresh_opt.state[b]["exp_avg"]), n


@pytest.mark.parametrize("arch", ARCHS)
def test_the_final_checkpoint_is_what_save_pretrained_writes_in_the_presets_dtype(tmp_path, arch):
    """File by file (several files and an index here), cast to bf16; transformers loads it."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from rspo.tokenizer import build_tokenizer

    tok = build_tokenizer()
    model = make_tiny_moe(arch, vocab=len(tok))
    model.save_pretrained(tmp_path / "ref")
    out = checkpoint.write_hf_checkpoint(
        model, tok, tmp_path / "final", dtype=torch.bfloat16, meta={"run": "x"}, dist=Dist(), max_shard_bytes=20_000
    )
    files = sorted(out.glob("*.safetensors"))
    assert len(files) > 1
    index = json.loads((out / "model.safetensors.index.json").read_text())
    ref = {k: v for f in (tmp_path / "ref").glob("*.safetensors") for k, v in load_file(str(f)).items()}
    ours = {k: v for f in files for k, v in load_file(str(f)).items()}
    assert ours.keys() == ref.keys() == index["weight_map"].keys()
    for k in ref:
        assert ours[k].dtype == torch.bfloat16 and torch.equal(ours[k], ref[k].to(torch.bfloat16)), k
    assert json.loads((out / "rspo_meta.json").read_text()) == {"run": "x"}
    loaded = AutoModelForCausalLM.from_pretrained(out)
    assert loaded.dtype == torch.bfloat16
    assert not (tmp_path / "final.tmp").exists()


@pytest.mark.slow
def test_a_ranks_memory_during_resume_is_a_fraction_of_the_full_state(tmp_path):
    """2 gloo ranks, a 26M-parameter MoE (full state: weights + two Adam moments = 298 MiB):
    the peak resident memory a rank adds while resuming is measured (the kernel's high-water
    mark, tests/dist_worker.py). Each rank reads only its shards: measured 170 MiB (0.57 of the
    full state: its moments, the zero gradients DCP allocates to initialise the optimizer, read
    buffers); the code before read the whole state on every rank: 441-479 MiB (1.5x). Then a
    corrupt shard is refused by both ranks, naming it."""
    from dist_runs import train

    from rspo.models import build_model
    from rspo.tokenizer import build_tokenizer

    arch = dict(
        arch="qwen3_moe",
        hidden_size=256,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=512,
        moe_intermediate_size=512,
        num_experts=16,
        top_k=2,
        norm_topk_prob=True,
        max_position_embeddings=96,
        tie_word_embeddings=False,
    )
    model = build_model(arch, build_tokenizer())
    full_mib = 3 * 4 * sum(p.numel() for p in model.parameters()) / 2**20  # fp32 weights + exp_avg + exp_avg_sq
    assets = make_train_assets(tmp_path / "assets", model=model)
    out = tmp_path / "run"
    sets = (
        "schedule.total_steps=2",
        "schedule.ckpt_every=1",
        "schedule.val_every=0",
        "schedule.ppo_epochs=1",
        "rollout.max_new_tokens=6",
    )
    small_files = {"RSPO_TEST_FINAL_SHARD_BYTES": str(16 * 2**20)}
    train(assets, out, 2, *sets, RSPO_TEST_MEMORY=str(tmp_path / "first"), **small_files)
    shutil.rmtree(out / "final")
    (out / "final.json").unlink()
    train(assets, out, 2, *sets, RSPO_TEST_MEMORY=str(tmp_path / "resume"), **small_files)
    for rank in (0, 1):
        rows = {r["phase"]: r for r in json.loads(Path(f"{tmp_path / 'resume'}.rank{rank}.json").read_text())}
        added = rows["load_checkpoint"]["peak_mib"] - rows["load_checkpoint"]["before_mib"]
        assert added < 0.75 * full_mib, (rank, added, full_mib)
    assert len(list((out / "final").glob("model-*.safetensors"))) > 1  # written file by file

    # a corrupt shard: both ranks refuse it, naming the file
    (out / "final.json").unlink()
    shutil.rmtree(out / "final")
    shard = out / "checkpoints" / "step_000001" / "state" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[100] ^= 0xFF
    shard.write_bytes(bytes(data))
    proc = train(assets, out, 2, *sets, check=False)
    assert proc.returncode != 0
    assert proc.stderr.count("state/__1_0.distcp is corrupt") >= 2, proc.stderr[-3000:]
