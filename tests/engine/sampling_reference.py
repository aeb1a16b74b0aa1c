"""The reference the sampler tests compare with: transformers' logits processors in `generate()`'s
order, with vLLM's choices where we follow vLLM (see test_sampler_reference.py), on rows of logits
with ties and extreme values, each with its own parameters; and the chi-square test the statistics tests
(test_sampler_statistics.py, test_spec_decode_statistics.py) draw against it."""

from __future__ import annotations

import torch
import transformers.generation.logits_process as tp

from inferplug.engine.sequence import Sequence
from inferplug.types import SamplingParams

VOCAB, EOS, STOP = 48, 2, 7
PROMPT = [3, 4, 5, 11, 11, 20, 31]
HUGE_ROWS = {9, 11}


def row_logits(seed: int) -> torch.Tensor:
    """Half-integer logits (many ties), a tiny one, a few -inf (a masked vocabulary tail); the rows in
    HUGE_ROWS also have a huge one, which takes nearly all the mass."""
    g = torch.Generator().manual_seed(seed)
    row = torch.round(torch.randn(VOCAB, generator=g) * 2) / 2
    row[torch.randint(VOCAB, (1,), generator=g)] = -1e4
    if seed in HUGE_ROWS:
        row[torch.randint(VOCAB, (1,), generator=g)] = 1e3
    row[-3:] = float("-inf")
    return row


# (params, output tokens so far)
ROWS = [
    (SamplingParams(temperature=0.7, top_k=5), []),
    (SamplingParams(temperature=1.3, top_p=0.9), [9]),
    (SamplingParams(temperature=1.0, min_p=0.05), []),
    (SamplingParams(temperature=0.8, top_k=12, top_p=0.8, min_p=0.1), [1, 1]),  # vLLM's min-p order shows
    (SamplingParams(temperature=1.0, repetition_penalty=1.3), [4, 9]),
    (SamplingParams(temperature=0.9, repetition_penalty=0.8, top_p=0.95), [6]),
    (SamplingParams(temperature=1.1, presence_penalty=0.5, frequency_penalty=0.3, repetition_penalty=1.2,
                    top_k=20), [8, 8, 8, 12, 3]),
    (SamplingParams(temperature=1.0, presence_penalty=-0.7, frequency_penalty=-0.4, top_p=0.7), [0, 0, 15]),
    (SamplingParams(temperature=0.6, min_tokens=3, stop_token_ids=[STOP], top_k=20), [13]),
    (SamplingParams(temperature=0.5, top_p=0.5, min_p=0.2), []),
    (SamplingParams(temperature=2.0, top_k=1), [5]),
    (SamplingParams(temperature=0.05, top_p=0.99), []),
]


def row_seq(params: SamplingParams, output: list[int], generator: torch.Generator | None = None) -> Sequence:
    return Sequence("r", 0, list(PROMPT), params, max_tokens=64, token_ids=PROMPT + output, generator=generator)


def openai_penalties(logits: torch.Tensor, output: list[int], presence: float, frequency: float) -> torch.Tensor:
    """logit - presence * [count > 0] - frequency * count, counts over the generated tokens."""
    out = logits.clone()
    for token in set(output):
        count = output.count(token)
        out[token] = out[token] - presence * (count > 0) - frequency * count
    return out


def hf_processors(p: SamplingParams, min_p_last: bool = False) -> tuple[list, list]:
    """transformers' processors for p, before and after the presence/frequency step."""
    before = []
    if p.repetition_penalty != 1.0:
        before.append(tp.RepetitionPenaltyLogitsProcessor(p.repetition_penalty))
    if p.min_tokens:
        before.append(tp.MinNewTokensLengthLogitsProcessor(len(PROMPT), p.min_tokens, [EOS, *p.stop_token_ids]))
    if p.greedy:
        return before, []
    after = [tp.TemperatureLogitsWarper(p.temperature)]
    min_p = [tp.MinPLogitsWarper(p.min_p)] if p.min_p > 0 else []
    after += [] if min_p_last else min_p
    if p.top_k > 0:
        after.append(tp.TopKLogitsWarper(p.top_k))
    if p.top_p < 1.0:
        after.append(tp.TopPLogitsWarper(p.top_p))
    return before, after + (min_p if min_p_last else [])


def reference(raw: torch.Tensor, p: SamplingParams, output: list[int], min_p_last: bool = False) -> torch.Tensor:
    """The processed logits (greedy) or the probabilities (sampled) that transformers gives."""
    input_ids = torch.tensor([PROMPT + output])
    before, after = hf_processors(p, min_p_last)
    scores = raw[None].clone()
    for processor in before:
        scores = processor(input_ids, scores)
    scores = openai_penalties(scores[0], output, p.presence_penalty, p.frequency_penalty)[None]
    if p.greedy:
        return scores[0]
    for warper in after:
        scores = warper(input_ids, scores)
    return torch.softmax(scores[0], dim=-1)


P_FAIL = 1e-4  # the statistics tests fail below this p-value of Pearson's chi-square


def chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's test of counts against probs; bins expecting fewer than 5 draws are pooled into one."""
    expected = probs.double() * counts.sum()
    small = expected < 5
    observed = torch.cat([counts[~small], counts[small].sum()[None]]).double()
    expected = torch.cat([expected[~small], expected[small].sum()[None]])
    keep = expected > 0
    statistic = ((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum()
    dof = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), statistic / 2))
