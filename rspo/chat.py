"""Prompts through the model's own chat template, and the thinking block of what it answers.

A benchmark or training record becomes chat messages (``rspo.prompts``: ``math_messages``,
``evalplus_messages``, ``mbpp_messages``, ``lcb_messages``); ``PromptFormat`` turns them into the
text the rollout backends tokenize:

- ``template: chat``: the tokenizer's own ``chat_template`` through ``apply_chat_template(messages,
  add_generation_prompt=True, enable_thinking=...)``. Nothing is pre-filled after the generation
  prompt (a pre-filled answer would end a thinking model's thought before it starts); the model
  writes its whole answer. ``enable_thinking`` must be given (true or false) when the template has
  that switch (Qwen3's hybrid models) and must be left out when it has none, so the thinking mode
  of every number is a choice written in the preset, never the template's default by accident.
- a hand-written template (math: ``qwen_math`` | ``no`` | ``plain``; code: ``chatml`` | ``plain``,
  see ``rspo.prompts``): the earlier text formats, for models without a chat template (the small
  presets' own tokenizers) and for reproducing Dr. GRPO's ``qwen_math`` text exactly.
- ``template: auto`` (the default): ``chat`` when the tokenizer has a chat template, else the
  family's hand-written default (math ``qwen_math``, code ``chatml``).

A template that writes the BOS token itself (Llama's) would get a second one from the tokenizer,
which the backends call with ``add_special_tokens=True``: the rendered text drops its leading BOS
when the tokenizer adds one (``render``).

Answers of a chat-template prompt are graded on the text after the thinking block
(``answer_text``): the text after the last ``</think>``; a completion that opened ``<think>`` and
never closed it (the token budget ended the thought) has no answer and scores 0, counted as
``unfinished_thinking`` in the results. Without a thinking block the whole completion is the answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
THINKING_SWITCH = "enable_thinking"
CHAT_TEMPLATES_DIR = Path(__file__).resolve().parent / "chat_templates"
HAND_TEMPLATES: dict[str, tuple[str, ...]] = {"math": ("qwen_math", "no", "plain"), "code": ("chatml", "plain")}
HAND_DEFAULT = {"math": "qwen_math", "code": "chatml"}


def vendored_template(name: str = "qwen3") -> str:
    """A chat template shipped with rspo (rspo/chat_templates/SOURCE.md)."""
    path = CHAT_TEMPLATES_DIR / f"{name}.jinja"
    if not path.is_file():
        known = sorted(p.stem for p in CHAT_TEMPLATES_DIR.glob("*.jinja"))
        raise FileNotFoundError(f"no vendored chat template {name!r}; shipped: {known}")
    return path.read_text()


def has_thinking_switch(tokenizer: Any) -> bool:
    return THINKING_SWITCH in (getattr(tokenizer, "chat_template", None) or "")


@dataclass(frozen=True)
class PromptFormat:
    """How messages become prompt text: the chat template (``template == "chat"``) or a hand one."""

    family: str
    template: str
    enable_thinking: bool | None = None
    tokenizer: Any = None

    @property
    def chat(self) -> bool:
        return self.template == "chat"

    def render(self, messages: list[dict[str, str]]) -> str:
        """The chat template's rendering of ``messages`` with the generation prompt."""
        if not self.chat:
            raise ValueError(f"{self.family}: template {self.template!r} is hand-written; render needs template chat")
        tok = self.tokenizer
        kwargs = {} if self.enable_thinking is None else {THINKING_SWITCH: self.enable_thinking}
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
        bos = getattr(tok, "bos_token", None)
        if bos and text.startswith(bos) and _adds_bos(tok):
            text = text[len(bos) :]
        return text

    def answer(self, completion: str) -> tuple[str, bool]:
        """(the text to grade, whether a thinking block was left unfinished)."""
        return answer_text(completion) if self.chat else (completion, False)

    def record(self) -> dict[str, Any]:
        """What the result files and the table's protocol lines say about the prompts."""
        return {
            "template": self.template,
            "enable_thinking": self.enable_thinking,
            "chat_template_sha256": _sha256(self.tokenizer.chat_template) if self.chat else None,
        }


def _adds_bos(tok: Any) -> bool:
    try:
        ids = tok("x", add_special_tokens=True)["input_ids"]
    except Exception:  # noqa: BLE001 - a tokenizer that cannot encode "x" adds nothing we can see
        return False
    return bool(ids) and ids[0] == getattr(tok, "bos_token_id", None)


def _sha256(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()


def answer_text(completion: str) -> tuple[str, bool]:
    """Split off the thinking block: (answer, unfinished). See the module docstring."""
    if THINK_CLOSE in completion:
        return completion.rsplit(THINK_CLOSE, 1)[1].lstrip("\n"), False
    if THINK_OPEN in completion:
        return "", True
    return completion, False


def resolve_format(
    family: str, template: str | None, enable_thinking: bool | None, tokenizer: Any, where: str
) -> PromptFormat:
    """The prompt format of a family's settings, refused with a message naming ``where`` (the
    preset key) when the template and the thinking switch do not fit the tokenizer."""
    if family not in HAND_TEMPLATES:
        raise ValueError(f"{where}: no prompt formats for family {family!r}; known: {sorted(HAND_TEMPLATES)}")
    template = template or "auto"
    has_chat = bool(getattr(tokenizer, "chat_template", None)) if tokenizer is not None else False
    if template == "auto":
        template = "chat" if has_chat else HAND_DEFAULT[family]
    known = ("auto", "chat") + HAND_TEMPLATES[family]
    if template not in known:
        raise ValueError(f"{where}.template: unknown {family} template {template!r}; choose one of {list(known)}")
    if template != "chat":
        if enable_thinking is not None:
            raise ValueError(
                f"{where}.enable_thinking: set only with template chat (the hand-written {template!r} "
                "template has no thinking switch)"
            )
        return PromptFormat(family, template, None, tokenizer)
    if not has_chat:
        raise ValueError(
            f"{where}.template: chat, but the model's tokenizer has no chat template; use a hand-written "
            f"one ({', '.join(HAND_TEMPLATES[family])}) or auto"
        )
    if has_thinking_switch(tokenizer) and enable_thinking is None:
        raise ValueError(
            f"{where}.enable_thinking: the model's chat template has a thinking switch; set it to true or "
            "false (the preset says which mode its numbers are measured in)"
        )
    if not has_thinking_switch(tokenizer) and enable_thinking is not None:
        raise ValueError(
            f"{where}.enable_thinking: the model's chat template has no thinking switch ({THINKING_SWITCH}); "
            "leave the setting out"
        )
    return PromptFormat(family, "chat", enable_thinking, tokenizer)
