"""Token-id prompts that miss every cache, and our backend's timed generate: what bench/prefill.py and
bench/real_size_engines.py measure prefill and decode with, so their figures compare."""

from __future__ import annotations

import time


def prompt(length: int, run: int, vocab: int) -> list[int]:
    """`length` token ids, the same for every run but the first, which changes per run (no cache hits)."""
    import random

    rng = random.Random(length)
    ids = [rng.randrange(100, vocab) for _ in range(length)]
    ids[0] = 100 + run % (vocab - 100)
    return ids


def ours_runner(backend):
    from inferplug.types import Request, SamplingParams

    def generate(ids: list[int], max_tokens: int) -> tuple[list[float], int]:
        """Each token's time (s) from the call's start, and the prompt tokens the engine counted."""
        request = Request(prompt=ids, params=SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
        start, times, prompt_tokens = time.perf_counter(), [], None
        for event in backend.stream_sync(request):
            times += [time.perf_counter() - start] * len(event.token_ids)
            prompt_tokens = event.usage.prompt_tokens if event.usage else prompt_tokens
        return times, prompt_tokens

    return generate
