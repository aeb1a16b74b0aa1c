"""Speculative decoding: the proposers (prompt lookup here, a draft model in engine/draft.py) and the
rejection sampling that checks their proposals.

A decode row with k proposed tokens becomes a (k + 1)-token chunk over its cached prefix: one target
forward gives logits for every proposed position plus one past them. A greedy row accepts a proposal
while it equals the target's argmax (so the tokens are exactly plain greedy's); a sampled row accepts
proposal d, drawn from the proposer's q, with probability min(1, p(d) / q(d)) and on a rejection draws from
max(0, p - q), renormalized: over both branches the token follows the target's p (Leviathan et al. 2023;
Chen et al. 2023). Prompt lookup's q is a point mass at d. The first rejection (or the row past the last
proposal) yields one more token, so a step always adds 1 + accepted tokens. The sampler runs the rows
(engine/sampler.py); each row sees its sequence as if the drafts before it were accepted (`ahead`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from inferplug.engine.sequence import Sequence

METHODS = ("none", "ngram", "draft")  # the profile's [speculative] method values this engine runs


@dataclass
class Proposal:
    """A sequence's proposed tokens and, for a sampled draft, q: one row of the proposer's probabilities per
    token ([k, vocab]). None: a point mass at each token (prompt lookup, or a greedy draft)."""

    token_ids: list[int]
    probs: torch.Tensor | None = None


def make_proposer(config, draft=None, eos_token_ids=()):
    """The proposer an EngineConfig asks for, or None (no speculation). `draft`: the engine/draft.DraftModel
    that method "draft" runs."""
    method = config.speculative_method
    if method not in METHODS:
        raise ValueError(f"speculative method {method!r} is not supported by the native engine; use one of {METHODS}")
    if (draft is not None) != (method == "draft"):
        raise ValueError(f'speculative method {method!r} with{"" if draft else "out"} a draft model: '
                         'give a draft model exactly when the method is "draft"')
    if method == "none":
        return None
    if method == "draft":
        from inferplug.engine.draft import DraftProposer

        return DraftProposer(draft, config, list(eos_token_ids))
    return NgramProposer(config.num_speculative_tokens, config.ngram_min, config.ngram_max)


def spec_stats(counts) -> dict[str, float]:
    """Acceptance figures of a scheduler's or a sequence's counts (num_draft_tokens, num_accepted_tokens,
    num_spec_steps): the accepted share of proposals, and the tokens a verification step yields on average
    (accepted + 1). Empty when nothing was proposed."""
    if not counts.num_spec_steps:
        return {}
    return {
        "spec_draft_tokens": counts.num_draft_tokens,
        "spec_accepted_tokens": counts.num_accepted_tokens,
        "spec_acceptance_rate": counts.num_accepted_tokens / max(counts.num_draft_tokens, 1),
        "spec_mean_accepted_length": 1 + counts.num_accepted_tokens / counts.num_spec_steps,
    }


class NgramProposer:
    """Prompt lookup (Saxena 2023; vLLM's ngram proposer): find an earlier occurrence of the sequence's last n
    tokens (n from ngram_max down to ngram_min) and propose the tokens that followed it."""

    def __init__(self, num_tokens: int, ngram_min: int, ngram_max: int):
        self.num_tokens, self.ngram_min, self.ngram_max = num_tokens, ngram_min, ngram_max

    pools = ()  # prompt lookup holds no KV

    def propose(self, seqs: list[Sequence], limits: list[int]) -> list[Proposal]:
        return [Proposal(self.lookup(seq, limit)) for seq, limit in zip(seqs, limits)]

    def release(self, seq: Sequence) -> None:
        """Nothing to free: prompt lookup keeps no state per sequence."""

    def lookup(self, seq: Sequence, limit: int) -> list[int]:
        """Up to min(num_tokens, limit) tokens; none for a constrained (guided) sequence, whose grammar state
        cannot look ahead."""
        k = min(self.num_tokens, limit)
        if k <= 0 or seq.guide is not None:
            return []
        tokens = np.asarray(seq.token_ids, dtype=np.int64)
        for n in range(min(self.ngram_max, len(tokens) - 1), self.ngram_min - 1, -1):
            # windows over tokens[:-1]: a match must have at least one token after it
            windows = np.lib.stride_tricks.sliding_window_view(tokens[:-1], n)
            hits = np.flatnonzero((windows == tokens[-n:]).all(axis=1))
            if hits.size:
                # the latest match with k tokens after it (a match just before the end, as in a repeating
                # run, has fewer), else the earliest, whose continuation is longest
                full = hits[hits + n + k <= len(tokens)]
                start = int(full[-1] if full.size else hits[0]) + n
                return tokens[start:start + k].tolist()
        return []


def accept_or_resample(probs: torch.Tensor, draft: int, generator: torch.Generator | None,
                       q: torch.Tensor | None = None) -> int:
    """A sampled row's token given a proposed one drawn from q (None: a point mass at the draft): the draft with
    probability min(1, p(draft) / q(draft)), else a draw from max(0, p - q) renormalized. Over both branches
    the token is distributed as p."""
    q_draft = 1.0 if q is None else float(q[draft])
    if float(torch.rand((), generator=generator, device=probs.device)) * q_draft < float(probs[draft]):
        return draft
    residual = probs.clone()
    if q is None:
        residual[draft] = 0.0
    else:
        residual = (residual - q).clamp_(min=0.0)
    if float(residual.sum()) <= 0.0:  # p == q up to rounding: the draft was accepted with probability 1
        return draft
    return int(torch.multinomial(residual / residual.sum(), 1, generator=generator))


def greedy_accept(targets: list[int], drafts: list[int]) -> list[int]:
    """Plain greedy's tokens: the target argmaxes up to and including the first that differs from a draft."""
    for i, d in enumerate(drafts):
        if targets[i] != d:
            return targets[: i + 1]
    return targets[: len(drafts) + 1]


def ahead(seq: Sequence, drafts: list[int]) -> Sequence:
    """seq as it would be with the drafts appended (a new, shallow copy; seq itself is not touched)."""
    return dataclasses.replace(seq, token_ids=seq.token_ids + drafts)
