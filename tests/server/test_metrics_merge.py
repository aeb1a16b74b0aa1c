"""/metrics with replicas: each replica's series labelled, counters and histograms summed, ratios averaged."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from inferplug.server.metrics import ServerMetrics
from inferplug.server.metrics_merge import merge_replica_metrics
from inferplug.types import Usage


class Stats:
    def __init__(self, used: int):
        self.used = used

    def stats(self) -> dict:
        return {"running": 1, "kv_blocks_total": 10, "kv_blocks_used": self.used}


def replica_text(used: int, requests: int) -> bytes:
    metrics = ServerMetrics(Stats(used))
    for _ in range(requests):
        metrics.observe("/v1/completions", Usage(prompt_tokens=5, completion_tokens=3), 0.0, 0.1, 0.3)
    return metrics.render()


def test_per_replica_and_summed():
    merged = merge_replica_metrics({"a": (11, replica_text(2, 1)), "b": (12, replica_text(6, 3))}).decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(merged) for s in family.samples}
    total = ("inferplug_generation_tokens_total", (("replica", "all"),))
    assert samples[total] == 12 and samples[("inferplug_generation_tokens_total", (("replica", "b"),))] == 9
    assert samples[("inferplug_num_requests_running", (("replica", "all"),))] == 2  # counts add up
    assert samples[("inferplug_kv_cache_usage_ratio", (("replica", "all"),))] == 0.4  # ratios average
    ttft_all = ("inferplug_time_to_first_token_seconds_count", (("replica", "all"),))
    assert samples[ttft_all] == 4
    assert samples[("inferplug_replica_info", (("pid", "12"), ("replica", "b")))] == 1
