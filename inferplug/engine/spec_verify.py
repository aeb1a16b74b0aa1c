"""Speculative decoding's verification: the rejection sampling that checks a proposer's tokens.

A decode row with k proposed tokens becomes a (k + 1)-token chunk over its cached prefix: one target
forward gives logits for every proposed position plus one past them. A greedy row accepts a proposal
while it equals the target's argmax (so the tokens are exactly plain greedy's); a sampled row accepts
proposal d, drawn from the proposer's q, with probability min(1, p(d) / q(d)) and on a rejection draws from
max(0, p - q), renormalized: over both branches the token follows the target's p (Leviathan et al. 2023;
Chen et al. 2023). Prompt lookup's q is a point mass at d. The first rejection (or the row past the last
proposal) yields one more token, so a step always adds 1 + accepted tokens. The sampler runs the rows
(engine/sampler.py); each row sees its sequence as if the drafts before it were accepted (`ahead`).
The proposers are engine/spec_decode.py's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from inferplug.engine.sequence import Sequence


@dataclass
class Proposal:
    """A sequence's proposed tokens and, for a sampled draft, q: one row of the proposer's probabilities per
    token ([k, vocab]). None: a point mass at each token (prompt lookup, or a greedy draft)."""

    token_ids: list[int]
    probs: torch.Tensor | None = None


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
