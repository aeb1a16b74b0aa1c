"""Turn each sampling row's logits into a token: penalties, logit_bias, masks, temperature, min-p, top-k/p.

Greedy rows without penalties or logprobs take one batched argmax. Other rows go one by one,
each with its own torch.Generator when seeded, so a seeded sample does not depend on what else
shares the batch. Logprobs are the model's raw log-softmax (before any processing), as in vLLM.
`processed_logits` (what greedy takes the argmax of) and `sampling_probs` (what a sampled row
draws from) are the whole semantics; tests/engine/test_sampler_reference.py holds them against
transformers' logits processors and vLLM's order.
A row that fails (NaN logits, a guide that rejects the token) comes back with `error` set, so the
engine fails that request alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inferplug.engine.sequence import Sequence
from inferplug.engine.spec_verify import accept_or_resample, ahead, greedy_accept
from inferplug.engine.top_p import drop_top_p_tail
from inferplug.types import SamplingParams


@dataclass
class SampleResult:
    token_id: int
    logprob: float | None = None
    top: list[tuple[int, float]] | None = None  # the top-N (id, logprob), when asked for
    error: str | None = None  # set when this row could not be sampled; token_id is then -1
    beam_logprobs: torch.Tensor | None = None  # a beam's processed log-probs row; token_id is then -1


class Sampler:
    def __init__(self, eos_token_ids: list[int]):
        self.eos_token_ids = list(eos_token_ids)

    def __call__(self, logits: torch.Tensor, seqs: list[Sequence], drafts: list[list[int]] | None = None,
                 draft_probs: list[torch.Tensor | None] | None = None) -> list[list[SampleResult]]:
        """Each sequence's tokens. Without drafts: one logits row and one token each. With k drafts a sequence
        has k + 1 rows and gets the accepted drafts plus one more token (engine/spec_verify.py); draft_probs
        holds each sequence's q rows ([k, vocab]) where its drafts were sampled, None for point masses."""
        drafts = drafts or [[] for _ in seqs]
        draft_probs = draft_probs or [None] * len(seqs)
        sizes = [len(d) + 1 for d in drafts]
        if all(_is_plain_greedy(s) for s in seqs):
            targets = logits.argmax(dim=-1).tolist()
            starts = [sum(sizes[:i]) for i in range(len(sizes))]
            return [[SampleResult(t) for t in greedy_accept(targets[r:r + n], d)]
                    for r, n, d in zip(starts, sizes, drafts)]
        return [self._safe_rows(rows, seq, d, q) for rows, seq, d, q in zip(logits.split(sizes), seqs, drafts, draft_probs)]

    def _safe_rows(self, rows: torch.Tensor, seq: Sequence, drafts: list[int], q) -> list[SampleResult]:
        try:
            return self._sample_rows(rows, seq, drafts, q)
        except Exception as exc:  # noqa: BLE001 - one row's failure is its request's, not the batch's
            return [SampleResult(-1, error=repr(exc))]

    def _sample_rows(self, rows: torch.Tensor, seq: Sequence, drafts: list[int], q) -> list[SampleResult]:
        """Row i sees seq with drafts[:i] appended (penalties, min_tokens); stops at the first rejected draft."""
        p = seq.params
        if p.use_beam_search:  # the beam search picks the tokens (engine/beam_search.py), from log-probs
            logprobs = torch.log_softmax(rows[0].float(), dim=-1)
            return [SampleResult(-1, beam_logprobs=processed_logits(logprobs, seq, self.eos_token_ids))]
        results = []
        for i, raw in enumerate(rows):
            logits = processed_logits(raw, seq if i == 0 else ahead(seq, drafts[:i]), self.eos_token_ids)
            if p.greedy:
                token = int(logits.argmax())
            elif i < len(drafts):
                token = accept_or_resample(sampling_probs(logits, p), drafts[i], seq.generator,
                                           None if q is None else q[i])
            else:
                token = _draw(sampling_probs(logits, p), seq.generator)
            if seq.guide is not None and not seq.guide.accept(token):
                raise ValueError(f"the JSON grammar rejected token {token}: no token the grammar allows was sampleable")
            results.append(_result(raw, p, token))
            if i == len(drafts) or token != drafts[i]:
                break
        return results


