"""Rollout interface, the shared batch layout, and the evaluation generator factory."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import torch


@dataclass
class RolloutBatch:
    input_ids: torch.Tensor  # (B, P + R) left-padded prompt | right-padded response
    attention_mask: torch.Tensor  # (B, P + R)
    prompt_width: int  # P
    response_mask: torch.Tensor  # (B, R) float: 1 up to and including the first EOS
    responses: list[str]  # decoded responses (special tokens skipped), len B

    @property
    def response_ids(self) -> torch.Tensor:  # (B, R)
        return self.input_ids[:, self.prompt_width :]

    @property
    def num_response_tokens(self) -> int:
        return int(self.response_mask.sum())

    def token_rows(self) -> tuple[list[list[int]], list[list[int]]]:
        """(prompt token lists without padding, response token lists up to and including EOS)."""
        P = self.prompt_width
        ids = self.input_ids.cpu()
        attn = self.attention_mask.cpu().bool()
        resp_mask = self.response_mask.cpu().bool()
        prompts = [ids[i, :P][attn[i, :P]].tolist() for i in range(ids.shape[0])]
        responses = [ids[i, P:][resp_mask[i]].tolist() for i in range(ids.shape[0])]
        return prompts, responses

    def select(self, rows: torch.Tensor) -> "RolloutBatch":
        return RolloutBatch(
            input_ids=self.input_ids[rows],
            attention_mask=self.attention_mask[rows],
            prompt_width=self.prompt_width,
            response_mask=self.response_mask[rows],
            responses=[self.responses[int(i)] for i in rows],
        )


class RolloutBackend(Protocol):
    def generate(self, prompts: list[str], n: int, *, temperature: float, top_p: float, max_new_tokens: int,
                 seed: int, row_offset: int = 0) -> RolloutBatch:
        """n responses per prompt, grouped consecutively: rows [i*n, (i+1)*n) answer prompts[i].

        Row i is sampled from its own stream seeded by ``row_seed(seed, row_offset + i)``, so a
        response does not depend on which other prompts share the call (the property that makes
        rollouts sharded over ranks equal to a single-process rollout).
        """

    def sync_weights(self, model) -> None:
        """Make the engine sample from the training model's current weights."""


def derive_seed(*parts: int) -> int:
    """Deterministic 31-bit seed from (seed, step, index, ...) (FNV-1a style)."""
    h = 1469598103934665603
    for p in parts:
        h = ((h ^ (int(p) & 0xFFFFFFFFFFFF)) * 1099511628211) % (1 << 64)
    return h % (1 << 31)


def row_seed(seed: int, row: int) -> int:
    """Seed of one response row's sampling stream (31 bits)."""
    return derive_seed(seed, row, 0x5EED)


def pack_rows(prompt_rows: list[list[int]], response_rows: list[list[int]], tokenizer,
              texts: list[str] | None = None, device: torch.device | str = "cpu") -> RolloutBatch:
    """The canonical batch layout from token lists: prompts left-padded to the longest prompt,
    responses right-padded to the longest response (at least 1), tokens after the first EOS
    masked and replaced by the pad token. ``texts`` default to the decoded responses."""
    if len(prompt_rows) != len(response_rows) or not prompt_rows:
        raise ValueError(f"need as many prompt rows as response rows (> 0), got {len(prompt_rows)} and "
                         f"{len(response_rows)}")
    pad = tokenizer.pad_token_id
    P = max(len(p) for p in prompt_rows)
    R = max(1, max(len(r) for r in response_rows))
    ids = torch.full((len(prompt_rows), P + R), pad, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i, (p, r) in enumerate(zip(prompt_rows, response_rows)):
        ids[i, P - len(p) : P] = torch.tensor(p, dtype=torch.long)
        attn[i, P - len(p) : P] = 1
        if r:
            ids[i, P : P + len(r)] = torch.tensor(r, dtype=torch.long)
    response_ids = ids[:, P:]
    lengths = torch.tensor([len(r) for r in response_rows])
    within = torch.arange(R)[None, :] < lengths[:, None]
    response_mask = response_mask_from_ids(response_ids, tokenizer.eos_token_id) * within.float()
    attn[:, P:] = response_mask.long()
    ids[:, P:] = torch.where(response_mask.bool(), response_ids, torch.full_like(response_ids, pad))
    if texts is None:
        texts = tokenizer.batch_decode(ids[:, P:], skip_special_tokens=True)
    return RolloutBatch(ids.to(device), attn.to(device), P, response_mask.to(device), list(texts))


def response_mask_from_ids(response_ids: torch.Tensor, eos_token_id: int | list[int] | None) -> torch.Tensor:
    """1 for tokens up to and including the first EOS; all ones if there is none.  (B, R) -> (B, R)"""
    if eos_token_id is None:
        return torch.ones_like(response_ids, dtype=torch.float32)
    eos_ids = torch.tensor(eos_token_id if isinstance(eos_token_id, list) else [eos_token_id])
    is_eos = torch.isin(response_ids, eos_ids.to(response_ids.device))
    # tokens strictly after the first EOS are masked: cumulative count of EOS before position t
    before = torch.cumsum(is_eos.long(), dim=1) - is_eos.long()
    return (before == 0).float()


def make_backend(name: str, model, tokenizer, **kwargs) -> RolloutBackend:
    if name == "hf":
        from rspo.rollout.hf import HFBackend

        return HFBackend(model, tokenizer, **kwargs)
    if name == "vllm":
        from rspo.rollout.vllm import VLLMBackend

        return VLLMBackend(model, tokenizer, **kwargs)
    raise ValueError(f"rollout.backend: unknown backend {name!r}; choose hf or vllm")


def load_generator(model_dir: str, backend: str = "hf", *, max_new_tokens: int = 512, top_p: float = 1.0,
                   dtype: str = "float32", device: str = "auto", batch_size: int = 64,
                   seed: int = 0, progress: Callable[[int], None] | None = None,
                   ) -> Callable[[list[str], int, float], list[list[str]]]:
    """A ``generate_fn(prompts, n, temperature) -> list[list[str]]`` for evaluation suites.

    ``progress(k)`` is called after each batch with the number of prompts it answered."""
    from rspo.models import load_model, load_tokenizer_checked

    tokenizer = load_tokenizer_checked(model_dir)
    model = load_model(model_dir, dtype=dtype, device=device) if backend == "hf" else None
    engine = make_backend(backend, model, tokenizer, model_path=model_dir) if backend == "vllm" else make_backend(
        "hf", model, tokenizer)
    calls = {"k": 0}

    def generate_fn(prompts: list[str], n: int = 1, temperature: float = 0.0) -> list[list[str]]:
        out: list[list[str]] = []
        for start in range(0, len(prompts), max(1, batch_size // max(n, 1))):
            chunk = prompts[start : start + max(1, batch_size // max(n, 1))]
            calls["k"] += 1
            batch = engine.generate(chunk, n, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
                                    seed=seed * 1_000_003 + calls["k"])
            for i in range(len(chunk)):
                out.append(batch.responses[i * n : (i + 1) * n])
            if progress is not None:
                progress(len(chunk))
        return out

    return generate_fn
