"""Peer comparison: one workload, one run, on our engine and on the engines users would pick instead.

Every engine gets the same token-id prompts (SmolLM2's tokenizer), all arriving at once, and
generates exactly --output-len tokens greedily (EOS suppressed). Peers run only where installed:
  ours          inferplug's in-process backend for --profile (continuous batching)
  transformers  HF `generate`, static batches of --batch-size, left-padded, float32
  ctranslate2   Generator.generate_batch, float32 and int8, batches of --batch-size
  llama.cpp     llama-cpp-python on the same GGUF file, one sequence at a time (its Python API)
  --url N=URL   any running OpenAI-compatible server (llama-server, vLLM), through `inferplug bench`'s client
TTFT/TPOT are measured per request from time 0, so a request waiting for an earlier batch
counts that wait, as it would in a server. The table gives each peer's output throughput and
ours divided by it. `--docs docs/benchmarks.md` rewrites the table section there.

    .venv/bin/python bench/peers.py --num-prompts 16 --input-len 128 --output-len 64 --docs docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from inferplug.benchmark.datasets import BenchRequest, sample_random
from inferplug.benchmark.machine import machine, version_of

THREADS = os.cpu_count() or 1


@dataclass
class PeerResult:
    engine: str
    precision: str
    version: str
    duration_s: float
    output_tokens: int
    ttft_ms: list[float] = field(default_factory=list)
    tpot_ms: list[float] = field(default_factory=list)

    @property
    def output_throughput(self) -> float:
        return self.output_tokens / self.duration_s

    def summary(self) -> dict:
        median = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
        return {"engine": self.engine, "precision": self.precision, "version": self.version,
                "duration_s": self.duration_s, "output_tokens": self.output_tokens,
                "output_throughput": self.output_throughput,
                "ttft_ms_median": median(self.ttft_ms), "tpot_ms_median": median(self.tpot_ms)}


class StepClock:
    """Per-sequence first-token and last-token times, from time 0 of the run."""

    def __init__(self) -> None:
        self.origin = time.perf_counter()
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}

    def tick(self, seq: int) -> None:
        now = time.perf_counter() - self.origin
        self.first.setdefault(seq, now)
        self.last[seq] = now

    def latencies(self, output_len: int) -> tuple[list[float], list[float]]:
        ttft = [t * 1000 for t in self.first.values()]
        tpot = [(self.last[s] - self.first[s]) * 1000 / (output_len - 1) for s in self.first] if output_len > 1 else []
        return ttft, tpot


def run_ours(profile: str, requests: list[BenchRequest]) -> PeerResult:
    from inferplug.backends.registry import get_backend
    from inferplug.benchmark.runner import BenchmarkSettings, benchmark
    from inferplug.benchmark.targets import BackendTarget

    backend = get_backend(profile)
    target = BackendTarget(backend, ignore_eos=True)
    result = backend.run_sync(benchmark(target, requests, BenchmarkSettings(), show_progress=False))
    done = [r for r in result.records if r.success]
    precision = backend.stats().get("compute_type") or getattr(backend.plan, "dtype", "?")
    return PeerResult(f"inferplug {backend.name}", precision, version_of("inferplug"),
                      result.metrics.duration_s, result.metrics.total_output_tokens,
                      [r.ttft * 1000 for r in done], [r.tpot * 1000 for r in done if r.tpot])


def run_url(name: str, url: str, requests: list[BenchRequest]) -> PeerResult:
    """Any OpenAI-compatible server (llama.cpp's llama-server, vLLM, `inferplug serve`) via `inferplug bench`'s client.

    It gets the prompts as text and re-tokenizes them, so prompt lengths may differ by a token or two.
    """
    import asyncio

    from inferplug.benchmark.runner import BenchmarkSettings, benchmark
    from inferplug.benchmark.targets import OpenAITarget

    async def main():
        target = OpenAITarget(url, ignore_eos=True)
        try:
            await target.check()
            return await benchmark(target, requests, BenchmarkSettings(), show_progress=False)
        finally:
            await target.aclose()

    result = asyncio.run(main())
    done = [r for r in result.records if r.success]
    return PeerResult(f"{name} (HTTP)", "server's", "?", result.metrics.duration_s, result.metrics.total_output_tokens,
                      [r.ttft * 1000 for r in done], [r.tpot * 1000 for r in done if r.tpot])


def run_transformers(gguf: Path, requests: list[BenchRequest], batch_size: int) -> PeerResult:
    import torch
    from transformers import AutoModelForCausalLM, LogitsProcessor, LogitsProcessorList

    torch.set_num_threads(THREADS)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    model.eval()
    out_len = requests[0].output_len

    class Tick(LogitsProcessor):  # called once per decoding step, after the forward pass
        def __init__(self, clock: StepClock, seqs: range) -> None:
            self.clock, self.seqs = clock, seqs

        def __call__(self, input_ids, scores):
            for s in self.seqs:
                self.clock.tick(s)
            return scores

    def generate(batch: list[BenchRequest], clock: StepClock, first: int) -> int:
        width = max(len(r.prompt_ids) for r in batch)
        ids = torch.tensor([[0] * (width - len(r.prompt_ids)) + r.prompt_ids for r in batch])
        mask = torch.tensor([[0] * (width - len(r.prompt_ids)) + [1] * len(r.prompt_ids) for r in batch])
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=out_len,
                                 min_new_tokens=out_len, pad_token_id=0,
                                 logits_processor=LogitsProcessorList([Tick(clock, range(first, first + len(batch)))]))
        return (out.shape[1] - width) * len(batch)

    generate(requests[:1], StepClock(), 0)  # warm-up
    clock, tokens = StepClock(), 0
    for start in range(0, len(requests), batch_size):
        tokens += generate(requests[start:start + batch_size], clock, start)
    ttft, tpot = clock.latencies(out_len)
    return PeerResult("transformers generate", "float32", version_of("transformers"),
                      time.perf_counter() - clock.origin, tokens, ttft, tpot)


def run_ctranslate2(gguf: Path, requests: list[BenchRequest], compute_type: str, batch_size: int) -> PeerResult:
    import ctranslate2

    from inferplug.backends.ct2_convert import converted_model_dir
    from inferplug.models.loader import load_tokenizer

    model_dir = converted_model_dir(gguf, "float32")  # int8 is quantized at load from the float32 model
    tokenizer = load_tokenizer(gguf)
    generator = ctranslate2.Generator(str(model_dir), device="cpu", compute_type=compute_type,
                                      intra_threads=THREADS)
    prompts = [tokenizer.convert_ids_to_tokens(r.prompt_ids) for r in requests]
    out_len = requests[0].output_len

    def generate(batch: list[list[str]], clock: StepClock, first: int) -> int:
        results = generator.generate_batch(
            batch, max_length=out_len, min_length=out_len, sampling_topk=1, include_prompt_in_result=False,
            callback=lambda step: clock.tick(first + step.batch_id) or False)
        return sum(len(r.sequences_ids[0]) for r in results)

    generate(prompts[:1], StepClock(), 0)  # warm-up
    clock, tokens = StepClock(), 0
    for start in range(0, len(prompts), batch_size):
        tokens += generate(prompts[start:start + batch_size], clock, start)
    ttft, tpot = clock.latencies(out_len)
    return PeerResult("ctranslate2", compute_type, version_of("ctranslate2"),
                      time.perf_counter() - clock.origin, tokens, ttft, tpot)


def run_llama_cpp(gguf: Path, requests: list[BenchRequest]) -> PeerResult:
    from llama_cpp import Llama

    width = max(len(r.prompt_ids) for r in requests) + requests[0].output_len
    llm = Llama(model_path=str(gguf), n_ctx=width + 16, n_threads=THREADS, n_batch=512, verbose=False)
    no_eos = {llm.token_eos(): float("-inf")}
    out_len = requests[0].output_len

    def generate(request: BenchRequest, clock: StepClock, seq: int) -> int:
        llm.reset()  # no prefix reuse between requests: each one is served from scratch
        stream = llm.create_completion(request.prompt_ids, max_tokens=out_len, temperature=0.0, stream=True,
                                       logit_bias=no_eos)
        count = 0
        for _ in stream:
            clock.tick(seq)
            count += 1
        return count

    generate(requests[0], StepClock(), 0)  # warm-up
    clock = StepClock()
    tokens = sum(generate(r, clock, i) for i, r in enumerate(requests))
    ttft, tpot = clock.latencies(out_len)
    return PeerResult("llama.cpp (llama-cpp-python)", "GGUF Q4_1", version_of("llama_cpp_python"),
                      time.perf_counter() - clock.origin, tokens, ttft, tpot)


def ratio_table(results: list[PeerResult]) -> str:
    ours = results[0].output_throughput
    fmt = lambda x: "n/a" if x is None else f"{x:.1f}"  # noqa: E731
    lines = ["| engine | precision | output tok/s | ours / this | TTFT median (ms) | TPOT median (ms) |",
             "|---|---|---:|---:|---:|---:|"]
    for r in results:
        s = r.summary()
        lines.append(f"| {r.engine} {r.version} | {r.precision} | {r.output_throughput:.1f} | "
                     f"{ours / r.output_throughput:.2f}x | {fmt(s['ttft_ms_median'])} | {fmt(s['tpot_ms_median'])} |")
    return "\n".join(lines)


def write_docs(path: Path, command: str, info: dict, table: str, skipped: dict[str, str]) -> None:
    """Replace the section between the peers markers in the docs file (the rest is hand-written)."""
    start, end = "<!-- peers:start -->", "<!-- peers:end -->"
    text = path.read_text() if path.exists() else f"# Benchmarks\n\n{start}\n{end}\n"
    versions = ", ".join(f"{k} {v}" for k, v in info["versions"].items())
    skipped_lines = "".join(f"- {name} skipped: {why}\n" for name, why in skipped.items())
    body = (f"{start}\n_Generated by `bench/peers.py` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}._\n\n"
            f"Command: `{command}`\n\nMachine: {info['cpu']}, {info['cores']} cores, ISA {'/'.join(info['isa'])}, "
            f"{info['memory_gib']} GiB RAM, {info['os']}, Python {info['python']}.\n\nVersions: {versions}.\n\n"
            f"{table}\n\n{skipped_lines}{end}")
    head, _, rest = text.partition(start)
    _, _, tail = rest.partition(end)
    path.write_text(head + body + tail if rest else text.rstrip() + "\n\n" + body + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="smollm2-135m")
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16, help="static batch size for transformers/ctranslate2")
    parser.add_argument("--peers", default="transformers,ctranslate2,llama.cpp")
    parser.add_argument("--url", action="append", default=[], metavar="NAME=URL",
                        help="also a running OpenAI-compatible server, e.g. llama-server=http://127.0.0.1:8080/v1")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default="peers-result.json")
    parser.add_argument("--docs", help="rewrite the peers section of this markdown file")
    args = parser.parse_args()

    from inferplug.backends.registry import get_backend
    from inferplug.profile import load_profile
    from inferplug.sources import ensure_local

    gguf = ensure_local(load_profile(args.profile).model)
    tokenizer = get_backend(args.profile).tokenizer
    requests = sample_random(args.num_prompts, args.input_len, args.output_len, tokenizer=tokenizer, seed=args.seed)
    peers = {
        "transformers": ("transformers", lambda: run_transformers(gguf, requests, args.batch_size)),
        "ctranslate2": ("ctranslate2", lambda: [run_ctranslate2(gguf, requests, ct, args.batch_size)
                                                for ct in ("float32", "int8")]),
        "llama.cpp": ("llama_cpp", lambda: run_llama_cpp(gguf, requests)),
    }
    results, skipped = [run_ours(args.profile, requests)], {}
    for name in filter(None, args.peers.split(",")):
        module, run = peers[name]
        if importlib.util.find_spec(module) is None:
            skipped[name] = f"`{module}` is not installed"
            continue
        print(f"running {name} ...", flush=True)
        try:
            out = run()
        except Exception as exc:  # a broken peer is reported, the comparison goes on
            skipped[name] = f"failed: {type(exc).__name__}: {exc}"
            continue
        results.extend(out if isinstance(out, list) else [out])
    for name, _, url in (spec.partition("=") for spec in args.url):
        print(f"running {name} at {url} ...", flush=True)
        try:
            results.append(run_url(name, url, requests))
        except Exception as exc:  # an unreachable server is reported, the comparison goes on
            skipped[name] = f"failed: {type(exc).__name__}: {exc}"
    info, table = machine(THREADS), ratio_table(results)
    print(table)
    for name, why in skipped.items():
        print(f"{name} skipped: {why}")
    Path(args.json).write_text(json.dumps({"machine": info, "args": vars(args), "skipped": skipped,
                                           "results": [r.summary() | {"raw": asdict(r)} for r in results]}, indent=2))
    if args.docs:
        command = " ".join(["python bench/peers.py", *map(shlex.quote, sys.argv[1:])])
        write_docs(Path(args.docs), command, info, table, skipped)


if __name__ == "__main__":
    main()