def _draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token drawn from `probs`, among the tokens it can give: multinomial draws an exponential for every entry
    (~0.8 ms a row over 49k), and top-p or top-k leave a few hundred. On a GPU the whole row (nonzero would add a
    host sync)."""
    if probs.device.type != "cpu":
        return int(torch.multinomial(probs, 1, generator=generator))
    kept = probs.nonzero().squeeze(1)
    return int(kept[torch.multinomial(probs[kept], 1, generator=generator)])


def _result(raw: torch.Tensor, p: SamplingParams, token: int) -> SampleResult:
    result = SampleResult(token)
    if p.logprobs is not None:
        logprobs = torch.log_softmax(raw, dim=-1)
        result.logprob = float(logprobs[token])
        if p.logprobs:
            values, ids = logprobs.topk(p.logprobs)
            result.top = list(zip(ids.tolist(), values.tolist()))
    return result


def processed_logits(raw: torch.Tensor, seq: Sequence, eos_token_ids: list[int]) -> torch.Tensor:
    """One row's logits after penalties, logit_bias, the min_tokens ban and the grammar mask (a new tensor)."""
    p = seq.params
    logits = raw.clone()
    _apply_penalties(logits, seq)
    if p.logit_bias:
        if seq.logit_bias_rows is None:  # once a sequence, not a step: a bias may name thousands of tokens
            seq.logit_bias_rows = (torch.tensor(list(p.logit_bias), dtype=torch.long, device=logits.device),
                                   torch.tensor(list(p.logit_bias.values()), dtype=logits.dtype, device=logits.device))
        ids, values = seq.logit_bias_rows
        logits[ids] += values
    if seq.num_output_tokens < p.min_tokens:  # as vLLM: every stop id, EOS included, whatever ignore_eos says
        logits[sorted(set(p.stop_token_ids) | set(eos_token_ids))] = float("-inf")
    if seq.guide is not None:
        seq.guide.fill_mask(logits)
    return logits


def _is_plain_greedy(seq: Sequence) -> bool:
    p = seq.params
    return (
        p.greedy and not p.use_beam_search and p.logprobs is None and seq.guide is None
        and seq.num_output_tokens >= p.min_tokens and not p.logit_bias
        and p.repetition_penalty == 1.0 and p.presence_penalty == 0.0 and p.frequency_penalty == 0.0
    )


def _apply_penalties(logits: torch.Tensor, seq: Sequence) -> None:
    """Repetition (HF/CTRL: prompt and output), presence and frequency (OpenAI: output only)."""
    p = seq.params
    if p.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(seq.token_ids)), dtype=torch.long, device=logits.device)
        values = logits[seen]
        # a tiny penalty would lift a positive logit to inf, and softmax would give NaN: the largest float instead
        boosted = (values / p.repetition_penalty).clamp(max=torch.finfo(logits.dtype).max)
        logits[seen] = torch.where(values > 0, boosted, values * p.repetition_penalty)
    if (p.presence_penalty or p.frequency_penalty) and seq.num_output_tokens:
        output = torch.tensor(seq.output_ids, dtype=torch.long, device=logits.device)
        counts = torch.bincount(output, minlength=logits.numel()).float()
        logits -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).float()


def sampling_probs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """The distribution a sampled row draws from: temperature, then min-p, top-k, top-p (vLLM v1's order;
    transformers runs min-p last, which differs when min-p and top-p are both set)."""
    logits = logits / p.temperature
    if p.min_p > 0.0:
        probs = torch.softmax(logits, dim=-1)
        logits[probs < p.min_p * probs.max()] = float("-inf")
    if 0 < p.top_k < logits.numel():
        logits[logits < logits.topk(p.top_k).values[-1]] = float("-inf")  # ties with the k-th stay
    if p.top_p < 1.0:
        drop_top_p_tail(logits, p.top_p)
    return torch.softmax(logits, dim=-1)
