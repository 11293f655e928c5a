"""Rollout interface and the shared batch layout (backend selection lives in ``rspo.rollout``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass
class RolloutBatch:
    input_ids: torch.Tensor  # (B, P + R) left-padded prompt | right-padded response
    attention_mask: torch.Tensor  # (B, P + R)
    prompt_width: int  # P
    response_mask: torch.Tensor  # (B, R) float: 1 up to and including the first EOS
    responses: list[str]  # decoded responses (special tokens skipped), len B
    engine_logp: torch.Tensor | None = None
    """(B, R) float32: each sampled token's log-prob under the engine's policy, the full
    temperature-scaled distribution (what the trainer's old pass scores); 0 on padding."""
    routed_experts: torch.Tensor | None = None
    """(L, B, P + R, K) the experts the engine routed each position to, per MoE layer (the
    old-router cache's index layout, rspo.router.OldRouterCache); a position the engine never
    forwarded (the last sampled token, padding) holds experts 0..K-1, which nothing reads."""
    engine_entropy: torch.Tensor | None = None
    """(B, R) float32: the entropy of that distribution at each response token, where the engine
    records the old values (``record_old``: the hf backend); 0 on padding."""
    routed_logp: torch.Tensor | None = None
    """(L, B, P + R, K) the log router probabilities of ``routed_experts`` (softmax over all experts,
    rounded as the old-router cache stores them), where the engine records the old values."""

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

    def select(self, rows: torch.Tensor) -> RolloutBatch:
        routed = self.routed_experts
        return RolloutBatch(
            input_ids=self.input_ids[rows],
            attention_mask=self.attention_mask[rows],
            prompt_width=self.prompt_width,
            response_mask=self.response_mask[rows],
            responses=[self.responses[int(i)] for i in rows],
            engine_logp=None if self.engine_logp is None else self.engine_logp[rows],
            routed_experts=None if routed is None else routed[:, rows.to(routed.device)],
            engine_entropy=None if self.engine_entropy is None else self.engine_entropy[rows],
            routed_logp=None if self.routed_logp is None else self.routed_logp[:, rows.to(self.routed_logp.device)],
        )

    def row_extras(self) -> tuple[list[list[float]] | None, list[torch.Tensor] | None]:
        """Per row, what the engine reported beside the tokens, without padding: the response tokens'
        log-probs, and the routing of the prompt and response positions (L, len, K), so that rows
        gathered from several ranks can be laid out again (``pack_rows``)."""
        P = self.prompt_width
        attn = self.attention_mask.cpu().bool()
        resp = self.response_mask.cpu().bool()
        logp = routing = None
        if self.engine_logp is not None:
            lp = self.engine_logp.cpu()
            logp = [lp[i][resp[i]].tolist() for i in range(len(lp))]
        if self.routed_experts is not None:
            r = self.routed_experts.cpu()
            routing = [r[:, i, torch.cat([attn[i, :P], resp[i]])] for i in range(r.shape[1])]
        return logp, routing


@dataclass(frozen=True)
class Sampling:
    """How a backend draws responses: a run's rollouts (``rollout.*``), its validation, an
    evaluation's decoding. Temperature 0 is greedy; above it, draws from softmax(logits /
    temperature) restricted to the ``top_k`` most likely tokens (0: all), then to the top-``top_p``
    nucleus; at most ``max_new_tokens`` tokens; row i of a call seeded from ``seed``."""

    temperature: float
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 64
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        check_sampling(self.top_p, self.top_k)


class RolloutBackend(Protocol):
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
        """n responses per prompt, grouped consecutively: rows [i*n, (i+1)*n) answer prompts[i].

        Row i is sampled from its own stream seeded by ``row_seed(sampling.seed, row_offset + i)``,
        so a response does not depend on which other prompts share the call (the property that
        makes rollouts sharded over ranks equal to a single-process rollout). ``record_routing``:
        also report the experts each position was routed to, where the backend can. ``record_old``
        (backends that decode with the training model): also the old values the trainer's old pass
        would compute, the entropy of each token's distribution and the log router probabilities of
        the routed experts (``engine_entropy``, ``routed_logp``; with ``record_routing``).
        """

    def sync_weights(self, model) -> None:
        """Make the engine sample from the training model's current weights."""

    def release(self) -> None:
        """Free what the engine holds while training runs (vLLM's sleep mode on GPUs; else nothing)."""

    def wake_kv(self) -> None:
        """After a sync: map the KV cache back (the second stage of a wake; else nothing)."""


def refuse_old_values(backend: str, record_old: bool) -> None:
    """A backend that does not decode with the training model has no old values to record."""
    if record_old:
        raise ValueError(
            f"record_old: the {backend} backend does not decode with the training model, so what it computes "
            "is not the old policy's (rollout.old_values=rollout needs the hf backend)"
        )


def check_sampling(top_p: float, top_k: int) -> None:
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {top_k!r}")


def pack_rows(
    prompt_rows: list[list[int]],
    response_rows: list[list[int]],
    tokenizer,
    texts: list[str] | None = None,
    device: torch.device | str = "cpu",
    logp_rows: list[list[float]] | None = None,
    routing_rows: list[torch.Tensor] | None = None,
) -> RolloutBatch:
    """The canonical batch layout from token lists: prompts left-padded to the longest prompt,
    responses right-padded to the longest response (at least 1), tokens after the first EOS
    masked and replaced by the pad token. ``texts`` default to the decoded responses.
    ``logp_rows`` (the engine's log-prob of each response token) and ``routing_rows`` (per row an
    (L, prompt + response length, K) tensor of the engine's experts) are laid out the same way."""
    if len(prompt_rows) != len(response_rows) or not prompt_rows:
        raise ValueError(
            f"need as many prompt rows as response rows (> 0), got {len(prompt_rows)} and {len(response_rows)}"
        )
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
    response_mask = response_mask_from_ids(response_ids, stop_token_ids(tokenizer)) * within.float()
    attn[:, P:] = response_mask.long()
    ids[:, P:] = torch.where(response_mask.bool(), response_ids, torch.full_like(response_ids, pad))
    if texts is None:
        texts = tokenizer.batch_decode(ids[:, P:], skip_special_tokens=True)
    engine_logp = routed = None
    if logp_rows is not None:
        engine_logp = torch.zeros(len(prompt_rows), R)
        for i, lp in enumerate(logp_rows):
            engine_logp[i, : len(lp)] = torch.tensor(lp, dtype=torch.float32)
        engine_logp = engine_logp * response_mask  # (B, R) 0 after the first stop token
    if routing_rows is not None:
        L, _, K = routing_rows[0].shape
        routed = no_routing(L, len(prompt_rows), P + R, K, routing_rows[0].dtype)
        for i, (p, r, rt) in enumerate(zip(prompt_rows, response_rows, routing_rows)):
            routed[:, i, P - len(p) : P + len(r)] = rt[:, : len(p) + len(r)]
    return RolloutBatch(ids.to(device), attn.to(device), P, response_mask.to(device), list(texts), engine_logp, routed)


def no_routing(layers: int, rows: int, width: int, top_k: int, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    """(L, B, T, K) experts 0..K-1 everywhere: the routing of positions no engine forwarded."""
    return torch.arange(top_k, dtype=dtype).expand(layers, rows, width, top_k).clone()


def stop_token_ids(tokenizer) -> list[int]:
    """Token ids that end a response: EOS and every other special token (pad, bos, unk, ...).

    Special tokens are skipped when a response is decoded for the verifier, so a response that
    drew one and went on would be graded on text that differs from the tokens it is trained on;
    ending the response at the special token keeps the two the same.
    """
    eos = tokenizer.eos_token_id
    ids = list(eos) if isinstance(eos, (list, tuple)) else ([] if eos is None else [eos])
    for i in tokenizer.all_special_ids:
        if i not in ids:
            ids.append(i)
    return ids


def response_mask_from_ids(response_ids: torch.Tensor, eos_token_id: int | list[int] | None) -> torch.Tensor:
    """1 for tokens up to and including the first stop token (``eos_token_id``: one id or a list);
    all ones if there is none.  (B, R) -> (B, R)"""
    if eos_token_id is None:
        return torch.ones_like(response_ids, dtype=torch.float32)
    eos_ids = torch.tensor(eos_token_id if isinstance(eos_token_id, list) else [eos_token_id])
    is_eos = torch.isin(response_ids, eos_ids.to(response_ids.device))
    # tokens strictly after the first EOS are masked: cumulative count of EOS before position t
    before = torch.cumsum(is_eos.long(), dim=1) - is_eos.long()
    return (before == 0).float()
