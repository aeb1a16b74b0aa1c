"""Drive a workload against a target: arrivals, a concurrency cap, a progress bar, then metrics."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from inferplug.benchmark.arrivals import arrival_offsets
from inferplug.benchmark.datasets import BenchRequest
from inferplug.benchmark.metrics import BenchmarkMetrics, RequestRecord, compute_metrics
from inferplug.benchmark.targets import Target
from inferplug.errors import InferPlugError

WARMUP = BenchRequest(prompt="Hello", prompt_len=1, output_len=4)


@dataclass
class BenchmarkSettings:
    request_rate: float = math.inf
    burstiness: float = 1.0
    max_concurrency: int | None = None
    seed: int = 0
    slos_ms: dict[str, float] = field(default_factory=dict)

    def validate(self, num_prompts: int) -> None:
        if num_prompts < 1:
            raise InferPlugError(f"--num-prompts {num_prompts} is invalid: use at least 1")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise InferPlugError(f"--max-concurrency {self.max_concurrency} is invalid: use at least 1, or omit it")
        arrival_offsets(0, self.request_rate, self.burstiness)  # raises on a bad rate or burstiness


@dataclass
class BenchmarkResult:
    target: str
    settings: BenchmarkSettings
    metrics: BenchmarkMetrics
    records: list[RequestRecord]
    backend_stats: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The saved result: settings, metrics and per-request arrays (vLLM's --save-result shape)."""
        done = [r for r in self.records if r.success]
        rate = self.settings.request_rate
        return {
            "target": self.target,
            "num_prompts": len(self.records),
            "request_rate": "inf" if math.isinf(rate) else rate,
            "burstiness": self.settings.burstiness,
            "max_concurrency": self.settings.max_concurrency,
            "seed": self.settings.seed,
            "goodput_slos_ms": self.settings.slos_ms,
            **self.metrics.to_dict(),
            "backend_stats": self.backend_stats,
            "input_lens": [r.prompt_len for r in done],
            "output_lens": [r.output_len for r in done],
            "ttfts": [r.ttft for r in done],
            "itls": [r.itls for r in done],
            "errors": [r.error for r in self.records if not r.success],
        }


async def warm_up(target: Target) -> None:
    """One short request before the load: it fails fast and clearly if the target cannot serve."""
    record = await target.send(WARMUP, time.perf_counter())
    if not record.success:
        raise InferPlugError(f"the warm-up request to {target.name} failed ({record.error}); no load was sent")


async def run_benchmark(
    target: Target,
    requests: list[BenchRequest],
    settings: BenchmarkSettings,
    on_done: Callable[[RequestRecord], None] | None = None,
) -> tuple[list[RequestRecord], float]:
    """Send every request at its arrival time (at most max_concurrency in flight); records + duration."""
    offsets = arrival_offsets(len(requests), settings.request_rate, settings.burstiness, settings.seed)
    limit = asyncio.Semaphore(settings.max_concurrency) if settings.max_concurrency else None
    origin = time.perf_counter()

    async def one(item: BenchRequest, offset: float) -> RequestRecord:
        await asyncio.sleep(max(0.0, offset - (time.perf_counter() - origin)))
        if limit is None:
            record = await target.send(item, origin)
        else:
            async with limit:
                record = await target.send(item, origin)
        if on_done is not None:
            on_done(record)
        return record

    records = await asyncio.gather(*(one(item, offset) for item, offset in zip(requests, offsets)))
    return list(records), time.perf_counter() - origin


async def benchmark(
    target: Target,
    requests: list[BenchRequest],
    settings: BenchmarkSettings,
    stats: Callable[[], dict[str, Any]] | None = None,
    show_progress: bool = True,
) -> BenchmarkResult:
    """Warm up, run the workload with a progress bar, and compute the metrics."""
    settings.validate(len(requests))
    await warm_up(target)
    if show_progress:
        from rich.progress import Progress

        with Progress(transient=True) as progress:
            task = progress.add_task(f"{target.name} @ {settings.request_rate} req/s", total=len(requests))
            records, duration = await run_benchmark(target, requests, settings, lambda _: progress.advance(task))
    else:
        records, duration = await run_benchmark(target, requests, settings)
    metrics = compute_metrics(records, duration, settings.slos_ms)
    return BenchmarkResult(target.name, settings, metrics, records, stats() if stats else {})
