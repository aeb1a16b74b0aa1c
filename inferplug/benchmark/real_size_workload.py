"""What one engine's real-size run measures: bench/real_size.py hands it, as JSON, to each bench/real_size_engines.py
subprocess it starts."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Workload:
    context: int  # tokens one sequence may hold (inferplug's max_model_len; llama.cpp's n_ctx per sequence)
    threads: int
    vocab: int
    prefill_tokens: int = 512
    decode_tokens: int = 128
    streams: int = 8
    stream_prompt_tokens: int = 32
    repeats: int = 3
