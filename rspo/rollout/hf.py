"""Rollouts with a transformers model and a KV cache (CPU and GPU), colocated with the training model.

The backend samples from the very model object being trained (plain or FSDP2-sharded), so
``sync_weights`` only swaps the reference.

Sampling is our own loop rather than ``model.generate``, for one property ``generate`` lacks:
a row's tokens depend only on its prompt, its seed and the weights, not on which other prompts
share the batch, so rollouts sharded over data-parallel ranks equal the single-process rollout
(up to float noise in the logits from different batch shapes, which changes a token only at an
exact near-tie). Row i's token at position t is drawn with the Gumbel-max trick from
counter-based uniforms keyed by (``row_seed(seed, row_offset + i)``, t, vocabulary index)
(``rspo.seeding.uniform_noise``: integer tensor ops, no generator object per row). Gumbel-max
over the temperature-scaled logits restricted to the top-k tokens (ties at the k-th kept) and then
to the top-p nucleus (the smallest set of most likely tokens whose mass reaches p) is exact
sampling from the distribution transformers' warpers (temperature, top-k, top-p, in that order)
and vLLM's sampler draw from.

Work the loop saves compared with ``generate`` (same distribution, same outputs per row):
- each prompt is prefilled once and its KV cache repeated for its n responses (``generate``
  prefills every one of the n copies);
- rows that have finished (stop token drawn) leave the batch: the KV cache, positions and
  mask are compacted to the active rows whenever at least an eighth of them are done;
- on the CPU, decoding uses transformers' eager attention (one query token against the cache),
  measured ~25% faster than SDPA there for the small models; the training forwards keep the
  model's own attention implementation.

A response ends at its first stop token: EOS or any other special token of the tokenizer
(pad, bos, unk, ...). Special tokens vanish from the decoded text the verifier sees, so a
response that drew one mid-way would otherwise be graded on text that differs from the tokens
it is trained on; ending it there keeps text and tokens the same (``stop_token_ids``).

Under FSDP2 every forward is a collective, so all ranks must run the same number of decoding
steps: set ``all_done`` to a function that says whether every rank is finished (the trainer
passes ``Dist.any``-based agreement); a single process stops when its own rows are done. A
rank whose rows are all done keeps forwarding one placeholder row until the others finish.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.profiler import record_function

from rspo.models import entropy_of, position_ids_from_mask
from rspo.rollout.base import RolloutBatch, Sampling, no_routing, response_mask_from_ids, stop_token_ids
from rspo.seeding import row_seed, uniform_noise


def _top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    """logits with everything below the k-th largest set to -inf (tokens tied with it stay)."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = logits.topk(k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def _nucleus(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """logits with everything outside the top-p nucleus set to -inf (the top token always stays):
    a token is dropped when the tokens more likely than it already hold at least ``top_p``."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    drop_sorted = probs.cumsum(dim=-1) - probs >= top_p  # mass before this token already reaches top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


