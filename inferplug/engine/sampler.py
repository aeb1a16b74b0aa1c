"""Turn each sampling row's logits into a token: penalties, masks, temperature, top-k/p, min-p.

Greedy rows without penalties or logprobs take one batched argmax. Other rows go one by one,
each with its own torch.Generator when seeded, so a seeded sample does not depend on what else
shares the batch. Logprobs are the model's raw log-softmax (before any processing), as in vLLM.
A row that fails (NaN logits, a guide that rejects the token) comes back with `error` set, so the
engine fails that request alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inferplug.engine.sequence import Sequence


@dataclass
class SampleResult:
    token_id: int
    logprob: float | None = None
    top: list[tuple[int, float]] | None = None  # the top-N (id, logprob), when asked for
    error: str | None = None  # set when this row could not be sampled; token_id is then -1


class Sampler:
    def __init__(self, eos_token_ids: list[int]):
        self.eos_token_ids = list(eos_token_ids)

    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[SampleResult]:
        if all(_is_plain_greedy(s) for s in seqs):
            return [SampleResult(t) for t in logits.argmax(dim=-1).tolist()]
        return [self._safe_row(logits[i], seq) for i, seq in enumerate(seqs)]

    def _safe_row(self, raw: torch.Tensor, seq: Sequence) -> SampleResult:
        try:
            return self._sample_row(raw, seq)
        except Exception as exc:  # noqa: BLE001 - one row's failure is its request's, not the batch's
            return SampleResult(-1, error=repr(exc))

    def _sample_row(self, raw: torch.Tensor, seq: Sequence) -> SampleResult:
        p = seq.params
        logits = raw.clone()
        _apply_penalties(logits, seq)
        if seq.num_output_tokens < p.min_tokens:
            banned = set(p.stop_token_ids) | set(self.eos_token_ids)
            logits[list(banned)] = float("-inf")
        if seq.guide is not None:
            seq.guide.fill_mask(logits)
        if p.greedy:
            token = int(logits.argmax())
        else:
            token = _draw(logits, seq)
        if seq.guide is not None and not seq.guide.accept(token):
            raise ValueError(f"the JSON grammar rejected token {token}: no token the grammar allows was sampleable")
        result = SampleResult(token)
        if p.logprobs is not None:
            logprobs = torch.log_softmax(raw, dim=-1)
            result.logprob = float(logprobs[token])
            if p.logprobs:
                values, ids = logprobs.topk(p.logprobs)
                result.top = list(zip(ids.tolist(), values.tolist()))
        return result


def _is_plain_greedy(seq: Sequence) -> bool:
    p = seq.params
    return (
        p.greedy and p.logprobs is None and seq.guide is None and seq.num_output_tokens >= p.min_tokens
        and p.repetition_penalty == 1.0 and p.presence_penalty == 0.0 and p.frequency_penalty == 0.0
    )


def _apply_penalties(logits: torch.Tensor, seq: Sequence) -> None:
    """Repetition (HF/CTRL: prompt and output), presence and frequency (OpenAI: output only)."""
    p = seq.params
    if p.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(seq.token_ids)), dtype=torch.long, device=logits.device)
        values = logits[seen]
        logits[seen] = torch.where(values > 0, values / p.repetition_penalty, values * p.repetition_penalty)
    if (p.presence_penalty or p.frequency_penalty) and seq.num_output_tokens:
        output = torch.tensor(seq.output_ids, dtype=torch.long, device=logits.device)
        counts = torch.bincount(output, minlength=logits.numel()).float()
        logits -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).float()


def _draw(logits: torch.Tensor, seq: Sequence) -> int:
    p = seq.params
    logits = logits / p.temperature
    if p.top_k > 0 and p.top_k < logits.numel():
        kth = logits.topk(p.top_k).values[-1]
        logits[logits < kth] = float("-inf")
    probs = torch.softmax(logits, dim=-1)
    if p.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        outside = (sorted_probs.cumsum(0) - sorted_probs) > p.top_p  # keeps at least the top token
        probs[order[outside]] = 0.0
    if p.min_p > 0.0:
        probs[probs < p.min_p * probs.max()] = 0.0
    return int(torch.multinomial(probs, 1, generator=seq.generator))
