"""`inferplug doctor --bench`: a ~20 s measure of this machine against the default model.

It times dense matmuls (bf16 and fp32) and a large memory copy, turns them into the model's
two speed limits, and runs the engine once to show how close it gets:
  compute-bound (prefill, big batches): tokens/s <= matmul FLOP/s / (2 x parameters)
  bandwidth-bound (one decode stream):  tokens/s <= memory bytes/s / weight bytes read per token
"""

from __future__ import annotations

import time
from typing import Any

from inferplug.errors import InferPlugError

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def _timed_repeat(fn: Any, device: str, seconds: float) -> float:
    """Seconds per call of `fn`, repeated for about `seconds` after one warm-up call."""
    fn()
    _sync(device)
    calls, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds or calls < 1:
        fn()
        calls += 1
        _sync(device)
    return elapsed / calls


def matmul_flops(dtype: str, device: str = "cpu", seconds: float = 3.0, max_size: int = 2048) -> float:
    """FLOP/s of a square matmul in `dtype` (2 n^3 floating-point operations each).

    The size doubles from 256 while one product takes under 5% of the budget: big enough to
    reach the peak, small enough that a slow dtype (bf16 without AVX512_BF16 runs ~50x slower
    than fp32) still fits in the time.
    """
    import torch

    size = 256
    while True:
        a = torch.randn(size, size, device=device).to(getattr(torch, dtype))
        b = torch.randn(size, size, device=device).to(getattr(torch, dtype))
        start = time.perf_counter()
        torch.mm(a, b)
        _sync(device)
        if size >= max_size or time.perf_counter() - start > seconds / 20:
            return 2 * size**3 / _timed_repeat(lambda: torch.mm(a, b), device, seconds)
        size *= 2


def memory_bandwidth(device: str = "cpu", seconds: float = 2.0, mib: int = 256) -> float:
    """Bytes/s read by a reduction over a buffer far larger than any cache: what decode spends,
    since each step streams every weight once."""
    import torch

    data = torch.ones(mib * 2**20 // 4, device=device)
    return data.numel() * 4 / _timed_repeat(lambda: data.sum(), device, seconds)


def engine_speeds(backend: Any) -> dict[str, float]:
    """One prefill-only request and one 32-token decode through the backend, timed like `inferplug bench`."""
    from inferplug.benchmark.datasets import sample_random
    from inferplug.benchmark.runner import warm_up
    from inferplug.benchmark.targets import BackendTarget

    target = BackendTarget(backend, ignore_eos=True)
    prefill, decode = sample_random(2, input_len=128, output_len=1, tokenizer=backend.tokenizer, seed=0)
    decode.output_len = 32

    async def measure() -> tuple:
        await warm_up(target)
        return await target.send(prefill, time.perf_counter()), await target.send(decode, time.perf_counter())

    first, second = backend.run_sync(measure())
    if not (first.success and second.success and second.tpot):
        raise InferPlugError(f"the engine run failed: {first.error or second.error or 'no decode timing'}")
    return {"prefill_tokens_per_s": first.prompt_len / first.ttft, "decode_tokens_per_s": 1.0 / second.tpot}


def run(profile: str | None = None, seconds: float = 20.0, print_report: bool = True) -> dict[str, Any]:
    """Measure, print a table, and return the figures (for `doctor --json`)."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    report: dict[str, Any] = {"device": device, "threads": torch.get_num_threads()}
    report["matmul_flops"] = {dt: matmul_flops(dt, device, seconds * 0.15) for dt in ("float32", "bfloat16")}
    report["memory_bandwidth_bytes_per_s"] = memory_bandwidth(device, seconds * 0.1)
    try:
        report.update(_model_limits(profile, report))
    except InferPlugError as exc:
        report["engine_error"] = str(exc)
    if print_report:
        print_selftest(report)
    return report


def _model_limits(profile: str | None, report: dict[str, Any]) -> dict[str, Any]:
    from inferplug.backends.registry import get_backend
    from inferplug.models.loader import read_config
    from inferplug.profile import load_profile
    from inferplug.sources import ensure_local

    loaded = load_profile(profile)
    backend = get_backend(loaded)
    dtype = getattr(backend.plan, "dtype", "float32")
    params = read_config(ensure_local(loaded.model)).num_parameters()
    if backend.name == "native":  # what each decode step really streams: the layers and head as loaded
        weight_bytes = backend.engine.engine.runner.model.decode_weight_bytes()
    else:
        weight_bytes = params * DTYPE_BYTES.get(dtype, 4)
    flops = report["matmul_flops"].get(dtype, report["matmul_flops"]["float32"])
    limits = {
        "profile": loaded.name, "backend": backend.name, "dtype": dtype, "parameters": params,
        "compute_bound_tokens_per_s": flops / (2 * params),
        "bandwidth_bound_tokens_per_s": report["memory_bandwidth_bytes_per_s"] / weight_bytes,
    }
    limits.update(engine_speeds(backend))
    return limits


def print_selftest(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Machine self-test ({report['device']}, {report['threads']} threads)", title_justify="left")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_column("engine gets", justify="right")
    for dt, flops in report["matmul_flops"].items():
        table.add_row(f"matmul {dt}", f"{flops / 1e9:.1f} GFLOP/s", "")
    table.add_row("memory bandwidth (read)", f"{report['memory_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s", "")
    if "compute_bound_tokens_per_s" in report:
        table.add_row("model", f"{report['profile']}, {report['parameters'] / 1e6:.0f}M params",
                      f"{report['backend']}, {report['dtype']}")
        for kind, measured in (("compute", "prefill"), ("bandwidth", "decode, 1 stream")):
            limit, got = report[f"{kind}_bound_tokens_per_s"], report[f"{measured.split(',')[0]}_tokens_per_s"]
            table.add_row(f"{kind}-bound limit ({measured})", f"{limit:,.0f} tok/s",
                          f"{got:,.0f} tok/s ({got / limit:.0%})")
    Console().print(table)
    if "engine_error" in report:
        Console().print(f"[yellow]model limits skipped:[/yellow] {report['engine_error']}")