class HFBackend:
    def __init__(self, model, tokenizer, *, all_done: Callable[[bool], bool] | None = None, **_: object) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.all_done = all_done or (lambda local: local)
        if tokenizer.pad_token_id is None:
            raise ValueError("tokenizer has no pad token: set one before rollouts")
        self.stop_ids = stop_token_ids(tokenizer)

    def sync_weights(self, model) -> None:
        self.model = model

    def release(self) -> None:
        """Nothing to free: the backend samples from the training model itself."""

    def wake_kv(self) -> None:
        """Nothing to wake: the KV cache of a rollout lives only while it decodes."""

    @torch.no_grad()
    def generate(
        self,
        prompts: list[str],
        n: int,
        sampling: Sampling,
        *,
        row_offset: int = 0,
        record_routing: bool = False,
        record_old: bool = False,
    ) -> RolloutBatch:
        """Rows as the RolloutBackend protocol says, with each sampled token's log-prob under the full
        temperature-scaled distribution (``engine_logp``) and, with ``record_routing``, the experts
        every forwarded position was routed to (``routed_experts``: the prompt's in the prefill, each
        response token's when it is fed back; the last sampled token is never forwarded). With
        ``record_old`` also each token's entropy of that distribution (``engine_entropy``) and, with
        ``record_routing``, the log router probabilities of the routed experts (``routed_logp``): the
        old values of the trainer's old pass, from the forwards that sampled (the positions that
        predict a response token are exactly the forwarded ones)."""
        if not prompts:
            raise ValueError("prompts: empty")
        temperature, top_p, top_k = sampling.temperature, sampling.top_p, sampling.top_k
        max_new_tokens, seed = sampling.max_new_tokens, sampling.seed
        from transformers import DynamicCache

        tok = self.tokenizer
        enc = tok(prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=True)
        device = next(self.model.parameters()).device
        prompt_ids = enc["input_ids"].to(device)  # (N, P)
        prompt_attn = enc["attention_mask"].to(device)  # (N, P)
        B, P = prompt_ids.shape[0] * n, prompt_ids.shape[1]
        stop = torch.tensor(self.stop_ids, device=device)
        sample = temperature > 0
        seeds = torch.tensor([row_seed(seed, row_offset + i) for i in range(B)], device=device)  # (B,)
        out = torch.full((B, max_new_tokens), tok.pad_token_id, dtype=torch.long, device=device)  # (B, R)
        out_logp = torch.zeros(B, max_new_tokens, device=device)  # (B, R) the engine's log-prob of each token
        out_ent = torch.zeros(B, max_new_tokens, device=device) if record_old else None  # (B, R) its entropy
        routing = _Routing(self.model, B, P, max_new_tokens, n, with_logp=record_old) if record_routing else None
        was_training = self.model.training
        self.model.eval()
        attn_impl = getattr(self.model.config, "_attn_implementation", None)
        decode_impl = "eager" if device.type == "cpu" else attn_impl  # see the module docstring
        if decode_impl != attn_impl:
            self.model.set_attn_implementation(decode_impl)
        cache = DynamicCache(config=self.model.config)
        active = torch.arange(B, device=device)  # rows of `out` still in the decoding batch
        finished = torch.zeros(B, dtype=torch.bool, device=device)  # per row of the batch: stop token drawn
        attn = prompt_attn  # (b, P + t): attention mask of the rows in the batch
        step_ids, step_pos = prompt_ids, position_ids_from_mask(prompt_attn)
        steps = 0
        try:
            for t in range(max_new_tokens):
                with record_function("rollout.model"):
                    fwd = self.model(
                        input_ids=step_ids,
                        attention_mask=attn,
                        position_ids=step_pos,
                        past_key_values=cache,
                        use_cache=True,
                        logits_to_keep=1,
                    )
                cache = fwd.past_key_values
                logits = fwd.logits[:, -1].float()  # (b, V)
                if routing is not None:
                    with record_function("rollout.routing"):
                        routing.record(t, active)
                if t == 0:  # one prefill per prompt, then n rows per prompt share its cache
                    cache.batch_repeat_interleave(n)
                    logits = logits.repeat_interleave(n, dim=0)
                    attn = attn.repeat_interleave(n, dim=0)
                    step_pos = step_pos.repeat_interleave(n, dim=0)
                with record_function("rollout.sample"):
                    full = torch.log_softmax(logits / temperature if sample else logits, dim=-1)  # (b, V)
                    if sample:
                        logits = logits / temperature
                        if top_k > 0:
                            logits = _top_k(logits, top_k)
                        if top_p < 1.0:
                            logits = _nucleus(logits, top_p)
                        u = uniform_noise(seeds[active], t, logits.shape[-1])  # (b, V)
                        nxt = (logits - torch.log(-torch.log(u))).argmax(dim=-1)  # Gumbel-max
                    else:
                        nxt = logits.argmax(dim=-1)
                    out[active, t] = nxt
                    out_logp[active, t] = full.gather(1, nxt[:, None]).squeeze(1)
                    if out_ent is not None:  # as the old pass computes it
                        out_ent[active, t] = entropy_of(full)
                steps = t + 1
                finished = finished | torch.isin(nxt, stop)  # (b,)
                if self.all_done(bool(finished.all())):
                    break
                n_done = int(finished.sum())
                if n_done and n_done * 8 >= len(active):  # compact the batch to the rows still decoding
                    idx = (~finished).nonzero().squeeze(1)
                    if not len(idx):  # every local row is done, other ranks are not: one placeholder row
                        idx = torch.zeros(1, dtype=torch.long, device=device)
                    cache.batch_select_indices(idx)
                    active, nxt, attn, step_pos, finished = (
                        active[idx],
                        nxt[idx],
                        attn[idx],
                        step_pos[idx],
                        finished[idx],
                    )
                step_ids = nxt[:, None]
                step_pos = step_pos[:, -1:] + 1
                attn = torch.cat([attn, torch.ones_like(attn[:, :1])], dim=1)
        finally:
            if routing is not None:
                routing.close()
            self.model.train(was_training)
            if decode_impl != attn_impl:
                self.model.set_attn_implementation(attn_impl)
        response_ids = out[:, :steps]  # (B, R)
        response_mask = response_mask_from_ids(response_ids, self.stop_ids)
        response_ids = torch.where(response_mask.bool(), response_ids, torch.full_like(response_ids, tok.pad_token_id))
        input_ids = prompt_ids.repeat_interleave(n, dim=0)
        full = torch.cat([input_ids, response_ids], dim=1)
        full_mask = torch.cat([prompt_attn.repeat_interleave(n, dim=0), response_mask.to(prompt_attn.dtype)], dim=1)
        texts = tok.batch_decode(response_ids, skip_special_tokens=True)
        engine_logp = out_logp[:, :steps] * response_mask  # (B, R)
        routed = routing.result(steps) if routing is not None else None
        return RolloutBatch(
            full,
            full_mask,
            P,
            response_mask,
            texts,
            engine_logp,
            routed,
            engine_entropy=None if out_ent is None else out_ent[:, :steps] * response_mask,
            routed_logp=routing.result_logp(steps) if routing is not None and record_old else None,
        )


