"""Prompt templates of the math and code benchmarks (and of math/code RL training records).

Every builder returns plain text: the rollout backends take prompt strings. Code builders return
``(prompt, completion_prefix)``: ``completion_prefix`` is text the prompt ends with that belongs to
the answer (an opened ```` ```python ```` fence, or nothing); the scorer prepends it to the
completion before extracting the program.

Math (Dr. GRPO protocol, sail-sg/understand-r1-zero ``evaluate_model.py``,
``apply_qwen_math_template``, verified against commit dfca49d)::

    <|im_start|>system\\nPlease reason step by step, and put your final answer within \\boxed{}.<|im_end|>\\n
    <|im_start|>user\\n{question}<|im_end|>\\n<|im_start|>assistant\\n

Templates: ``qwen_math`` (the above, Dr. GRPO's default and the one Qwen base/MoE models expect),
``no`` (the raw question, Dr. GRPO's "no" template) and ``plain`` (question + the same instruction
on its own line, no chat tokens: for the smoke preset's tiny models whose tokenizer has no chat
tokens). Dr. GRPO grades every template's output by its last ``\\boxed{}``.

Code:
- LiveCodeBench: lcb_runner ``prompts/code_generation.py`` (LiveCodeBench/LiveCodeBench, commit
  28fef95), the generic chat format: system ``SYSTEM_MESSAGE_GENERIC`` and the user message of
  ``get_generic_question_template_answer`` (``### Question:`` + ``### Format:`` block with the
  starter code, or the stdin/stdout instruction with ``# YOUR CODE HERE``, + ``### Answer: (use the
  provided format with backticks)``). LeetCodeDataset's ``query`` column uses the same text.
  Training code records use the same prompt, so the policy is trained and evaluated on one format.
- HumanEval / HumanEval+ / MBPP+: evalplus's protocol (evalplus 0.3.1 ``codegen.py``). ``plain``
  is direct completion of the task prompt (the function signature + docstring), truncated at
  evalplus's stop strings; ``chatml`` wraps the task prompt in evalplus's instruction ("Please
  provide a self-contained Python script that solves the following problem in a markdown code
  block:") and pre-fills evalplus's response prefix and an opened ```` ```python ```` fence.
- MBPP (original, ``full`` test split): the MBPP paper's prompt (Austin et al. 2021): "You are an
  expert Python programmer, and here is your task: {text} Your code should pass these tests:\\n\\n
  {the three asserts}", zero-shot, with an opened ```` ```python ```` fence pre-filled (the paper
  used 3-shot ``[BEGIN]``/``[DONE]`` delimiters; zero-shot with a fence is what instruction-tuned
  evaluations do). MBPP+ uses evalplus's own prompt (docstring with the first assert).

Hand-written chat rendering: ``chatml`` renders ``<|im_start|>role\\n...<|im_end|>\\n`` turns (the
Qwen2.5 format) without Qwen3's ``<think>`` handling; ``plain`` joins system and user text with a
blank line. Both are kept for models without a chat template (the small presets' tokenizers) and
for Dr. GRPO's exact ``qwen_math`` text.

Chat messages (for the model's own chat template, ``rspo.chat.PromptFormat``): ``math_messages``
puts the instruction in the user turn after the question, where Qwen3's model card puts it ("Include
'Please reason step by step, and put your final answer within \\boxed{}.' in the prompt"; no system
turn); ``evalplus_messages`` is evalplus's chat instruction with the task in a fence (as ``chatml``,
without the pre-filled response); ``mbpp_messages`` is the same instruction around the MBPP paper's
task text (evalplus's chat format applied to original MBPP); ``lcb_messages`` is lcb_runner's
system + user pair. Nothing is pre-filled in a chat-template prompt (see rspo.chat).
"""

from __future__ import annotations

from typing import Any

# ---------------------------------------------------------------------------------------------
# Math
# ---------------------------------------------------------------------------------------------
QWEN_MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
MATH_TEMPLATES = ("qwen_math", "no", "plain")


