"""Rollouts with a transformers model and a KV cache (CPU and GPU), colocated with the training model.

The backend samples from the very model object being trained (plain or FSDP2-sharded), so
``sync_weights`` only swaps the reference.

Sampling is our own loop rather than ``model.generate``, for one property ``generate`` lacks:
every response row has its own random stream, seeded by ``row_seed(seed, row_offset + i)``,
and the token at position t is drawn with the Gumbel-max trick from the row's t-th block of
uniforms. A row's tokens therefore depend only on its prompt, its seed and the weights, not on
which other prompts share the batch, so rollouts sharded over data-parallel ranks equal the
single-process rollout (up to float noise in the logits from different padding, which changes
a token only at an exact near-tie). Gumbel-max over temperature-scaled logits restricted to the
top-p nucleus is exact sampling from the same distribution ``generate`` samples from.

Under FSDP2 every forward is a collective, so all ranks must run the same number of decoding
steps: set ``all_done`` to a function that says whether every rank is finished (the trainer
passes ``Dist.any``-based agreement); a single process stops when its own rows are done.
"""

from __future__ import annotations

from typing import Callable

import torch

from rspo.models import position_ids_from_mask
from rspo.rollout.base import RolloutBatch, response_mask_from_ids, row_seed


def _nucleus(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """logits with everything outside the top-p nucleus set to -inf (the top token always stays)."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    drop_sorted = probs.cumsum(dim=-1) - probs > top_p  # mass before this token already exceeds top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


class HFBackend:
    def __init__(self, model, tokenizer, *, all_done: Callable[[bool], bool] | None = None, **_: object) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.all_done = all_done or (lambda local: local)
        if tokenizer.pad_token_id is None:
            raise ValueError("tokenizer has no pad token: set one before rollouts")

    def sync_weights(self, model) -> None:
        self.model = model

    @torch.no_grad()
    def generate(self, prompts: list[str], n: int, *, temperature: float, top_p: float = 1.0,
                 max_new_tokens: int = 64, seed: int = 0, row_offset: int = 0) -> RolloutBatch:
        if not prompts:
            raise ValueError("prompts: empty")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        from transformers import DynamicCache

        tok = self.tokenizer
        enc = tok(prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=True)
        device = next(self.model.parameters()).device
        input_ids = enc["input_ids"].repeat_interleave(n, dim=0).to(device)  # (B, P)
        attn = enc["attention_mask"].repeat_interleave(n, dim=0).to(device)  # (B, P)
        B, P = input_ids.shape
        eos = tok.eos_token_id
        eos_ids = torch.tensor(eos if isinstance(eos, list) else [eos], device=device)
        sample = temperature > 0
        gens = [torch.Generator().manual_seed(row_seed(seed, row_offset + i)) for i in range(B)] if sample else []
        was_training = self.model.training
        self.model.eval()
        cache = DynamicCache(config=self.model.config)
        step_ids, step_pos, full_attn = input_ids, position_ids_from_mask(attn), attn
        done = torch.zeros(B, dtype=torch.bool, device=device)
        out_tokens: list[torch.Tensor] = []
        try:
            for _ in range(max_new_tokens):
                out = self.model(input_ids=step_ids, attention_mask=full_attn, position_ids=step_pos,
                                 past_key_values=cache, use_cache=True, logits_to_keep=1)
                logits = out.logits[:, -1].float()  # (B, V)
                if sample:
                    logits = logits / temperature
                    if top_p < 1.0:
                        logits = _nucleus(logits, top_p)
                    u = torch.stack([torch.rand(logits.shape[-1], generator=g) for g in gens]).to(device)  # (B, V)
                    nxt = (logits - torch.log(-torch.log(u))).argmax(dim=-1)  # Gumbel-max
                else:
                    nxt = logits.argmax(dim=-1)
                nxt = torch.where(done, torch.full_like(nxt, tok.pad_token_id), nxt)
                out_tokens.append(nxt)
                done = done | torch.isin(nxt, eos_ids)
                if self.all_done(bool(done.all())):
                    break
                cache = out.past_key_values
                step_ids = nxt[:, None]
                step_pos = step_pos[:, -1:] + 1
                full_attn = torch.cat([full_attn, torch.ones_like(full_attn[:, :1])], dim=1)
        finally:
            self.model.train(was_training)
        response_ids = torch.stack(out_tokens, dim=1)  # (B, R)
        response_mask = response_mask_from_ids(response_ids, eos)
        response_ids = torch.where(response_mask.bool(), response_ids, torch.full_like(response_ids, tok.pad_token_id))
        full = torch.cat([input_ids, response_ids], dim=1)
        full_mask = torch.cat([attn, response_mask.to(attn.dtype)], dim=1)
        texts = tok.batch_decode(response_ids, skip_special_tokens=True)
        return RolloutBatch(full, full_mask, P, response_mask, texts)
