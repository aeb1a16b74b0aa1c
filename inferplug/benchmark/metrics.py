"""Per-request traces and the aggregate serving metrics computed from them."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from inferplug.errors import InferPlugError

SLO_METRICS = ("ttft", "tpot", "e2el")
PERCENTILES = (50, 90, 99)


@dataclass
class RequestRecord:
    """What one request did, in seconds since the benchmark's clock origin."""

    prompt_len: int
    start: float
    chunk_times: list[float] = field(default_factory=list)  # arrival of each streamed chunk with content
    end: float = 0.0
    output_len: int = 0  # tokens generated (from usage when the target reports it)
    cached_tokens: int = 0  # prompt tokens served from the prefix/RAG cache
    success: bool = False
    error: str = ""

    @property
    def ttft(self) -> float | None:
        return self.chunk_times[0] - self.start if self.chunk_times else None

    @property
    def e2el(self) -> float:
        return self.end - self.start

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first; undefined with fewer than two tokens."""
        if self.ttft is None or self.output_len < 2:
            return None
        return (self.e2el - self.ttft) / (self.output_len - 1)

    @property
    def itls(self) -> list[float]:
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:])]


@dataclass
class LatencyStats:
    """Milliseconds."""

    mean: float
    median: float
    p90: float
    p99: float

    @classmethod
    def of(cls, seconds: list[float]) -> LatencyStats:
        ms = sorted(s * 1000.0 for s in seconds)
        if not ms:
            return cls(math.nan, math.nan, math.nan, math.nan)
        return cls(sum(ms) / len(ms), percentile(ms, 50), percentile(ms, 90), percentile(ms, 99))


@dataclass
class BenchmarkMetrics:
    completed: int
    failed: int
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float  # completed requests / s
    output_throughput: float  # generated tokens / s
    total_token_throughput: float  # (prompt + generated tokens) / s
    goodput: float | None  # requests meeting every SLO / s; None without SLOs
    prefix_cache_hit_rate: float  # cached prompt tokens / prompt tokens
    ttft_ms: LatencyStats
    tpot_ms: LatencyStats
    itl_ms: LatencyStats
    e2el_ms: LatencyStats

    def to_dict(self) -> dict:
        return asdict(self)


def percentile(sorted_values: list[float], q: float) -> float:
    """The q-th percentile with linear interpolation between closest ranks (numpy's default)."""
    if not sorted_values:
        return math.nan
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def meets_slos(record: RequestRecord, slos_ms: dict[str, float]) -> bool:
    values = {"ttft": record.ttft, "tpot": record.tpot, "e2el": record.e2el}
    for name, limit in slos_ms.items():
        value = values[name]
        # A one-token answer has no TPOT; it cannot violate a TPOT SLO.
        if value is not None and value * 1000.0 > limit:
            return False
    return True


def compute_metrics(
    records: list[RequestRecord], duration_s: float, slos_ms: dict[str, float] | None = None
) -> BenchmarkMetrics:
    done = [r for r in records if r.success]
    input_tokens = sum(r.prompt_len for r in done)
    output_tokens = sum(r.output_len for r in done)
    cached = sum(r.cached_tokens for r in done)
    rate = (lambda n: n / duration_s) if duration_s > 0 else (lambda n: 0.0)
    good = None if not slos_ms else rate(sum(meets_slos(r, slos_ms) for r in done))
    return BenchmarkMetrics(
        completed=len(done),
        failed=len(records) - len(done),
        duration_s=duration_s,
        total_input_tokens=input_tokens,
        total_output_tokens=output_tokens,
        request_throughput=rate(len(done)),
        output_throughput=rate(output_tokens),
        total_token_throughput=rate(input_tokens + output_tokens),
        goodput=good,
        prefix_cache_hit_rate=cached / input_tokens if input_tokens else 0.0,
        ttft_ms=LatencyStats.of([r.ttft for r in done if r.ttft is not None]),
        tpot_ms=LatencyStats.of([r.tpot for r in done if r.tpot is not None]),
        itl_ms=LatencyStats.of([gap for r in done for gap in r.itls]),
        e2el_ms=LatencyStats.of([r.e2el for r in done]),
    )


def parse_goodput(items: list[str] | None) -> dict[str, float]:
    """`["ttft:500", "tpot:50"]` -> {"ttft": 500.0, "tpot": 50.0} (milliseconds)."""
    slos: dict[str, float] = {}
    for item in items or []:
        name, sep, value = item.partition(":")
        if not sep or name not in SLO_METRICS:
            raise InferPlugError(
                f"--goodput {item!r} is invalid: use NAME:MILLISECONDS with NAME one of {', '.join(SLO_METRICS)}, "
                "e.g. --goodput ttft:500 tpot:50"
            )
        try:
            limit = float(value)
        except ValueError:
            limit = math.nan
        if not math.isfinite(limit) or limit <= 0:
            raise InferPlugError(f"--goodput {item!r} is invalid: the limit must be a positive number of milliseconds")
        slos[name] = limit
    return slos
