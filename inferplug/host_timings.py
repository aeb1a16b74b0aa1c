"""Kernel paths timed once on the user's host, and remembered: the ISA flags say which paths can run, the timings
decide which does. (On an AMX Xeon the bf16 prefill kernel that AVX512_BF16 picked ran slower than float32 there,
while torch's bf16 matmul through oneDNN ran 4x float32's rate; on Zen 5 the same kernel ran 1.6x.)

`prefill_timings(hw, threads, width)`: seconds per call of each prompt-row path a default may take
(compute_path_plan.PREFILL_RULE), from INFERPLUG_HOME/host-timings/, or timed now where `hw` is this host and the
CPU kernels run (the first resolve of a native CPU plan, or `inferplug doctor --bench`), then remembered. The key
is the CPU model, its ISA flags, the kernel set that runs (INFERPLUG_CPU_ISA), the thread count, the layer width
and inferplug's and torch's versions: another CPU, kernel set, thread count or release times again.
"""

from __future__ import annotations

import hashlib
import json

from inferplug.hardware import Hardware, this_cpu, version_of
from inferplug.kernels import cpu as cpu_kernels
from inferplug.sources import home, write_memo

FOLDER = "host-timings"


def prefill_timings(hw: Hardware, threads: int, width: int, paths: tuple[str, ...]) -> dict[str, float] | None:
    """{path: seconds} for `paths` on a block layer `width` inputs wide, remembered or timed now; None where the
    CPU kernels cannot run, or where nothing is remembered for `hw` and it is not this host (the choice then falls
    back to the ISA flags). A remembered entry is read without building or loading the kernels."""
    if not cpu_kernels.runs_on("cpu", hw):  # from the flags and INFERPLUG_NO_CPU_KERNELS: builds nothing
        return None
    key = [hw.cpu_model, sorted(hw.cpu_flags), cpu_kernels.chosen_isa(hw), threads, width, list(paths),
           version_of("inferplug"), version_of("torch")]
    entry = home() / FOLDER / f"prefill-{hashlib.sha256(json.dumps(key).encode()).hexdigest()[:32]}.json"
    try:
        return {path: float(seconds) for path, seconds in json.loads(entry.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        pass
    if (hw.cpu_model, hw.cpu_flags) != this_cpu() or cpu_kernels.ops() is None:
        return None
    timings = _measure(paths, threads, width)
    write_memo(entry, json.dumps(timings).encode())
    return timings


def forget() -> None:
    """Drop every remembered timing (`doctor --bench` times again)."""
    for entry in (home() / FOLDER).glob("*.json"):
        entry.unlink(missing_ok=True)


def _measure(paths: tuple[str, ...], threads: int, width: int) -> dict[str, float]:
    from rich.console import Console

    from inferplug.quant.prefill_timing import q4_layer_run, time_paths

    with Console(stderr=True).status(f"timing prompt-row paths on this CPU ({', '.join(paths)}; once per host)"):
        return time_paths(paths, q4_layer_run(width), threads)
