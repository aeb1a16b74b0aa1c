"""inferplug/quality.py: the KL divergence on known distributions, the summary's statistics, llama.cpp's chunking,
the measurement through the real engine (a path against itself, and one that is not), and the shipped text."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from inferplug.quality import (
    CHUNK, PositionStats, chunks, compare_rows, kl_divergence, measure, quality_text, summarize, text_logprobs,
)
from tests.engine.engine_helpers import make_engine


def log(probs: list[list[float]]) -> torch.Tensor:
    return torch.tensor(probs, dtype=torch.float64).log()


def test_kld_of_a_distribution_against_itself_is_zero():
    rows = torch.log_softmax(torch.randn(6, 50, generator=torch.Generator().manual_seed(0)), dim=-1)
    assert kl_divergence(rows, rows).abs().max() < 1e-12


def test_kld_matches_a_hand_computed_case():
    # KL(p || q) = 0.5 ln(0.5 / 0.9) + 0.5 ln(0.5 / 0.1) = 0.5 ln(0.25 / 0.09); and it is not symmetric
    kld = kl_divergence(log([[0.5, 0.5], [0.25, 0.75]]), log([[0.9, 0.1], [0.25, 0.75]]))
    assert kld.tolist() == pytest.approx([0.5 * math.log(0.25 / 0.09), 0.0], abs=1e-12)
    reverse = 0.9 * math.log(0.9 / 0.5) + 0.1 * math.log(0.1 / 0.5)
    assert float(kl_divergence(log([[0.9, 0.1]]), log([[0.5, 0.5]]))[0]) == pytest.approx(reverse, abs=1e-12)


def test_summary_counts_agreement_and_perplexity():
    ref = log([[0.7, 0.2, 0.1], [0.1, 0.6, 0.3], [0.2, 0.3, 0.5], [0.4, 0.4, 0.2]])
    test = log([[0.6, 0.3, 0.1], [0.5, 0.2, 0.3], [0.2, 0.3, 0.5], [0.3, 0.5, 0.2]])
    targets = torch.tensor([0, 1, 2, 1])
    q = summarize(compare_rows(ref, test, targets))
    assert q.positions == 4 and q.top1 == pytest.approx(50.0)  # rows 0 and 2 agree; row 3's tie goes to id 0
    assert q.ppl_ref == pytest.approx(math.exp(-(math.log(0.7) + math.log(0.6) + math.log(0.5) + math.log(0.4)) / 4))
    assert q.ppl == pytest.approx(math.exp(-(math.log(0.6) + math.log(0.2) + math.log(0.5) + math.log(0.5)) / 4))
    klds = kl_divergence(ref, test)
    assert q.mean_kld == pytest.approx(float(klds.mean())) and q.kld_max == pytest.approx(float(klds.max()))
    assert q.kld_se == pytest.approx(float(klds.std()) / 2)
    assert q.top1_se == pytest.approx(100 * math.sqrt(0.25 / 3))


def test_chunks_are_whole_and_the_tail_is_dropped():
    parts = chunks(list(range(1300)), 512)
    assert [len(c) for c in parts] == [512, 512] and parts[1][0] == 512
    assert len(chunks(list(range(5000)), limit=3)) == 3
    with pytest.raises(ValueError, match="fewer than one chunk"):
        chunks(list(range(100)))


def test_an_engine_path_against_itself_is_zero_and_int8_weights_are_not(tiny_llama_dir):
    from inferplug.quant.linear import quantize_model

    token_ids = torch.randint(3, 300, (3 * 128 + 7,), generator=torch.Generator().manual_seed(5)).tolist()
    chunk_list = chunks(token_ids, 128)
    reference = list(text_logprobs(make_engine(tiny_llama_dir, max_num_batched_tokens=48), chunk_list))
    assert [rows.shape for rows, _ in reference] == [torch.Size([63, 320])] * 3  # positions 64..126 of each chunk
    assert reference[0][1].tolist() == chunk_list[0][65:]  # each row scores the token after it
    same = measure(make_engine(tiny_llama_dir, max_num_batched_tokens=128), chunk_list, reference)
    assert same.mean_kld < 1e-9 and same.top1 == 100.0 and same.ppl == pytest.approx(same.ppl_ref, rel=1e-6)
    quantized = make_engine(tiny_llama_dir, max_num_batched_tokens=128)
    quantize_model(quantized.runner.model, "int8")
    worse = measure(quantized, chunk_list, reference)
    assert worse.mean_kld > 1e-7 and worse.positions == 3 * 63


def test_position_stats_concatenate_in_order():
    a = PositionStats(torch.tensor([1.0]), torch.tensor([True]), torch.tensor([0.5]), torch.tensor([0.6]))
    b = PositionStats(torch.tensor([2.0]), torch.tensor([False]), torch.tensor([0.7]), torch.tensor([0.8]))
    both = PositionStats.cat([a, b])
    assert both.kld.tolist() == [1.0, 2.0] and both.agree.tolist() == [True, False]


def test_the_text_ships_as_package_data():
    text = quality_text()
    assert text.startswith("The Book of Esther") and len(text.split()) > 5000
    pyproject = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    assert '"data/**/*"' in pyproject  # the wheel carries inferplug/data/quality/


@pytest.mark.smollm2
def test_the_text_is_over_4000_smollm2_tokens(smollm2_gguf):
    from inferplug.models.loader import load_tokenizer

    tokens = load_tokenizer(smollm2_gguf).encode(quality_text(), add_special_tokens=False)
    assert len(tokens) >= 4000 and len(tokens) // CHUNK >= 8