def math_messages(question: str) -> list[dict[str, str]]:
    """A math problem as one user turn: the question, then Qwen3's card's instruction on its own line."""
    return [{"role": "user", "content": f"{question}\n{QWEN_MATH_INSTRUCTION}"}]


def apply_qwen_math_template(question: str) -> str:
    """Dr. GRPO's ``qwen_math`` template (exact text of understand-r1-zero/evaluate_model.py)."""
    return (
        "<|im_start|>system\n"
        + QWEN_MATH_INSTRUCTION
        + "<|im_end|>\n<|im_start|>user\n"
        + question
        + "<|im_end|>\n<|im_start|>assistant\n"
    )


def math_prompt(question: str, template: str = "qwen_math") -> str:
    """The model prompt of a math problem under ``template`` (qwen_math | no | plain)."""
    if template == "qwen_math":
        return apply_qwen_math_template(question)
    if template == "no":
        return question
    if template == "plain":
        return question + "\n" + QWEN_MATH_INSTRUCTION + "\n"
    raise ValueError(f"unknown math template {template!r}; choose one of {list(MATH_TEMPLATES)}")


# ---------------------------------------------------------------------------------------------
# Chat rendering
# ---------------------------------------------------------------------------------------------
CODE_STYLES = ("chatml", "plain")


def render_chat(system: str | None, user: str, assistant_prefix: str = "", style: str = "chatml") -> str:
    """One user turn (optionally a system turn) and the start of the assistant turn."""
    if style == "chatml":
        out = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
        return out + f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n{assistant_prefix}"
    if style == "plain":
        head = f"{system}\n\n" if system else ""
        return f"{head}{user}\n{assistant_prefix}"
    raise ValueError(f"unknown chat style {style!r}; choose one of {list(CODE_STYLES)}")


# ---------------------------------------------------------------------------------------------
# LiveCodeBench (lcb_runner prompts/code_generation.py, generic chat format)
# ---------------------------------------------------------------------------------------------
LCB_SYSTEM_MESSAGE = (
    "You are an expert Python programmer. You will be given a question (problem specification) "
    "and will generate a correct Python program that matches the specification and passes all tests."
)
LCB_FORMAT_WITH_STARTER_CODE = (
    "You will use the following starter code to write the solution to the problem and enclose "
    "your code within delimiters."
)
LCB_FORMAT_WITHOUT_STARTER_CODE = (
    "Read the inputs from stdin solve the problem and write the answer to stdout (do not directly "
    "test on the sample inputs). Enclose your code within delimiters as follows. Ensure that when "
    "the python program runs, it reads the inputs, runs the algorithm and writes output to STDOUT."
)


def lcb_question(question_content: str, starter_code: str = "") -> str:
    """lcb_runner's ``get_generic_question_template_answer`` (the user message)."""
    prompt = f"### Question:\n{question_content}\n\n"
    if starter_code:
        prompt += f"### Format: {LCB_FORMAT_WITH_STARTER_CODE}\n"
        prompt += f"```python\n{starter_code}\n```\n\n"
    else:
        prompt += f"### Format: {LCB_FORMAT_WITHOUT_STARTER_CODE}\n"
        prompt += "```python\n# YOUR CODE HERE\n```\n\n"
    prompt += "### Answer: (use the provided format with backticks)\n\n"
    return prompt


def lcb_messages(question_content: str, starter_code: str = "") -> list[dict[str, str]]:
    """The chat messages lcb_runner sends for OpenAI-style chat models."""
    return [
        {"role": "system", "content": LCB_SYSTEM_MESSAGE},
        {"role": "user", "content": lcb_question(question_content, starter_code)},
    ]


def lcb_prompt(question_content: str, starter_code: str = "", style: str = "chatml") -> str:
    """LiveCodeBench prompt rendered as text."""
    return render_chat(LCB_SYSTEM_MESSAGE, lcb_question(question_content, starter_code), style=style)


def code_prompt(record: dict[str, Any], style: str = "chatml") -> str:
    """Prompt of a normalised code TRAINING record {prompt, starter_code, ...} (LCB format)."""
    return lcb_prompt(record["prompt"], record.get("starter_code") or "", style=style)


