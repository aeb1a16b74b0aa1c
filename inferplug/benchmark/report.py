"""Show and save benchmark results: a terminal table, JSON, and a latency-vs-rate plot."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from inferplug.benchmark.runner import BenchmarkResult
from inferplug.errors import InferPlugError

LATENCIES = (("ttft_ms", "Time to first token"), ("tpot_ms", "Time per output token (excl. 1st)"),
             ("itl_ms", "Inter-token latency"), ("e2el_ms", "End-to-end latency"))


def result_table(result: BenchmarkResult) -> Any:
    from rich.table import Table

    m = result.metrics
    table = Table(title=f"Serving benchmark: {result.target}", show_header=False, title_justify="left")
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("Successful requests", f"{m.completed}"),
        ("Failed requests", f"{m.failed}"),
        ("Benchmark duration (s)", f"{m.duration_s:.2f}"),
        ("Total input tokens", f"{m.total_input_tokens}"),
        ("Total generated tokens", f"{m.total_output_tokens}"),
        ("Request throughput (req/s)", f"{m.request_throughput:.2f}"),
        ("Output token throughput (tok/s)", f"{m.output_throughput:.2f}"),
        ("Total token throughput (tok/s)", f"{m.total_token_throughput:.2f}"),
        ("Prefix-cache hit rate", f"{m.prefix_cache_hit_rate:.1%}"),
    ]
    if m.goodput is not None:
        slos = " ".join(f"{k}<={v:g}ms" for k, v in result.settings.slos_ms.items())
        rows.append((f"Goodput (req/s, {slos})", f"{m.goodput:.2f}"))
    for key, title in LATENCIES:
        stats = getattr(m, key)
        for name in ("mean", "median", "p90", "p99"):
            rows.append((f"{title} {name} (ms)", f"{getattr(stats, name):.2f}"))
    for name, value in rows:
        table.add_row(name, value)
    return table


def print_result(result: BenchmarkResult) -> None:
    from rich.console import Console

    console = Console()
    console.print(result_table(result))
    for error in sorted({r.error for r in result.records if not r.success})[:5]:
        console.print(f"[red]failed:[/red] {error}")


def save_results(path: str | Path, results: list[BenchmarkResult]) -> Path:
    """One result as an object, a sweep as {"sweep": [...]}."""
    path = Path(path)
    data = results[0].to_json() if len(results) == 1 else {"sweep": [r.to_json() for r in results]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_strict_json(data), indent=2, allow_nan=False, default=str) + "\n")
    return path


def _strict_json(value: Any) -> Any:
    """NaN (a metric with no samples, e.g. TPOT of one-token answers) becomes null: valid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _strict_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_strict_json(v) for v in value]
    return value


def plot_sweep(results: list[BenchmarkResult], path: str | Path) -> Path:
    """Median and p99 TTFT, TPOT and end-to-end latency against the request rate, as a PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InferPlugError("plotting a rate sweep needs matplotlib: pip install matplotlib (the JSON is still saved)")
    finite = [r for r in results if math.isfinite(r.settings.request_rate)]
    # An infinite rate is drawn one step past the highest finite one, labelled "inf".
    top = max((r.settings.request_rate for r in finite), default=1.0)
    xs = [r.settings.request_rate if math.isfinite(r.settings.request_rate) else top * 1.5 for r in results]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for ax, (key, title) in zip(axes, (LATENCIES[0], LATENCIES[1], LATENCIES[3])):
        for stat in ("median", "p99"):
            ax.plot(xs, [getattr(getattr(r.metrics, key), stat) for r in results], marker="o", label=stat)
        ax.set_title(title)
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel("ms")
        ax.set_xticks(xs, [f"{x:g}" if math.isfinite(r.settings.request_rate) else "inf" for x, r in zip(xs, results)])
        ax.legend()
    fig.suptitle(f"Latency vs request rate: {results[0].target}")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
