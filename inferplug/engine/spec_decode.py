"""Speculative decoding: prompt-lookup proposals and the rejection sampling that checks them.

A decode row with k proposed tokens becomes a (k + 1)-token chunk over its cached prefix: one target
forward gives logits for every proposed position plus one past them. A greedy row accepts a proposal
while it equals the target's argmax (so the tokens are exactly plain greedy's); a sampled row accepts
proposal d with probability p(d) (prompt lookup's draft distribution is a point mass at d) and on a
rejection draws from p with d removed, renormalized, which is the target's own distribution (Leviathan et
al. 2023, with q = one-hot). The first rejection (or the row past the last
proposal) yields one more token, so a step always adds 1 + accepted tokens. The sampler runs the rows
(engine/sampler.py); each row sees its sequence as if the drafts before it were accepted (`ahead`).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from inferplug.engine.sequence import Sequence

METHODS = ("none", "ngram")  # the profile's [speculative] method values this engine runs


def make_proposer(config) -> NgramProposer | None:
    """The proposer an EngineConfig asks for, or None (no speculation)."""
    if config.speculative_method not in METHODS:
        raise ValueError(f"speculative method {config.speculative_method!r} is not supported by the native engine; "
                         f"use one of {METHODS}")
    if config.speculative_method == "none":
        return None
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

    def propose(self, seq: Sequence, limit: int) -> list[int]:
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


def accept_or_resample(probs: torch.Tensor, draft: int, generator: torch.Generator | None) -> int:
    """A sampled row's token given a proposed one: the draft with probability p(draft), else a draw from p
    without it (renormalized). Over both branches the token is distributed as p."""
    if float(torch.rand((), generator=generator, device=probs.device)) < float(probs[draft]):
        return draft
    residual = probs.clone()
    residual[draft] = 0.0
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
