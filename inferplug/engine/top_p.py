"""Top-p (nucleus) filtering of one logits row, without sorting the whole vocabulary where it can be avoided.

The rule (transformers' and vLLM's): sort ascending, and drop the low tail while its mass, this token included, is
<= 1 - top_p; the top token always stays. A tie at the cut drops its lower ids (a stable sort, the same on every
device), where transformers and vLLM leave it to an unstable sort.

A stable sort of 49k logits costs ~3.4 ms of one core, per sampled row and step: more than the rest of a
SmolLM2 step's sampling, and a third of its whole decode step at batch 1. The kept tokens are nearly always a few
of the largest, so the cut is first looked for among the top CANDIDATES: a token is dropped exactly when the mass
ranked above it reaches top_p, so once the candidates' mass reaches top_p no other token can stay. The result is
the full sort's unless a decision falls within MARGIN of the cut, where float rounding could decide it either way:
then (and where the candidates' mass is short of top_p) the full sort runs.
"""

from __future__ import annotations

import torch

CANDIDATES = 1024
MARGIN = 1e-4  # far above the float32 rounding of a cumulative mass (~1e-6), far below any top_p a user sets


def drop_top_p_tail(logits: torch.Tensor, top_p: float) -> None:
    """Set the logits of the tokens top_p drops to -inf, in place (a 1-D row)."""
    if not _drop_among_candidates(logits, top_p):
        _drop_by_full_sort(logits, top_p)


def _drop_by_full_sort(logits: torch.Tensor, top_p: float) -> None:
    ascending, order = logits.sort(stable=True)
    tail = ascending.softmax(dim=-1).cumsum(dim=-1) <= 1.0 - top_p
    tail[-1] = False
    logits[order[tail]] = float("-inf")


def _drop_among_candidates(logits: torch.Tensor, top_p: float) -> bool:
    """The cut found among the top candidates (True), or False when the full sort must decide."""
    if logits.numel() <= CANDIDATES:
        return False
    probs = torch.softmax(logits.double(), dim=-1)
    values, ids = probs.topk(CANDIDATES)
    ids = ids[values > values[-1]]  # strictly above the last candidate: a tie there may hold tokens left out
    if float(probs[ids].sum()) < top_p + MARGIN:
        return False
    ids = ids.sort().values  # ascending ids, so that the stable sort below drops a tie's lower ids first
    ascending = logits[ids].sort(stable=True).indices
    ranked = ids[ascending]  # the candidates in the full sort's order, lowest first
    above = probs[ranked].flip(0).cumsum(0).flip(0) - probs[ranked]  # the mass ranked above each candidate
    if bool(((above - top_p).abs() < MARGIN).any()):
        return False
    keep = torch.zeros_like(logits, dtype=torch.bool)
    keep[ranked[above < top_p]] = True
    logits[~keep] = float("-inf")
    return True
