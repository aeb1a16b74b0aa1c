"""Tokens drawn through the real sampling path (Sampler.__call__) follow the reference distribution.

10,000 draws per parameter set, from one seeded generator shared by the rows, so the counts are the
same on every run. Pearson's chi-square against transformers' distribution (sampling_reference.py) fails below p = 1e-4; a token the reference gives no mass must never come.
"""

from __future__ import annotations

import pytest
import torch

from inferplug.engine.sampler import Sampler
from tests.engine.sampling_reference import EOS, P_FAIL, ROWS, chi_square_p, reference, row_logits, row_seq

DRAWS = 10_000


def draw_counts(row: int) -> torch.Tensor:
    params, output = ROWS[row]
    raw = row_logits(row)
    generator = torch.Generator().manual_seed(1234 + row)
    seqs = [row_seq(params, output, generator) for _ in range(DRAWS)]
    results = Sampler(eos_token_ids=[EOS])(raw.expand(DRAWS, -1), seqs)
    return torch.bincount(torch.tensor([r.token_id for (r,) in results]), minlength=raw.numel())


# min-p + top-k + top-p; penalties of all three kinds; min_tokens; min-p alone (no top-p cut inside a tie group,
# so transformers' distribution is ours exactly, test_sampler_reference.py)
@pytest.mark.parametrize("row", [2, 3, 6, 8])
def test_draws_follow_the_reference_distribution(row):
    params, output = ROWS[row]
    counts, probs = draw_counts(row), reference(row_logits(row), params, output)
    assert not counts[probs == 0].any(), "a token the reference gives no mass was drawn"
    assert chi_square_p(counts, probs) > P_FAIL
    if row == 3:  # the test has the power to tell the two min-p orders apart
        assert chi_square_p(counts, reference(row_logits(row), params, output, min_p_last=True)) < P_FAIL
