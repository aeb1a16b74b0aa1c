"""Arrival processes and workload generation."""

import json
import math
import statistics

import pytest

from inferplug.benchmark.arrivals import arrival_offsets
from inferplug.benchmark.datasets import read_sharegpt_pairs, sample_random, sharegpt_requests
from inferplug.errors import InferPlugError


def test_infinite_rate_sends_everything_at_once():
    assert arrival_offsets(5, math.inf) == [0.0] * 5


@pytest.mark.parametrize("burstiness", [0.5, 1.0, 4.0])
def test_gamma_arrivals_have_the_requested_mean_rate(burstiness):
    offsets = arrival_offsets(4000, request_rate=10.0, burstiness=burstiness, seed=3)
    gaps = [b - a for a, b in zip(offsets, offsets[1:])]
    assert offsets[0] == 0.0
    assert statistics.mean(gaps) == pytest.approx(0.1, rel=0.1)
    # Gamma(k, theta) has coefficient of variation 1/sqrt(k): burstier arrivals for smaller k.
    assert statistics.stdev(gaps) / statistics.mean(gaps) == pytest.approx(burstiness**-0.5, rel=0.15)


def test_arrivals_are_reproducible():
    assert arrival_offsets(10, 5.0, seed=7) == arrival_offsets(10, 5.0, seed=7)


@pytest.mark.parametrize("rate", [0.0, -1.0, math.nan])
def test_bad_rate(rate):
    with pytest.raises(InferPlugError, match="--request-rate"):
        arrival_offsets(3, rate)


def test_random_prompts_with_tokenizer(tiny_llama_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama_dir)
    reqs = sample_random(20, input_len=40, output_len=10, range_ratio=0.5, prefix_len=8, tokenizer=tok, seed=1)
    assert len(reqs) == 20
    prefix = reqs[0].prompt_ids[:8]
    for r in reqs:
        assert r.prompt_ids[:8] == prefix and r.prompt_len == len(r.prompt_ids)
        assert 8 + 20 <= r.prompt_len <= 8 + 60 and 5 <= r.output_len <= 15
        assert not set(r.prompt_ids) & set(tok.all_special_ids)


def test_random_prompts_without_tokenizer_use_words():
    reqs = sample_random(3, input_len=12, output_len=4)
    assert all(len(r.prompt.split()) == 12 and r.prompt_ids is None and r.output_len == 4 for r in reqs)


def test_random_prompts_behind_several_prefixes():
    reqs = sample_random(16, input_len=6, output_len=4, prefix_len=10, seed=3, num_prefixes=8)
    prefixes = [" ".join(r.prompt.split()[:10]) for r in reqs]
    assert len(set(prefixes)) == 8 and all(prefixes[i] == prefixes[i + 8] for i in range(8))
    assert sample_random(4, 6, 4, prefix_len=10, seed=3) == sample_random(4, 6, 4, prefix_len=10, seed=3,
                                                                        num_prefixes=1)


def _sharegpt(tmp_path, data) -> str:
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return str(path)


def test_sharegpt_file(tmp_path):
    conv = lambda q, a: {"conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": a}]}
    data = [conv("Tell me a long story about " + str(i) * 30, "Once upon a time " * 5) for i in range(10)]
    data.append({"conversations": [{"from": "human", "value": "only one turn"}]})
    pairs = read_sharegpt_pairs(_sharegpt(tmp_path, data))
    assert len(pairs) == 10
    reqs = sharegpt_requests(pairs, 4, output_len=16)
    assert len(reqs) == 4 and all(r.output_len == 16 and r.prompt.startswith("Tell me") for r in reqs)


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "not valid JSON"),
        ({"conversations": []}, "got a dict"),
        ([{"conversations": [{"from": "human", "value": "hi"}]}], "no entry has two text turns"),
        ([1, 2, 3], "no entry has two text turns"),
    ],
)
def test_malformed_sharegpt_file(tmp_path, content, message):
    with pytest.raises(InferPlugError, match=message):
        read_sharegpt_pairs(_sharegpt(tmp_path, content))


def test_missing_sharegpt_file(tmp_path):
    with pytest.raises(InferPlugError, match="no such file"):
        read_sharegpt_pairs(tmp_path / "nope.json")