class _Routing:
    """The experts each forwarded position of a generation was routed to (rspo.router's capture):
    the prefill's P prompt positions, repeated for the n rows of a prompt, then at step t >= 1 the
    response token fed back, at position P + t - 1, for the rows still decoding."""

    def __init__(self, model, rows: int, prompt_width: int, max_new_tokens: int, n: int, with_logp: bool) -> None:
        from rspo.router import OldRouterCache, capture_router_logits, router_spec

        spec = router_spec(model)
        self._cache_of = OldRouterCache.from_logits
        self.P, self.n, self.top_k = prompt_width, n, spec.top_k
        self.routed = no_routing(spec.num_moe_layers, rows, prompt_width + max_new_tokens, spec.top_k)
        # the old-router cache's log-probs of those experts (rspo.router_shift.OldRouterCache)
        self.logp = torch.zeros(self.routed.shape, dtype=torch.float16) if with_logp else None
        self._ctx = capture_router_logits(model, detach=True)
        self.cap = self._ctx.__enter__()

    def record(self, t: int, active: torch.Tensor) -> None:
        indices = self.cap.indices
        logp = None
        if self.logp is not None:  # the cache's own rounding of log softmax over all experts, per layer
            n = indices[0].shape[0]
            part = self._cache_of(self.cap.logits, self.top_k, (n, 1), indices_list=indices)
            logp = part.logp[:, :, 0].cpu()  # (L, n, K)
        for layer, idx in enumerate(indices):
            idx = idx.to("cpu", self.routed.dtype)
            if t == 0:  # (N*P, K) of the prompts, before their rows are repeated
                self.routed[layer, :, : self.P] = self._per_row(idx)
                if logp is not None:
                    self.logp[layer, :, : self.P] = self._per_row(logp[layer])
            else:
                self.routed[layer, active.cpu(), self.P + t - 1] = idx
                if logp is not None:
                    self.logp[layer, active.cpu(), self.P + t - 1] = logp[layer]
        self.cap.clear()

    def _per_row(self, x: torch.Tensor) -> torch.Tensor:
        """(N*P, K) of the prompts -> (N*n, P, K): each prompt's positions for its n rows."""
        return x.view(-1, self.P, x.shape[-1]).repeat_interleave(self.n, dim=0)

    def close(self) -> None:
        self._ctx.__exit__(None, None, None)

    def result(self, steps: int) -> torch.Tensor:
        return self.routed[:, :, : self.P + steps]

    def result_logp(self, steps: int) -> torch.Tensor:
        return self.logp[:, :, : self.P + steps]
