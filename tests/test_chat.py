"""rspo.chat: prompts through the model's own chat template (the real Qwen3 template, vendored with
its source and licence), the thinking switch as an explicit choice, and the thinking block split
off what is graded."""

import hashlib
from pathlib import Path

import pytest

from rspo import prompts as P
from rspo.chat import PromptFormat, answer_text, has_thinking_switch, resolve_format, vendored_template
from rspo.evaluate import benchmarks as B
from rspo.evaluate import suites as S

ROOT = Path(__file__).resolve().parents[1]
QWEN3_SHA256 = "a55ee1b1660128b7098723e0abcd92caa0788061051c62d51cbe87d9cf1974d8"
FIXTURES = ROOT / "tests" / "fixtures" / "code"
THINK_OFF = "<think>\n\n</think>\n\n"


class Tok:
    """The part of a tokenizer the prompt format uses; the template renders through transformers'
    own jinja environment (the one apply_chat_template uses)."""

    def __init__(self, template: str | None, bos: str | None = None, adds_bos: bool = False):
        self.chat_template = template
        self.bos_token = bos
        self.bos_token_id = 1 if bos else None
        self.adds_bos = adds_bos

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False, **kwargs):
        from transformers.utils.chat_template_utils import render_jinja_template

        rendered, _ = render_jinja_template(
            conversations=[messages],
            chat_template=self.chat_template,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            **kwargs,
        )
        return rendered[0]

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": ([1] if self.adds_bos and add_special_tokens else []) + [5]}


@pytest.fixture(scope="module")
def qwen3():
    return Tok(vendored_template("qwen3"))


def test_the_vendored_template_is_qwen3s_with_its_source_and_licence():
    text = vendored_template("qwen3")
    assert hashlib.sha256(text.encode()).hexdigest() == QWEN3_SHA256
    folder = ROOT / "rspo" / "chat_templates"
    source = (folder / "SOURCE.md").read_text()
    assert QWEN3_SHA256 in source and "trl-1.16.0" in source and "Apache-2.0" in source
    assert "Apache License" in (folder / "LICENSE").read_text()
    assert has_thinking_switch(Tok(text)) and not has_thinking_switch(Tok("{{ messages[0].content }}"))
    with pytest.raises(FileNotFoundError, match="shipped: \\['qwen3'\\]"):
        vendored_template("llama9")


@pytest.mark.parametrize("thinking", [True, False])
def test_every_benchmark_prompt_rendered_by_the_qwen3_template(qwen3, thinking):
    """The exact text of each benchmark family's prompt, thinking on and off."""
    fmt = {f: resolve_format(f, "chat", thinking, qwen3, f"eval.{f}") for f in ("math", "code")}
    tail = "<|im_start|>assistant\n" + ("" if thinking else THINK_OFF)
    q = B.load_math_benchmark("aime24", limit=1)[0]
    assert P.math_item_prompt(q["prompt"], fmt["math"]) == (
        f"<|im_start|>user\n{q['prompt']}\nPlease reason step by step, and put your final answer within "
        "\\boxed{}.<|im_end|>\n" + tail
    )
    he = B.load_humaneval(limit=1)[0]
    prompt, prefix = S.code_item_prompt("humaneval", he, fmt["code"])
    assert prefix == ""  # nothing pre-filled: the model writes its whole answer (and may think first)
    assert prompt == (
        "<|im_start|>user\nPlease provide a self-contained Python script that solves the following problem in a "
        f"markdown code block:\n```\n{he['prompt'].strip()}\n```\n<|im_end|>\n" + tail
    )
    mb = B.load_mbpp(FIXTURES / "mbpp_full_test.jsonl", limit=1)[0]
    prompt, prefix = S.code_item_prompt("mbpp", mb, fmt["code"])
    task = P.mbpp_task_text(mb["prompt"], mb["meta"]["test_list"]).strip()
    assert prefix == "" and prompt == (
        "<|im_start|>user\nPlease provide a self-contained Python script that solves the following problem in a "
        f"markdown code block:\n```\n{task}\n```\n<|im_end|>\n" + tail
    )
    lcb = B.load_livecodebench(FIXTURES / "lcb_release_sample.jsonl", limit=1)[0]
    prompt, prefix = S.code_item_prompt("livecodebench", lcb, fmt["code"])
    assert prefix == "" and prompt == (
        f"<|im_start|>system\n{P.LCB_SYSTEM_MESSAGE}<|im_end|>\n<|im_start|>user\n"
        f"{P.lcb_question(lcb['prompt'], lcb['meta']['starter_code'])}<|im_end|>\n" + tail
    )
    # training records of each task use the same rendering
    rec = {"prompt": lcb["prompt"], "starter_code": lcb["meta"]["starter_code"]}
    assert P.code_record_prompt(rec, fmt["code"]) == prompt


def test_hand_written_templates_are_unchanged_under_a_prompt_format(qwen3):
    q = "What is 1+1?"
    assert P.math_item_prompt(q, PromptFormat("math", "qwen_math")) == P.apply_qwen_math_template(q)
    he = B.load_humaneval(limit=1)[0]
    for style in ("chatml", "plain"):
        assert S.code_item_prompt("humaneval", he, PromptFormat("code", style)) == P.evalplus_prompt(
            he["prompt"], style
        )


