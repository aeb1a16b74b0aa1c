"""Prometheus metrics of one server: request latencies (TTFT, TPOT, end to end), token counts,
and the backend's own state (running, waiting, KV usage, prefix hit rate, speculative acceptance) read at
scrape time."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from inferplug.types import Usage

if TYPE_CHECKING:
    from inferplug.backends.base import Backend

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class ServerMetrics:
    def __init__(self, backend: Backend):
        self.backend = backend
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("inferplug_requests", "Finished API requests", ["endpoint", "status"], registry=r)
        self.ttft = Histogram("inferplug_time_to_first_token_seconds", "Time to first token",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("inferplug_time_per_output_token_seconds", "Time per output token after the first",
                              buckets=_TOKEN_BUCKETS, registry=r)
        self.e2e = Histogram("inferplug_e2e_request_latency_seconds", "End-to-end request latency",
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter("inferplug_prompt_tokens", "Prompt tokens processed", registry=r)
        self.cached_tokens = Counter("inferplug_cached_prompt_tokens", "Prompt tokens served from a cache",
                                     registry=r)
        self.generation_tokens = Counter("inferplug_generation_tokens", "Tokens generated", registry=r)
        self.running = Gauge("inferplug_num_requests_running", "Requests the backend is running", registry=r)
        self.waiting = Gauge("inferplug_num_requests_waiting", "Requests queued in the backend", registry=r)
        self.kv_usage = Gauge("inferplug_kv_cache_usage_ratio", "Fraction of KV cache blocks in use", registry=r)
        self.prefix_hit_rate = Gauge("inferplug_prefix_cache_hit_rate", "Prefix cache hit rate", registry=r)
        self.doc_hit_rate = Gauge("inferplug_doc_cache_hit_rate", "RAG document cache: segments reused", registry=r)
        self.doc_bytes = Gauge("inferplug_doc_cache_bytes", "RAG document KV held", ["tier"], registry=r)
        self.doc_recomputed = Gauge("inferplug_doc_cache_recomputed_tokens",
                                    "RAG document tokens reused and then recomputed (cache.rag_recompute)", registry=r)
        self.spec_acceptance = Gauge("inferplug_spec_decode_acceptance_rate",
                                     "Share of speculative tokens the model accepted", registry=r)
        self.spec_length = Gauge("inferplug_spec_decode_mean_accepted_length",
                                 "Tokens a speculative verification step yields on average", registry=r)

    def observe(self, endpoint: str, usage: Usage, started: float, first_token: float | None, ended: float,
                status: str = "ok") -> None:
        """One finished generation; status "aborted" when the backend aborted a choice."""
        self.requests.labels(endpoint, status).inc()
        self.e2e.observe(ended - started)
        self.prompt_tokens.inc(usage.prompt_tokens)
        self.cached_tokens.inc(usage.cached_tokens)
        self.generation_tokens.inc(usage.completion_tokens)
        if first_token is not None:
            self.ttft.observe(first_token - started)
            if usage.completion_tokens > 1:
                self.tpot.observe((ended - first_token) / (usage.completion_tokens - 1))

    def failed(self, endpoint: str, status: int, generated: int = 0) -> None:
        """A request that got no whole answer; `generated`: the tokens it had from the engine (a stream its client
        left mid-way), which the engine spent all the same."""
        self.requests.labels(endpoint, str(status)).inc()
        self.generation_tokens.inc(generated)

    def render(self) -> bytes:
        stats = self.backend.stats()
        self.running.set(stats.get("running", 0))
        self.waiting.set(stats.get("waiting", 0))
        total = stats.get("kv_blocks_total") or 0
        self.kv_usage.set(stats.get("kv_blocks_used", 0) / total if total else 0.0)
        self.prefix_hit_rate.set(stats.get("prefix_hit_rate", 0.0))
        self.doc_hit_rate.set(stats.get("doc_cache_hit_rate", 0.0))
        for tier, key in (("memory", "doc_cache_bytes"), ("disk", "doc_cache_disk_bytes")):
            self.doc_bytes.labels(tier).set(stats.get(key, 0))
        self.doc_recomputed.set(stats.get("doc_cache_recomputed_tokens", 0))
        self.spec_acceptance.set(stats.get("spec_acceptance_rate", 0.0))
        self.spec_length.set(stats.get("spec_mean_accepted_length", 0.0))
        return generate_latest(self.registry)
