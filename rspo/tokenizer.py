"""Countdown tokenizer (`python -m rspo tokenizer --out DIR`: rspo.commands.tokenizer), built locally, no download.

A word-level `tokenizers` model over a fixed vocabulary:
- special tokens `<pad>` (id 0), `<bos>` (1), `<eos>` (2), `<unk>` (3);
- the words of Qin et al.'s trace format and of our prompts as whole tokens
  (`WORDS`: Current, State, Operations, Operation, Exploring, Resulting, Numbers,
  Generated, Node, Moving, to, from, equal, unequal, No, Solution, Goal, Reached, START,
  END, nums, target);
- every printable ASCII character as its own token, including the digits (so any number is
  representable, one token per digit), the operators `+ - * / =`, the punctuation
  `, : [ ] # '`, space, tab and newline.

Pre-tokenisation splits the text into the longest known word at each position, else one
character (a regex; words are tried longest first, so "Operations" is not "Operation" +
"s"). Whitespace is kept as tokens and the decoder concatenates tokens with nothing in
between (`decoders.Fuse`), so decode(encode(x)) == x exactly for any printable-ASCII
text (except that a literal "<eos>" etc. in the text is read as that special token).
Characters outside the vocabulary map to `<unk>` (lossy; our formats never produce them).

Conventions: encoding adds `<bos>` in front (post-processor, like Llama); `<eos>` is never
added by encoding: the trainer appends `eos_token_id` after a completion, and generation
stops on it. Decode with `skip_special_tokens=True` to drop them. Padding side is left to
the caller.

Deviation from Qin et al.: they train a WordPiece tokenizer (`countdown_tokenizer.json`),
whose decode inserts spaces between tokens (their reward re-spaces the text with
`parse_trajectory_qwen`); ours round-trips exactly, so the verifier reads decoded text
as is.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import string
from pathlib import Path

__all__ = [
    "SPECIAL_TOKENS",
    "WORDS",
    "build_tokenizer",
    "save_tokenizer",
    "load_tokenizer",
    "tokenizer_fingerprint",
    "token_stats",
]

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
WORDS = (
    "Current",
    "State",
    "Operations",
    "Operation",
    "Exploring",
    "Resulting",
    "Numbers",
    "Generated",
    "Node",
    "Moving",
    "to",
    "from",
    "equal",
    "unequal",
    "No",
    "Solution",
    "Goal",
    "Reached",
    "START",
    "END",
    "nums",
    "target",
)
# Printable ASCII without the vertical tab, form feed and carriage return.
CHARS = tuple(c for c in string.printable if c not in "\x0b\x0c\r")


def _vocab() -> dict[str, int]:
    vocab: dict[str, int] = {}
    for tok in (*SPECIAL_TOKENS, *WORDS, *CHARS):
        vocab.setdefault(tok, len(vocab))
    return vocab


def _split_pattern() -> str:
    """Longest known word first, else any single character (including newline)."""
    words = sorted(WORDS, key=lambda w: (-len(w), w))
    return "|".join(re.escape(w) for w in words) + r"|[\s\S]"


def build_tokenizer():
    """The Countdown tokenizer as a `transformers.PreTrainedTokenizerFast` (fully offline)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = _vocab()
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(_split_pattern()), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    core.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        clean_up_tokenization_spaces=False,  # keep the text byte for byte on decode
    )


def save_tokenizer(out_dir: str | os.PathLike):
    """Build the tokenizer and `save_pretrained` it into `out_dir`; returns it."""
    tok = build_tokenizer()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(out))
    return tok


def load_tokenizer(path: str | os.PathLike):
    """`AutoTokenizer.from_pretrained(path)` offline, with a clear error if it is missing."""
    from transformers import AutoTokenizer

    p = Path(path)
    if not (p / "tokenizer.json").is_file():
        raise FileNotFoundError(
            f"no tokenizer at {p} (expected {p / 'tokenizer.json'}); build it with `python -m rspo tokenizer --out {p}`"
        )
    return AutoTokenizer.from_pretrained(str(p), local_files_only=True)


def tokenizer_fingerprint(tok) -> str:
    """sha256 (hex, 16 chars) of what decides token ids: vocabulary, special tokens, splitting.

    Computed from the backend tokenizer's JSON without its padding/truncation settings
    (which callers change at run time), so it is stable across save/load and differs for
    any other vocabulary. Store it with a checkpoint and compare on load.
    """
    spec = json.loads(tok.backend_tokenizer.to_str())
    spec.pop("padding", None)
    spec.pop("truncation", None)
    specials = {name: getattr(tok, name, None) for name in ("pad_token", "bos_token", "eos_token", "unk_token")}
    blob = json.dumps({"backend": spec, "specials": specials}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


def token_stats(tok, data: Path, style: str, limit: int) -> dict:
    """Round-trip check and tokens per example (prompt + completion + eos) on a split file."""
    from rspo.data.countdown import format_completion, format_prompt, load_split

    records = load_split(data)[:limit]
    if not records:
        raise ValueError(f"{data} holds no records")
    lengths = []
    for rec in records:
        prompt, completion = format_prompt(rec, style), format_completion(rec, style)
        for text in (prompt, completion):
            ids = tok(text, add_special_tokens=False)["input_ids"]
            if tok.decode(ids, skip_special_tokens=True) != text or tok.unk_token_id in ids:
                raise ValueError(f"tokenizer does not round-trip {text[:60]!r}")
        n_prompt = len(tok(prompt)["input_ids"])  # with <bos>
        n_completion = len(tok(completion, add_special_tokens=False)["input_ids"]) + 1  # + <eos>
        lengths.append(n_prompt + n_completion)
    return {
        "style": style,
        "examples": len(lengths),
        "tokens_mean": round(sum(lengths) / len(lengths), 2),
        "tokens_max": max(lengths),
    }
