"""The judgment's metrics (inferplug/benchmark/rag_fidelity.py): SQuAD's token F1, the bootstrap interval, and
the per-token fidelity of one answer."""

from __future__ import annotations

import math

import pytest
import torch

from inferplug.benchmark.rag_fidelity import answer_fidelity, bootstrap_mean, f1_score


@pytest.mark.parametrize("prediction, gold, expected", [
    ("Finn Frost, Northam", "Finn Frost, Northam", 1.0),
    ("The bell foundry was founded by Finn Frost.", "Finn Frost", 2 * (2 / 7) / (2 / 7 + 1)),  # 7 words, no "the"
    ("Northam", "Pellin", 0.0),
    ("", "Pellin", 0.0),
    ("the the the", "Pellin", 0.0),
])
def test_f1_is_squad_token_f1(prediction, gold, expected):
    assert f1_score(prediction, gold) == pytest.approx(expected)


def test_the_bootstrap_interval_holds_the_mean_and_narrows_with_more_queries():
    gen = torch.Generator().manual_seed(1)
    small = (torch.randn(40, generator=gen) * 0.2).tolist()
    large = (torch.randn(400, generator=gen) * 0.2).tolist()
    mean, low, high = bootstrap_mean(small)
    assert low < mean < high and mean == pytest.approx(sum(small) / len(small))
    assert bootstrap_mean(small) == (mean, low, high)  # seeded: the same interval every run
    *_, low_large, high_large = bootstrap_mean(large)
    assert high_large - low_large < (high - low) / 2  # ~1/sqrt(n): 10x the queries, ~1/3 the width
    assert bootstrap_mean([0.5] * 20) == (0.5, 0.5, 0.5)


def test_answer_fidelity_is_zero_for_equal_rows_and_kl_otherwise():
    full = torch.log_softmax(torch.tensor([[2.0, 1.0, 0.0], [0.0, 3.0, 0.0]]), dim=-1)
    same = answer_fidelity(full, full.clone(), [0, 1])
    assert same.kld.tolist() == [0.0, 0.0] and same.agree.all() and same.logprob_full == same.logprob_test
    other = torch.log_softmax(torch.tensor([[1.0, 2.0, 0.0], [0.0, 3.0, 0.0]]), dim=-1)
    moved = answer_fidelity(full, other, [0, 1])
    p = full[0].exp()
    assert moved.kld[0].item() == pytest.approx((p * (full[0] - other[0])).sum().item())
    assert moved.agree.tolist() == [False, True]
    assert moved.logprob_test - moved.logprob_full == pytest.approx(other[0, 0].item() - full[0, 0].item())
    assert math.isclose(moved.kld[1].item(), 0.0, abs_tol=1e-12)
