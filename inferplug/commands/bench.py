"""`inferplug bench`: a serving benchmark with vLLM benchmark_serving's flags and metrics."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import math
import os
from pathlib import Path
from typing import Any

from inferplug.commands import add_profile_argument
from inferplug.errors import InferPlugError


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("bench", help="serving benchmark: throughput, TTFT, TPOT, ITL, goodput")
    add_profile_argument(p, "; ignored with --url")
    target = p.add_argument_group("target")
    target.add_argument("--url", help="an OpenAI-compatible server instead, e.g. http://127.0.0.1:8000/v1")
    target.add_argument("--model", help="model name to request from --url (default: the first it lists)")
    target.add_argument("--api-key", help="default: $INFERPLUG_OPENAI_API_KEY or $OPENAI_API_KEY",
                        default=os.environ.get("INFERPLUG_OPENAI_API_KEY") or os.environ.get("OPENAI_API_KEY"))
    target.add_argument("--tokenizer", help="HF dir or GGUF file to size prompts for --url (default: word estimates)")
    load = p.add_argument_group("load")
    load.add_argument("--num-prompts", type=int, default=100)
    load.add_argument("--request-rate", type=float, default=math.inf, help="mean requests/s (default inf: all at once)")
    load.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of arrivals; 1 is Poisson")
    load.add_argument("--max-concurrency", type=int, help="cap on requests in flight")
    load.add_argument("--sweep-rates", help="comma-separated rates (e.g. 1,2,4,inf): run each, plot latency vs rate")
    load.add_argument("--ignore-eos", action="store_true", help="generate exactly the requested output lengths")
    load.add_argument("--seed", type=int, default=0)
    data = p.add_argument_group("workload")
    data.add_argument("--dataset-name", choices=("random", "sharegpt", "rag"), default="random")
    data.add_argument("--dataset-path", help="ShareGPT-format JSON file (for --dataset-name sharegpt)")
    data.add_argument("--random-input-len", type=int, default=256)
    data.add_argument("--random-output-len", type=int, default=64)
    data.add_argument("--random-range-ratio", type=float, default=0.0)
    data.add_argument("--random-prefix-len", type=int, default=0)
    data.add_argument("--random-num-prefixes", type=int, default=1,
                      help="distinct shared prefixes of --random-prefix-len, taken in turn (e.g. system prompts)")
    data.add_argument("--sharegpt-output-len", type=int, help="fix every output length instead of the reply's")
    out = p.add_argument_group("output")
    out.add_argument("--goodput", nargs="+", metavar="NAME:MS", help="SLOs, e.g. --goodput ttft:500 tpot:50 e2el:5000")
    out.add_argument("--save-result", metavar="PATH", help="write the results as JSON")
    out.add_argument("--plot", metavar="PATH", help="PNG for --sweep-rates (default: bench-sweep.png)")
    out.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run)


def parse_rates(text: str) -> list[float]:
    try:
        rates = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise InferPlugError(
            f"--sweep-rates {text!r} is invalid: give comma-separated numbers, e.g. 1,2,4,inf"
        ) from None
    if not rates:
        raise InferPlugError("--sweep-rates is empty: give comma-separated numbers, e.g. 1,2,4,inf")
    return rates


def run(args: argparse.Namespace) -> int:
    from inferplug.benchmark import datasets
    from inferplug.benchmark.metrics import parse_goodput
    from inferplug.benchmark.report import plot_sweep, print_result, save_results
    from inferplug.benchmark.runner import BenchmarkSettings

    # Every check that needs no model runs first, so bad input fails in milliseconds.
    base = BenchmarkSettings(args.request_rate, args.burstiness, args.max_concurrency, args.seed,
                             parse_goodput(args.goodput))
    rates = parse_rates(args.sweep_rates) if args.sweep_rates else [args.request_rate]
    sweep = [dataclasses.replace(base, request_rate=rate) for rate in rates]
    for settings in sweep:
        settings.validate(args.num_prompts)
    pairs = None
    if args.dataset_name == "sharegpt":
        if not args.dataset_path:
            raise InferPlugError("--dataset-name sharegpt needs --dataset-path FILE.json (a ShareGPT-format file)")
        pairs = datasets.read_sharegpt_pairs(args.dataset_path)

    def workload(tokenizer: Any, render_chat: Any) -> list[datasets.BenchRequest]:
        if pairs is not None:
            return datasets.sharegpt_requests(pairs, args.num_prompts, tokenizer, args.sharegpt_output_len, args.seed)
        if args.dataset_name == "rag":
            from inferplug.benchmark.rag import rag_requests

            return rag_requests(args.num_prompts, args.random_output_len, tokenizer, args.seed, render_chat)
        return datasets.sample_random(args.num_prompts, args.random_input_len, args.random_output_len,
                                      args.random_range_ratio, args.random_prefix_len, tokenizer, args.seed,
                                      args.random_num_prefixes)

    results = _run_url(args, workload, sweep) if args.url else _run_in_process(args, workload, sweep)
    for result in results:
        print_result(result)
    if args.save_result:
        print(f"saved {save_results(args.save_result, results)}")
    if args.sweep_rates:
        default_plot = Path(args.save_result).with_suffix(".png") if args.save_result else Path("bench-sweep.png")
        print(f"plotted {plot_sweep(results, args.plot or default_plot)}")
    return 0 if all(r.metrics.failed == 0 for r in results) else 1


def _run_in_process(args: argparse.Namespace, workload: Any, sweep: list) -> list:
    from inferplug.backends.registry import get_backend
    from inferplug.benchmark.runner import benchmark
    from inferplug.benchmark.targets import BackendTarget

    backend = get_backend(args.profile)
    target = BackendTarget(backend, ignore_eos=args.ignore_eos)
    requests = workload(backend.tokenizer, backend.apply_chat_template)
    return [
        backend.run_sync(benchmark(target, requests, s, backend.stats, show_progress=not args.no_progress))
        for s in sweep
    ]


def _run_url(args: argparse.Namespace, workload: Any, sweep: list) -> list:
    from inferplug.benchmark.datasets import load_tokenizer
    from inferplug.benchmark.runner import benchmark
    from inferplug.benchmark.targets import OpenAITarget

    tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer else None
    def render_chat(messages: list[dict[str, str]]) -> str:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    requests = workload(tokenizer, render_chat if tokenizer else None)

    async def main() -> list:
        target = OpenAITarget(args.url, args.model, args.api_key, ignore_eos=args.ignore_eos)
        try:
            await target.check()
            return [await benchmark(target, requests, s, show_progress=not args.no_progress) for s in sweep]
        finally:
            await target.aclose()

    return asyncio.run(main())
