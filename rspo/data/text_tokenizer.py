"""A small byte-level BPE tokenizer for the smoke preset's tiny math/code models.

The paper's math/code runs use Qwen3-30B-A3B and its tokenizer. Offline, the smoke preset trains
tiny MoE models from scratch on the prepared math/code records, so it needs a tokenizer that can be
built without the hub: ``train_text_tokenizer(texts, vocab_size, out_dir)`` trains a byte-level BPE
(GPT-2 style: every byte is in the base alphabet, so any text round-trips exactly) with the
``tokenizers`` library and saves it as a transformers fast tokenizer, so that
``AutoTokenizer.from_pretrained(out_dir)`` reloads it offline.

- Special tokens: ``<pad>`` (id 0), ``<bos>`` (id 1), ``<eos>`` (id 2), and the chat markers
  ``<|im_start|>`` (3), ``<|im_end|>`` (4) (special: skipped when decoding, a response ends at them);
  ``<think>`` and ``</think>`` are added as ordinary tokens (kept in decoded text, as in Qwen3's
  tokenizer, so the grader can split off the thinking block).
- A chat template (by default Qwen3's, rspo/chat_templates/qwen3.jinja, thinking switch included),
  so the smoke preset's Table 1 path renders its prompts through a real chat template offline.
- ``add_special_tokens=True`` prepends ``<bos>``; ``<eos>`` is appended by the training code.
- ``add_prefix_space=False`` and no normaliser, so decode(encode(text)) == text (special tokens
  aside).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<|im_start|>", "<|im_end|>")
CHAT_SPECIAL = ("<|im_start|>", "<|im_end|>")
THINK_TOKENS = ("<think>", "</think>")


def train_text_tokenizer(
    texts: Iterable[str],
    vocab_size: int,
    out_dir: str | os.PathLike,
    min_frequency: int = 2,
    model_max_length: int = 4096,
    chat_template: str | None = "qwen3",
):
    """Train a byte-level BPE on ``texts`` and save it to ``out_dir``; return the HF tokenizer.

    ``vocab_size`` includes the 256 byte symbols and the 5 special tokens (so it must be >= 261);
    the two thinking tokens come on top. ``chat_template``: a template shipped in
    rspo/chat_templates (by name), or None for none.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    n_base = len(pre_tokenizers.ByteLevel.alphabet()) + len(SPECIAL_TOKENS)
    if vocab_size < n_base:
        raise ValueError(
            f"vocab_size must be >= {n_base} (256 bytes + {len(SPECIAL_TOKENS)} special tokens), got {vocab_size}"
        )
    texts = [t for t in texts if isinstance(t, str) and t]
    if not texts:
        raise ValueError("no training text for the tokenizer")

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_TOKENS])
    bos_id = tok.token_to_id("<bos>")
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", bos_id)]
    )
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        additional_special_tokens=list(CHAT_SPECIAL),
        model_max_length=model_max_length,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    if chat_template is not None:
        from rspo.chat import vendored_template

        hf.chat_template = vendored_template(chat_template)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(str(out))
    return hf
