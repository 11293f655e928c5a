"""rspo.base_pin: the committed base a preset pins. The shipped small preset's pin matches its committed
weights; a base with other weights is refused (by the check, by `rspo train` before it loads anything,
by the install); the install copies the marker last; `pin` (make base) re-pins by rewriting one line."""

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import yaml

from rspo import base_pin
from rspo.commands.train import main as train_main
from rspo.method import ConfigError
from rspo.preset import Preset

ROOT = Path(__file__).resolve().parents[1]


def fake_base(folder: Path, weights: bytes) -> Path:
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(weights)
    (folder / "config.json").write_text("{}")
    (folder / "pretrain.json").write_text(json.dumps({"heldout": {"accuracy": 0.5, "n": 2}}))
    return folder


def pinned_preset(tmp_path: Path, base: Path) -> Path:
    """A copy of configs/smoke.yaml in tmp/configs that pins ``base`` (relative to tmp, the root)."""
    data = yaml.safe_load((ROOT / "configs" / "smoke.yaml").read_text())
    data["base_model"] = {
        "path": str(base.relative_to(tmp_path)),
        "sha256": hashlib.sha256((base / "model.safetensors").read_bytes()).hexdigest(),
    }
    (tmp_path / "configs").mkdir(exist_ok=True)
    path = tmp_path / "configs" / "smoke.yaml"
    path.write_text("# a comment kept by pin\n" + yaml.safe_dump(data, sort_keys=False))
    return path


def test_the_small_preset_pins_the_committed_base():
    preset = Preset.load(ROOT / "configs" / "small.yaml")
    folder = base_pin.pinned_dir(preset)
    assert folder == ROOT / "docs" / "results" / "bases" / "small" / "base"
    assert base_pin.weights_sha256(folder) == preset.base_pin.sha256
    base_pin.check(preset, folder)  # no error
    assert Preset.load(ROOT / "configs" / "smoke.yaml").base_pin is None  # smoke pretrains its own


def test_another_base_is_refused_in_one_line_naming_both_digests(tmp_path):
    base = fake_base(tmp_path / "base", b"weights")
    preset = Preset.load(pinned_preset(tmp_path, base))
    other = fake_base(tmp_path / "other", b"other weights")
    with pytest.raises(base_pin.BaseMismatch) as e:
        base_pin.check(preset, other)
    msg = str(e.value)
    assert "\n" not in msg and preset.base_pin.sha256[:12] in msg
    assert hashlib.sha256(b"other weights").hexdigest()[:12] in msg
    with pytest.raises(base_pin.BaseMismatch, match="no model.safetensors"):
        base_pin.check(preset, tmp_path)


def test_rspo_train_refuses_another_base_before_loading_anything(tmp_path, capsys):
    base = fake_base(tmp_path / "base", b"weights")
    preset = pinned_preset(tmp_path, base)
    other = fake_base(tmp_path / "other", b"other weights")
    data = tmp_path / "train.jsonl"
    data.write_text("")
    argv = [
        "--preset",
        str(preset),
        "--base-model",
        str(other),
        "--train-data",
        str(data),
        "--out",
        str(tmp_path / "o"),
    ]
    assert train_main([*argv, "--no-mlflow"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rspo train: base model") and "not the preset's pinned base" in err
    assert err.count("\n") == 1
    assert not (tmp_path / "o").exists()


def test_install_checks_the_digest_and_writes_the_marker_last(tmp_path):
    base = fake_base(tmp_path / "base", b"weights")
    preset = Preset.load(pinned_preset(tmp_path, base))
    out = base_pin.install(preset, tmp_path / "results" / "base")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "pretrain.json"]
    base_pin.check(preset, out)
    # the committed folder changed behind the preset's back: refused, nothing marked finished
    (base / "model.safetensors").write_bytes(b"tampered")
    with pytest.raises(base_pin.BaseMismatch):
        base_pin.install(preset, tmp_path / "results" / "base2")
    assert not (tmp_path / "results" / "base2" / "pretrain.json").exists()
    (base / "pretrain.json").unlink()
    with pytest.raises(base_pin.BaseMismatch, match="holds no pretrain.json"):
        base_pin.install(preset, tmp_path / "results" / "base3")


def test_pin_copies_a_new_base_and_rewrites_only_the_digest(tmp_path):
    base = fake_base(tmp_path / "base", b"weights")
    path = pinned_preset(tmp_path, base)
    before = path.read_text()
    new = fake_base(tmp_path / "results" / "rebuilt", b"rebuilt weights")
    digest = base_pin.pin(path, new)
    assert digest == hashlib.sha256(b"rebuilt weights").hexdigest()
    after = path.read_text()
    old = Preset.load(path).base_pin  # the preset read again
    assert old.sha256 == digest and after.replace(digest, "X") == before.replace(
        hashlib.sha256(b"weights").hexdigest(), "X"
    )
    assert (base / "model.safetensors").read_bytes() == b"rebuilt weights"
    base_pin.check(Preset.load(path), base)
    shutil.rmtree(new)
    (tmp_path / "results" / "rebuilt").mkdir()
    with pytest.raises(base_pin.BaseMismatch, match="pretraining did not finish"):
        base_pin.pin(path, tmp_path / "results" / "rebuilt")


@pytest.mark.parametrize(
    "pin, message",
    [
        ({"path": "x"}, "base_model.sha256"),
        ({"path": "x", "sha256": "abc"}, "base_model.sha256"),
        ({"path": "", "sha256": "0" * 64}, "base_model.path"),
        ({"path": "x", "sha256": "0" * 64, "url": "y"}, "base_model.url"),
    ],
)
def test_a_malformed_pin_names_the_key(pin, message):
    with pytest.raises(ConfigError, match=message):
        assert Preset({"preset": "x", "base_model": pin}).base_pin is None  # never reached