# ---------------------------------------------------------------------------------------------
# One entry per kind of record, for a prompt format (rspo.chat.PromptFormat: chat or hand-written)
# ---------------------------------------------------------------------------------------------
def math_item_prompt(question: str, fmt: Any) -> str:
    """A math problem under ``fmt``: the chat template's rendering, or the hand-written template."""
    return fmt.render(math_messages(question)) if fmt.chat else math_prompt(question, fmt.template)


def code_record_prompt(record: dict[str, Any], fmt: Any) -> str:
    """A code TRAINING record under ``fmt`` (LiveCodeBench's format either way)."""
    if fmt.chat:
        return fmt.render(lcb_messages(record["prompt"], record.get("starter_code") or ""))
    return code_prompt(record, fmt.template)


# ---------------------------------------------------------------------------------------------
# HumanEval(+), MBPP(+)
# ---------------------------------------------------------------------------------------------
EVALPLUS_INSTRUCTION = (
    "Please provide a self-contained Python script that solves the following problem in a markdown code block:"
)
EVALPLUS_RESPONSE = (
    "Below is a Python script with a self-contained function that solves the problem and passes corresponding tests:"
)
# evalplus provider/utility.py: EOS + extra_eos_for_direct_completion(dataset).
EVALPLUS_EOS = ("<|endoftext|>", "<|endofmask|>", "</s>", "\nif __name__", "\ndef main(", "\nprint(")
DIRECT_COMPLETION_STOP = {
    "humaneval": EVALPLUS_EOS + ("\ndef ", "\nclass ", "\nimport ", "\nfrom ", "\nassert "),
    "mbpp": EVALPLUS_EOS + ('\n"""', "\nassert"),
}
FENCE = "```python\n"


def truncate_at_stop(text: str, stops: tuple[str, ...]) -> str:
    """Cut ``text`` at the first occurrence of any stop string (direct completion)."""
    cut = len(text)
    for s in stops:
        i = text.find(s)
        if i != -1:
            cut = min(cut, i)
    return text[:cut]


def evalplus_user(task_prompt: str) -> str:
    """evalplus's chat instruction with the task prompt in a fence (the user turn)."""
    return f"{EVALPLUS_INSTRUCTION}\n```\n{task_prompt.strip()}\n```\n"


def evalplus_messages(task_prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": evalplus_user(task_prompt)}]


def evalplus_prompt(task_prompt: str, style: str = "chatml") -> tuple[str, str]:
    """HumanEval(+)/MBPP+ prompt: direct completion (plain) or evalplus's chat instruction."""
    if style == "plain":
        return task_prompt, ""
    if style == "chatml":
        return render_chat(
            None, evalplus_user(task_prompt), assistant_prefix=f"{EVALPLUS_RESPONSE}\n{FENCE}", style=style
        ), FENCE
    raise ValueError(f"unknown code prompt style {style!r}; choose one of {list(CODE_STYLES)}")


def mbpp_task_text(text: str, test_list: list[str]) -> str:
    """The MBPP paper's task description (Austin et al. 2021)."""
    tests = "\n".join(test_list)
    return (
        f"You are an expert Python programmer, and here is your task: {text} "
        f"Your code should pass these tests:\n\n{tests}\n"
    )


def mbpp_messages(text: str, test_list: list[str]) -> list[dict[str, str]]:
    """MBPP for a chat template: evalplus's chat instruction around the MBPP paper's task text."""
    return [{"role": "user", "content": evalplus_user(mbpp_task_text(text, test_list))}]


def mbpp_prompt(text: str, test_list: list[str], style: str = "chatml") -> tuple[str, str]:
    """MBPP (original) prompt with an opened python fence pre-filled."""
    task = mbpp_task_text(text, test_list)
    if style == "plain":
        return task + "\n" + FENCE, FENCE
    if style == "chatml":
        return render_chat(None, task, assistant_prefix=FENCE, style=style), FENCE
    raise ValueError(f"unknown code prompt style {style!r}; choose one of {list(CODE_STYLES)}")