def test_the_thinking_choice_must_be_explicit_and_fit_the_template(qwen3):
    plain = Tok("{% for m in messages %}{{ m.content }}{% endfor %}{% if add_generation_prompt %}>{% endif %}")
    none = Tok(None)
    with pytest.raises(ValueError, match="eval.math.enable_thinking: the model's chat template has a thinking switch"):
        resolve_format("math", "chat", None, qwen3, "eval.math")
    with pytest.raises(ValueError, match="eval.code.enable_thinking: the model's chat template has no thinking"):
        resolve_format("code", "chat", False, plain, "eval.code")
    with pytest.raises(ValueError, match="eval.math.template: chat, but the model's tokenizer has no chat template"):
        resolve_format("math", "chat", None, none, "eval.math")
    with pytest.raises(ValueError, match="rl.data.enable_thinking: set only with template chat"):
        resolve_format("math", "qwen_math", True, qwen3, "rl.data")
    with pytest.raises(ValueError, match="unknown code template 'qwen_math'"):
        resolve_format("code", "qwen_math", None, qwen3, "eval.code")
    # auto: the chat template when there is one, else the family's hand-written default
    assert resolve_format("math", "auto", True, qwen3, "x").template == "chat"
    assert resolve_format("math", None, None, none, "x").template == "qwen_math"
    assert resolve_format("code", "auto", None, none, "x").template == "chatml"
    assert resolve_format("code", "auto", None, plain, "x").render([{"role": "user", "content": "hi"}]) == "hi>"


def test_a_template_writing_bos_does_not_get_a_second_one():
    tmpl = "{{ bos_token }}{% for m in messages %}[{{ m.content }}]{% endfor %}"
    msgs = [{"role": "user", "content": "x"}]
    adds = resolve_format("math", "chat", None, Tok(tmpl, bos="<s>", adds_bos=True), "x")
    assert adds.render(msgs) == "[x]"  # the tokenizer adds <s> when the backends encode
    keeps = resolve_format("math", "chat", None, Tok(tmpl, bos="<s>", adds_bos=False), "x")
    assert keeps.render(msgs) == "<s>[x]"


def test_the_answer_is_the_text_after_the_thinking_block():
    assert answer_text("<think>\nso 2\n</think>\n\nThe answer is \\boxed{2}.") == ("The answer is \\boxed{2}.", False)
    assert answer_text("<think>\nlong thought cut by the budget \\boxed{3}") == ("", True)
    assert answer_text("no block \\boxed{4}") == ("no block \\boxed{4}", False)
    assert answer_text("<think>a</think>b</think>c") == ("c", False)  # the last closing tag
    chat, hand = PromptFormat("math", "chat", True, Tok("x")), PromptFormat("math", "qwen_math")
    assert chat.answer("<think>\\boxed{1}") == ("", True)
    assert hand.answer("<think>\\boxed{1}") == ("<think>\\boxed{1}", False)  # hand templates grade it all


def test_suites_grade_after_the_thinking_block_and_count_unfinished_thoughts(qwen3):
    fmt = resolve_format("math", "chat", True, qwen3, "eval.math")
    items = B.load_math_benchmark("amc23", limit=3)
    prompts = [P.math_item_prompt(it["prompt"], fmt) for it in items]
    table = {
        prompts[0]: f"<think>\nmaybe \\boxed{{0}}\n</think>\n\nSo \\boxed{{{items[0]['answer']}}}.",  # right after
        prompts[1]: f"<think>\nso \\boxed{{{items[1]['answer']}}}\n</think>\n\nSo \\boxed{{0}}.",  # right only inside
        prompts[2]: f"<think>\nthe budget ends here \\boxed{{{items[2]['answer']}}}",  # unfinished
    }
    res = S.evaluate_math(
        lambda p, n, t: [[table[x]] * n for x in p], benchmarks=["amc23"], limit=3, prompt_format=fmt, workers=1
    )
    r = res["benchmarks"]["amc23"]
    assert r["pass@1"] == pytest.approx(1 / 3) and r["unfinished_thinking"] == 1
    assert res["config"]["template"] == "chat" and res["config"]["enable_thinking"] is True
    assert res["config"]["chat_template_sha256"] == QWEN3_SHA256
    # code: the program is taken from the answer, not from a draft in the thinking block
    cfmt = resolve_format("code", "chat", True, qwen3, "eval.code")
    he = B.load_humaneval(limit=2)
    good = [it["prompt"] + it["meta"]["canonical_solution"] for it in he]
    answers = {
        S.code_item_prompt("humaneval", he[0], cfmt)[
            0
        ]: f"<think>\n```python\nbroken(\n```\n</think>\n\n```python\n{good[0]}```",
        S.code_item_prompt("humaneval", he[1], cfmt)[0]: f"<think>\n```python\n{good[1]}```\nstill thinking",
    }
    res = S.evaluate_code(
        lambda p, n, t: [[answers[x]] * n for x in p], benchmarks=["humaneval"], limit=2, prompt_format=cfmt, workers=1
    )
    assert (
        res["benchmarks"]["humaneval"]["pass@1"] == 0.5 and res["benchmarks"]["humaneval"]["unfinished_thinking"] == 1
    )
