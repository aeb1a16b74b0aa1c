"""Kernel paths timed once on the user's host, and remembered: the ISA flags say which paths can run, the timings
decide which does. (On an AMX Xeon the bf16 prefill kernel that AVX512_BF16 picked ran slower than float32 there,
while torch's bf16 matmul through oneDNN ran 4x float32's rate; on Zen 5 the same kernel ran 1.6x.)

`prefill_timings(hw, threads, width)`: seconds per call of each prompt-row path a default may take
(compute_path_plan.PREFILL_RULE), from INFERPLUG_HOME/host-timings/, or timed now where `hw` is this host and the
CPU kernels run (the first resolve of a native CPU plan, or `inferplug doctor --bench`), then remembered. The key
is the CPU model, its ISA flags, the thread count, the layer width and inferplug's and torch's versions: another
CPU, thread count or release times again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

from inferplug.hardware import Hardware, this_cpu

FOLDER = "host-timings"
Measure = Callable[[tuple[str, ...], int, int], dict[str, float]]  # (paths, threads, width) -> seconds per call


def prefill_timings(hw: Hardware, threads: int, width: int, paths: tuple[str, ...],
                    measure: Measure | None = None) -> dict[str, float] | None:
    """{path: seconds} for `paths` on a block layer `width` inputs wide, remembered or timed now; None where `hw`
    is not this host or the CPU kernels cannot run here (the choice then falls back to the ISA flags)."""
    entry = _entry(hw, threads, width, paths)
    try:
        return {path: float(seconds) for path, seconds in json.loads(entry.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        pass
    if measure is None:
        if (hw.cpu_model, hw.cpu_flags) != this_cpu() or not _kernels_run(hw):
            return None
        measure = _measure
    timings = measure(paths, threads, width)
    _remember(entry, timings)
    return timings


def forget() -> None:
    """Drop every remembered timing (`doctor --bench` times again)."""
    from inferplug.sources import home

    for entry in (home() / FOLDER).glob("*.json"):
        entry.unlink(missing_ok=True)


def _entry(hw: Hardware, threads: int, width: int, paths: tuple[str, ...]) -> Path:
    from importlib.metadata import PackageNotFoundError, version

    from inferplug.sources import home

    def installed(package: str) -> str:
        try:
            return version(package)
        except PackageNotFoundError:
            return "none"
    key = json.dumps([hw.cpu_model, sorted(hw.cpu_flags), threads, width, list(paths), installed("inferplug"),
                      installed("torch")])
    return home() / FOLDER / f"prefill-{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"


def _remember(entry: Path, timings: dict[str, float]) -> None:
    from inferplug.sources import write_atomically

    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(entry, json.dumps(timings).encode())
    except OSError:
        pass  # a read-only cache only costs timing again next time


def _kernels_run(hw: Hardware) -> bool:
    from inferplug.kernels import cpu as cpu_kernels

    return cpu_kernels.runs_on("cpu", hw) and cpu_kernels.ops() is not None


def _measure(paths: tuple[str, ...], threads: int, width: int) -> dict[str, float]:
    from rich.console import Console

    from inferplug.quant.prefill_timing import q4_layer_run, time_paths

    with Console(stderr=True).status(f"timing prompt-row paths on this CPU ({', '.join(paths)}; once per host)"):
        return time_paths(paths, q4_layer_run(width), threads)
