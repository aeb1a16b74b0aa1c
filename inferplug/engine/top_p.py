"""Top-p (nucleus) filtering of one logits row, without sorting the whole vocabulary where it can be avoided.

The rule (transformers' and vLLM's): sort ascending, and drop the low tail while its mass, this token included, is
<= 1 - top_p; the top token always stays. A tie at the cut drops its lower ids (a stable sort, the same on every
device), where transformers and vLLM leave it to an unstable sort.

A stable sort of 49k logits costs ~3.4 ms of one core, per sampled row and step: more than the rest of a
SmolLM2 step's sampling, and a third of its whole decode step at batch 1. The kept tokens are nearly always a few
of the largest, so the cut is first looked for among the tokens whose logits are within a few nats of the top
one: a token is dropped exactly when the mass ranked above it reaches top_p, so once the mass of the tokens above
some value reaches top_p, no token at or below it can stay. The result is the full sort's unless a decision falls
within MARGIN of the cut, where float rounding could decide it either way: then (and where the candidates' mass is
short of top_p, or they are too many) the full sort runs.
"""

from __future__ import annotations

import torch

WITHIN = (4.0, 8.0, 16.0)  # the candidates: the tokens within this many nats of the top logit, tried in turn
MAX_CANDIDATES = 4096  # more (a flat row) and the full sort is as quick
MARGIN = 1e-4  # far above the float32 rounding of a cumulative mass (~1e-6), far below any top_p a user sets


def drop_top_p_tail(logits: torch.Tensor, top_p: float) -> None:
    """Set the logits of the tokens top_p drops to -inf, in place (a 1-D row)."""
    if not _drop_near_the_top(logits, top_p):
        _drop_by_full_sort(logits, top_p)


def _drop_near_the_top(logits: torch.Tensor, top_p: float) -> bool:
    """The cut found among the tokens within WITHIN nats of the top logit (True), or False: the full sort decides."""
    if logits.device.type != "cpu":  # on a GPU the sort is cheap and each step below would sync with the host
        return False
    top = logits.max()
    if not torch.isfinite(top):
        return False
    total = float(torch.exp(logits - top).sum())  # softmax's denominator
    for below in WITHIN:
        ids = (logits > top - below).nonzero().squeeze(1)
        if len(ids) > MAX_CANDIDATES:
            return False
        if _drop_among_candidates(logits, top_p, ids, top, total):
            return True
    return False


def _drop_by_full_sort(logits: torch.Tensor, top_p: float) -> None:
    ascending, order = logits.sort(stable=True)
    tail = ascending.softmax(dim=-1).cumsum(dim=-1) <= 1.0 - top_p
    tail[-1] = False
    logits[order[tail]] = float("-inf")


def _drop_among_candidates(logits: torch.Tensor, top_p: float, ids: torch.Tensor, top: torch.Tensor,
                           total: float) -> bool:
    """The cut found among the candidates `ids`, every token whose logit is above some value (True), or False when
    they cannot decide it."""
    values = logits[ids]
    mass = torch.exp((values - top).double()) / total  # the candidates' probabilities
    if float(mass.sum()) < top_p + MARGIN:
        return False
    ascending = values.sort(stable=True).indices  # ids ascend: a tie drops its lower ids first, as the full sort
    ranked, mass = ids[ascending], mass[ascending]  # the candidates in the full sort's order, lowest first
    above = mass.flip(0).cumsum(0).flip(0) - mass  # the mass ranked above each candidate
    if bool(((above - top_p).abs() < MARGIN).any()):
        return False
    kept = ranked[above < top_p]
    kept_values = logits[kept]
    logits.fill_(float("-inf"))
    logits[kept] = kept_values
    return True
