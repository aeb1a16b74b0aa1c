"""How long each prompt-row path of the block layers (block_linear.PREFILL_GEMMS) takes on this host, on a layer of
the model's width: the measurement host_timings.py remembers and compute_path_plan.prefill_gemm chooses by.

The paths run interleaved, best of `repeats`, so a shared host's load falls on each alike. `run` and `clock` are
the measured call and the timer (tests pass their own, with costs they control).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from inferplug.quant.block_linear import Q4Linear

ROWS, OUT_FEATURES = 256, 2048  # a prefill chunk's rows against a slice of a layer: tens of ms at 7B width


def q4_layer_run(width: int, rows: int = ROWS, out_features: int = OUT_FEATURES) -> Callable[[str], None]:
    """A call of `path` on a Q4_1 layer [out_features, width] with random weights and `rows` prompt rows."""
    generator = torch.Generator().manual_seed(0)
    layer = Q4Linear.from_float(torch.randn(out_features, width, generator=generator) * 0.02)
    x = torch.randn(rows, width, generator=generator)

    def run(path: str) -> None:
        layer.prefill_gemm = path
        layer(x, decode_rows=0)
    return run


def time_paths(paths: tuple[str, ...], run: Callable[[str], None], threads: int, repeats: int = 3,
               clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Seconds a call of each path takes under `threads` torch threads, best of `repeats` after a warm-up."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for path in paths:
            run(path)  # warm-up: oneDNN's first call picks its kernel
        best = dict.fromkeys(paths, float("inf"))
        for _ in range(repeats):
            for path in paths:
                start = clock()
                run(path)
                best[path] = min(best[path], clock() - start)
        return best
    finally:
        torch.set_num_threads(previous)
