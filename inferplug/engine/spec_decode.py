"""Speculative decoding's proposers: prompt lookup here, a draft model in engine/draft.py. Their proposals
are checked by engine/spec_verify.py's rejection sampling.
"""

from __future__ import annotations

import numpy as np

from inferplug.engine.sequence import Sequence
from inferplug.engine.spec_verify import Proposal

METHODS = ("none", "ngram", "draft")  # the profile's [speculative] method values this engine runs


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
