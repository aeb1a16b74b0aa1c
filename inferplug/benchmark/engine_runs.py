"""The native engine's throughput workload and its timed runs: bench/engine_throughput.py's, which bench/awq_gptq.py
and bench/kv_dtype.py run too, so that their figures compare."""

from __future__ import annotations

import random
import statistics
import time

WORDS = ("the model reads a long document about rivers mountains cities history science music art code data "
         "people travel food weather language numbers stories questions answers and more").split()


def workload(tokenizer, count: int, output_cap: int, seed: int = 0) -> list[tuple[list[int], int]]:
    """(prompt ids, output length) per request: chat prompts of ~30-300 tokens, outputs 16-256."""
    rng = random.Random(seed)
    requests = []
    for i in range(count):
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(10, 260)))
        text = tokenizer.apply_chat_template([{"role": "user", "content": f"Summarize: {words}"}], tokenize=False,
                                             add_generation_prompt=True)
        requests.append((tokenizer.encode(text, add_special_tokens=False), min(16 + (i * 37) % 241, output_cap)))
    return requests


def run_native(engine, requests) -> dict:
    from inferplug.types import Request, SamplingParams

    start = time.perf_counter()
    for i, (prompt, n) in enumerate(requests):
        params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
        engine.add_request(Request(prompt=prompt, params=params, request_id=f"r{i}"))
    finals, tokens = [], 0
    while engine.has_unfinished():
        for event in engine.step():
            tokens += len(event.token_ids)
            if event.usage is not None:
                finals.append(event)
    wall = time.perf_counter() - start
    return {"output_tokens": tokens, "seconds": wall, "tok_per_s": tokens / wall,
            "ttft_median_s": statistics.median(e.timings.ttft for e in finals),
            "tpot_median_s": statistics.median(e.timings.tpot for e in finals if e.timings.tpot)}


def single_stream(engine, prompt: list[int], n: int = 128) -> float:
    stats = run_native(engine, [(prompt, n)])
    return 1.0 / stats["tpot_median_s"]
