"""rspo pretrain / rspo evaluate countdown: a tiny SFT run lowers the loss, a killed run resumes to the
same result, a checkpoint of another tokenizer is refused, the evaluation JSON is complete."""

import json
from pathlib import Path

import pytest
import torch
import yaml

from rspo.data.countdown import CountdownConfig, generate
from rspo.tokenizer import save_tokenizer

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("pretrain")
    generate(
        CountdownConfig(
            num_numbers=3,
            max_number=20,
            min_target=10,
            max_target=40,
            train_size=600,
            val_size=8,
            val_target_size=8,
            seed=3,
        ),
        root / "data",
    )
    save_tokenizer(root / "tok")
    preset = yaml.safe_load((ROOT / "configs" / "smoke.yaml").read_text())
    preset["pretrain"].update(
        examples=640, batch_size=32, eval_every=0, ckpt_every=5, eval_size=8, max_new_tokens=16, warmup_steps=2
    )
    path = root / "preset.yaml"
    path.write_text(yaml.safe_dump(preset))
    return root, path


def _run(setup, out, *extra):
    from rspo.commands.pretrain import main

    root, preset = setup
    return main(
        [
            "--preset",
            str(preset),
            "--data",
            str(root / "data"),
            "--tokenizer",
            str(root / "tok"),
            "--out",
            str(out),
            "--threads",
            "1",
            "--no-mlflow",
            *extra,
        ]
    )


def _losses(out: Path) -> list[float]:
    work = out.with_name(out.name + ".work")
    return [
        json.loads(ln)["pretrain/loss"]
        for ln in (work / "metrics.jsonl").read_text().splitlines()
        if "pretrain/loss" in ln
    ]


def test_pretraining_lowers_the_loss_and_writes_a_hf_checkpoint(setup, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "base"
    assert _run(setup, out, "--set", "examples=3200") == 0
    summary = json.loads((out / "pretrain.json").read_text())
    assert summary["steps"] == 100
    losses = _losses(out)
    assert losses[-1] < 0.7 * losses[0], losses
    model = AutoModelForCausalLM.from_pretrained(str(out))  # a standard HF folder
    tok = AutoTokenizer.from_pretrained(str(out))
    assert model.config.model_type == "qwen2_moe" and model.config.num_experts_per_tok == 1
    assert len(tok) == model.config.vocab_size
    meta = json.loads((out / "rspo_meta.json").read_text())
    assert meta["tokenizer_fingerprint"] == summary["tokenizer_fingerprint"]


def test_killed_pretraining_resumes_to_the_same_weights(setup, tmp_path):
    from safetensors.torch import load_file

    ref, killed = tmp_path / "ref", tmp_path / "killed"
    assert _run(setup, ref) == 0
    assert _run(setup, killed, "--max-steps", "12") == 0  # stops like a kill after the step-10 checkpoint
    assert not (killed / "pretrain.json").exists()
    assert _run(setup, killed) == 0
    wa, wb = load_file(str(ref / "model.safetensors")), load_file(str(killed / "model.safetensors"))
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-5, atol=1e-6)


def test_bad_inputs_are_clear_errors(setup, tmp_path, capsys):
    from rspo.commands.pretrain import main
    from rspo.models import load_tokenizer_checked

    root, preset = setup
    assert (
        main(
            [
                "--preset",
                str(preset),
                "--data",
                str(root / "data"),
                "--tokenizer",
                str(root / "tok"),
                "--out",
                str(tmp_path / "x"),
                "--set",
                "bogus=1",
                "--no-mlflow",
            ]
        )
        == 2
    )
    assert "pretrain.bogus" in capsys.readouterr().err
    missing = [
        "--preset",
        str(preset),
        "--data",
        str(tmp_path / "nodata"),
        "--tokenizer",
        str(root / "tok"),
        "--out",
        str(tmp_path / "y"),
        "--no-mlflow",
    ]
    assert main(missing) == 2  # one line naming the folder and what makes it, nothing written
    err = capsys.readouterr().err
    assert "nodata" in err and "rspo generate" in err and not (tmp_path / "y").exists()
    out = tmp_path / "base"
    assert _run(setup, out) == 0
    with pytest.raises(ValueError, match="another tokenizer"):
        load_tokenizer_checked(out, expected_fingerprint="0" * 16)


