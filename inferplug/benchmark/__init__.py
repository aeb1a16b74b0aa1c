"""Serving benchmark: workloads, arrivals, targets, metrics and reports for `inferplug bench`.

The metric definitions follow vLLM's `benchmark_serving` so numbers compare across tools:
TTFT is the time to the first streamed token, TPOT = (latency - TTFT) / (output tokens - 1),
ITL the gaps between streamed chunks, goodput the rate of requests meeting every SLO.
"""
