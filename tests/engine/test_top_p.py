"""Top-p among the top candidates keeps exactly the tokens the full sort keeps (engine/top_p.py), at a real
vocabulary's size: peaked and flat rows, ties at the cut, masked tails. The full sort itself is held against
transformers' TopPLogitsWarper in test_sampler_reference.py."""

from __future__ import annotations

import pytest
import torch

from inferplug.engine.top_p import _drop_by_full_sort, _drop_near_the_top, drop_top_p_tail

VOCAB = 49152  # SmolLM2's


def rows() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    out = []
    for scale in (1.0, 3.0, 6.0, 12.0):  # flat to peaked, as temperature makes them
        for _ in range(6):
            row = torch.randn(VOCAB, generator=g) * scale
            out.append(row)
            tied = torch.round(row * 2) / 2  # many ties, at the cut too
            tied[-1000:] = float("-inf")  # a masked tail (top-k, min-p, a grammar)
            out.append(tied)
    return out


@pytest.mark.parametrize("top_p", [0.5, 0.8, 0.9, 0.95, 0.99])
def test_the_candidates_keep_what_the_full_sort_keeps(top_p):
    fast_rows = 0
    for row in rows():
        ours, full = row.clone(), row.clone()
        drop_top_p_tail(ours, top_p)
        _drop_by_full_sort(full, top_p)
        assert torch.equal(ours == float("-inf"), full == float("-inf"))
        fast_rows += _drop_near_the_top(row.clone(), top_p)
    assert fast_rows >= 10  # most rows took the fast path: it is what was compared


def test_a_flat_row_falls_back_to_the_full_sort():
    row = torch.zeros(VOCAB)
    row[:3] = 1.0
    assert not _drop_near_the_top(row.clone(), 0.9)  # the tokens near the top hold far less than 0.9
    ours, full = row.clone(), row.clone()
    drop_top_p_tail(ours, 0.9)
    _drop_by_full_sort(full, 0.9)
    assert torch.equal(ours, full)


def test_a_cut_within_the_margin_falls_back():
    """Two tokens of mass 0.5 each and top_p 0.5: the second's mass above is exactly top_p, a float-rounding
    decision, so the full sort makes it."""
    row = torch.full((VOCAB,), -1e4)
    row[7] = row[9] = 0.0
    assert not _drop_near_the_top(row.clone(), 0.5)
    ours, full = row.clone(), row.clone()
    drop_top_p_tail(ours, 0.5)
    _drop_by_full_sort(full, 0.5)
    assert torch.equal(ours, full)