def test_evaluate_countdown_writes_accuracy_reasons_and_samples(setup, tmp_path):
    from rspo.commands.evaluate import main

    root, preset = setup
    out = tmp_path / "base"
    assert _run(setup, out) == 0
    res_path = tmp_path / "eval" / "countdown.json"
    assert (
        main(
            [
                "countdown",
                "--preset",
                str(preset),
                "--model",
                str(out),
                "--data",
                str(root / "data"),
                "--out",
                str(res_path),
                "--no-mlflow",
                "--max-new-tokens",
                "12",
            ]
        )
        == 0
    )
    res = json.loads(res_path.read_text())
    assert set(res["splits"]) == {"val", "val_target"}
    for split in res["splits"].values():
        assert 0.0 <= split["accuracy"] <= 1.0 and split["n"] == 8
        assert sum(split["reasons"].values()) == 8
        assert split["samples"] and {"prompt", "completion", "score", "reason"} <= set(split["samples"][0])
    assert res["config"]["max_new_tokens"] == 12 and res["config"]["dtype"] == "float32"

    # a preset that trains in bf16 is evaluated in bf16 (rl.model.dtype), as the runs were trained
    bf16 = tmp_path / "bf16.yaml"
    data = yaml.safe_load(Path(preset).read_text())
    data.setdefault("rl", {}).setdefault("model", {})["dtype"] = "bfloat16"
    bf16.write_text(yaml.safe_dump(data))
    args = ["countdown", "--preset", str(bf16), "--model", str(out), "--data", str(root / "data")]
    assert main([*args, "--out", str(tmp_path / "b.json"), "--no-mlflow", "--max-new-tokens", "4"]) == 0
    assert json.loads((tmp_path / "b.json").read_text())["config"]["dtype"] == "bfloat16"


def test_pretraining_and_evaluation_in_a_log_write_parseable_progress_lines(setup, tmp_path, capsys):
    """Not a terminal: pretraining writes a line per step here (20 steps < 100) with the loss, the
    last one with the held-out accuracy; evaluation a line per batch of each split, ending with
    the split's accuracy; --quiet silences both."""
    from rspo.commands.evaluate import main as evaluate
    from rspo.progress import parse_line

    root, preset = setup
    out = tmp_path / "base"
    assert _run(setup, out) == 0
    rows = [r for r in map(parse_line, capsys.readouterr().err.splitlines()) if r is not None]
    assert [r["step"] for r in rows] == list(range(1, 21)) + [20]
    assert {r["label"] for r in rows} == {"pretrain countdown"} and {r["total"] for r in rows} == {20}
    losses = _losses(out)
    assert rows[0]["metrics"]["loss"] == pytest.approx(losses[0], rel=1e-3)
    assert all(isinstance(r["metrics"]["loss"], float) and r["metrics"]["acc"] is None for r in rows[:-1])
    summary = json.loads((out / "pretrain.json").read_text())
    assert rows[-1]["metrics"]["acc"] == pytest.approx(summary["heldout"]["accuracy"], abs=1e-4)

    res_path = tmp_path / "eval" / "countdown.json"
    args = [
        "countdown",
        "--preset",
        str(preset),
        "--model",
        str(out),
        "--data",
        str(root / "data"),
        "--out",
        str(res_path),
        "--no-mlflow",
        "--max-new-tokens",
        "6",
    ]
    assert evaluate(args) == 0
    rows = [r for r in map(parse_line, capsys.readouterr().err.splitlines()) if r is not None]
    res = json.loads(res_path.read_text())
    for split in ("val", "val_target"):
        mine = [r for r in rows if r["label"] == f"eval countdown base {split}"]
        assert mine and mine[-1]["step"] == mine[-1]["total"] == 8 and mine[-1]["unit"] == "prompt"
        assert mine[-1]["metrics"]["acc"] == pytest.approx(res["splits"][split]["accuracy"], abs=1e-4)

    assert _run(setup, tmp_path / "quiet", "--quiet", "--set", "examples=64") == 0
    assert evaluate([*args, "--quiet"]) == 0
    assert not [ln for ln in capsys.readouterr().err.splitlines() if parse_line(ln)]
