"""Metric arithmetic on a hand-made trace whose answers are worked out by hand."""

import math
import random

import numpy as np
import pytest

from inferplug.benchmark.metrics import RequestRecord, compute_metrics, parse_goodput, percentile
from inferplug.errors import InferPlugError


def trace() -> list[RequestRecord]:
    return [
        # ttft 100 ms, tpot (400-100)/(3-1) = 150 ms, itls 100 and 200 ms
        RequestRecord(prompt_len=10, start=0.0, chunk_times=[0.1, 0.2, 0.4], end=0.4, output_len=3,
                      cached_tokens=5, success=True),
        # ttft 300 ms, tpot 100 ms, itl 100 ms
        RequestRecord(prompt_len=20, start=0.5, chunk_times=[0.8, 0.9], end=0.9, output_len=2, success=True),
        RequestRecord(prompt_len=99, start=0.6, end=0.7, error="boom"),
        # one token: ttft 50 ms, no tpot, no itl
        RequestRecord(prompt_len=6, start=1.0, chunk_times=[1.05], end=1.05, output_len=1, success=True),
    ]


def test_per_request_definitions():
    a = trace()[0]
    assert a.ttft == pytest.approx(0.1)
    assert a.tpot == pytest.approx(0.15)
    assert a.itls == pytest.approx([0.1, 0.2])
    assert a.e2el == pytest.approx(0.4)
    assert trace()[3].tpot is None and trace()[3].itls == []


def test_aggregate_metrics():
    m = compute_metrics(trace(), duration_s=2.0)
    assert (m.completed, m.failed) == (3, 1)
    assert (m.total_input_tokens, m.total_output_tokens) == (36, 6)
    assert m.request_throughput == pytest.approx(1.5)
    assert m.output_throughput == pytest.approx(3.0)
    assert m.total_token_throughput == pytest.approx(21.0)
    assert m.prefix_cache_hit_rate == pytest.approx(5 / 36)
    assert m.goodput is None
    # TTFT ms [50, 100, 300]: p90 at rank 1.8 -> 100 + 0.8 * 200
    assert (m.ttft_ms.mean, m.ttft_ms.median, m.ttft_ms.p90, m.ttft_ms.p99) == pytest.approx((150, 100, 260, 296))
    assert (m.tpot_ms.mean, m.tpot_ms.median, m.tpot_ms.p90, m.tpot_ms.p99) == pytest.approx((125, 125, 145, 149.5))
    assert (m.itl_ms.mean, m.itl_ms.median, m.itl_ms.p90) == pytest.approx((400 / 3, 100, 180))
    assert (m.e2el_ms.mean, m.e2el_ms.median) == pytest.approx((850 / 3, 400))


@pytest.mark.parametrize(
    "slos, good",
    [
        ({"ttft": 200}, 2),  # B's 300 ms TTFT misses
        ({"tpot": 120}, 2),  # A's 150 ms TPOT misses; D has no TPOT and cannot miss it
        ({"ttft": 200, "tpot": 120}, 1),  # only D meets both
        ({"e2el": 1000}, 3),
    ],
)
def test_goodput(slos, good):
    assert compute_metrics(trace(), 2.0, slos).goodput == pytest.approx(good / 2.0)


def test_percentile_matches_numpy_linear():
    rng = random.Random(1)
    for n in (1, 2, 7, 100):
        values = sorted(rng.random() for _ in range(n))
        for q in (0, 50, 90, 99, 100):
            assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_no_samples_is_nan_not_a_crash():
    m = compute_metrics([RequestRecord(prompt_len=3, start=0.0, error="x")], 1.0)
    assert m.completed == 0 and m.failed == 1 and math.isnan(m.ttft_ms.mean)


def test_parse_goodput():
    assert parse_goodput(["ttft:500", "tpot:50", "e2el:2000"]) == {"ttft": 500, "tpot": 50, "e2el": 2000}
    assert parse_goodput(None) == {}
    for bad in ("ttft", "latency:5", "ttft:-1", "ttft:abc", "tpot:nan"):
        with pytest.raises(InferPlugError, match="--goodput"):
            parse_goodput([bad])
