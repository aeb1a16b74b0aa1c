"""Hand-written x86 CPU kernels (AVX2 + FMA + F16C, and AVX-512 with VNNI where the CPU has it), compiled
once on first use and registered as torch ops.

torch's CPU matmuls stream weights at a fraction of this host's DRAM bandwidth for the 1- to 64-row
shapes decode uses, paged attention in torch copies every K/V block before reading it, and at one
token a step a layer's small element-wise ops cost more in dispatch than in arithmetic. These kernels
do each in one pass: quantized matmuls, paged decode attention, RMSNorm, RoPE with the K/V store, SiLU. `ops()` returns `torch.ops.inferplug` with the kernels loaded, or None
where they cannot run (no AVX2/FMA/F16C, not x86, no C++ compiler); callers then keep the torch path.

Each kernel's inner loops are written once and compiled for AVX2 and for AVX-512 + VNNI (kernels.h); the
ops run the best set the CPU has, or the one INFERPLUG_CPU_ISA names (avx2 on an AVX-512 host runs what
AVX2-only hosts run). `isa()` says which set runs; `set_isa` switches (tests and benches compare them).

    ops = cpu_kernels.ops()
    if ops is not None:
        y = ops.q4_matmul(x, blocks)  # x: float32 [M, K]; blocks: uint8 Q4_1 [N, K / 32 * 20]
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from pathlib import Path

from inferplug.errors import ProfileError

SOURCES = ("dispatch.cpp", "isa_avx2.cpp", "isa_avx512.cpp", "quant_matmul.cpp", "rms_norm.cpp", "paged_attention.cpp",
           "layer_ops.cpp", "decode_layers.cpp", "moe_experts.cpp", "delta_rule.cpp")
REQUIRED_FLAGS = frozenset({"avx2", "fma", "f16c"})
DISABLE_ENV = "INFERPLUG_NO_CPU_KERNELS"  # set to 1 to force the torch paths (comparisons, debugging)
ISA_ENV = "INFERPLUG_CPU_ISA"  # avx2 or avx512: the kernel set to run instead of the best the CPU has
# The K/V pool dtypes the kernels read and write (fp16: stored rounded, read back to fp32; q and the arithmetic
# stay fp32). The resolver's kv_dtype = "auto" picks float16 where the kernels run: half the bytes a token.
KV_DTYPES = ("float32", "float16")
KERNEL_SETS = {"avx2": REQUIRED_FLAGS,  # each set the kernels build, with the CPU flags it needs, lowest first
               "avx512": REQUIRED_FLAGS | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"}}

EXTENSION = "inferplug_cpu_kernels"

log = logging.getLogger(__name__)


@functools.cache
def ops():
    """torch.ops.inferplug with the CPU kernels, or None (with the reason logged once) where they cannot run."""
    reason = unavailable_reason()
    if reason:
        log.info("CPU kernels off: %s", reason)
        return None
    import torch

    error = build_error()
    if error:  # a missing compiler or ninja: keep serving on the torch path
        log.warning("CPU kernels failed to build, using torch ops instead: %s", error)
        return None
    torch.ops.inferplug.set_isa(chosen_isa())
    return torch.ops.inferplug


@functools.cache
def build_error() -> str | None:
    """Builds and loads the kernels (where unavailable_reason() is None); the build's error with the compiler's
    output, or None. The tests fail with it: on a host with the ISA, a kernel that does not compile is a bug."""
    try:
        _build()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def unavailable_reason(hw=None) -> str | None:
    """Why the kernels cannot run on this machine (`hw`: hardware.Hardware, probed when omitted), or None."""
    from inferplug.hardware import probe

    if os.environ.get(DISABLE_ENV, "") not in ("", "0"):
        return f"{DISABLE_ENV} is set"
    missing = REQUIRED_FLAGS - (hw or probe()).cpu_flags
    return f"the CPU lacks {', '.join(sorted(missing))}" if missing else None


def runs_on(device_type: str, hw=None) -> bool:
    """Whether the kernels run on `device_type` here: the one answer every caller asks (ops.kernel_set, the weight
    layers, the loaders). With `hw` (the resolver's hardware facts) it answers from the CPU flags without building
    them; without, it builds them on the first call, and a failed build answers False."""
    if device_type != "cpu":
        return False
    return unavailable_reason(hw) is None if hw is not None else ops() is not None


def supported_isas(hw=None) -> list[str]:
    """The kernel sets this CPU can run, lowest first."""
    from inferplug.hardware import probe

    flags = (hw or probe()).cpu_flags
    return [name for name, needed in KERNEL_SETS.items() if needed <= flags]


def chosen_isa(hw=None) -> str:
    """The set the kernels run here: INFERPLUG_CPU_ISA's, else the best the CPU has. Raises ProfileError when
    the variable names an unknown set or one the CPU cannot run."""
    from inferplug.hardware import probe

    hw = hw or probe()
    supported = supported_isas(hw)
    wanted = os.environ.get(ISA_ENV, "")
    if not wanted:
        return supported[-1]
    if wanted not in KERNEL_SETS:
        raise ProfileError(f"{ISA_ENV}={wanted!r} is not a kernel set: use one of {', '.join(KERNEL_SETS)}, or unset it.")
    if wanted not in supported:
        missing = ", ".join(sorted(KERNEL_SETS[wanted] - hw.cpu_flags))
        raise ProfileError(f"{ISA_ENV}={wanted} asks for kernels this CPU cannot run (it lacks {missing}): "
                           f"use {supported[-1]}, or unset it.")
    return wanted


def isa() -> str | None:
    """The kernel set the ops run ("avx512-vnni", "avx2"), or None where the kernels are off."""
    return None if ops() is None else ops().isa()


def set_isa(name: str) -> None:
    """Run the `name` kernel set ("avx2", "avx512") from the next op on; raises ProfileError where it cannot run."""
    supported = supported_isas()
    if name not in supported:
        raise ProfileError(f"the {name!r} CPU kernels cannot run here: this CPU runs {', '.join(supported)}.")
    ops().set_isa(name)


def _build() -> None:
    from rich.console import Console
    from torch.utils.cpp_extension import _get_build_directory, load

    here = Path(__file__).parent
    # A spinner: the first build takes about a minute; later loads find the cached library.
    with Console(stderr=True).status("compiling inferplug's CPU kernels (once per machine, about a minute)"), \
            _sole_builder(Path(_get_build_directory(EXTENSION, verbose=False))):
        load(
            name=EXTENSION,
            sources=[str(here / name) for name in SOURCES],
            extra_cflags=["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-ffp-contract=off"],  # no implicit FMAs: rounding as in torch
            extra_ldflags=["-fopenmp"],
            is_python_module=False,
        )


@contextlib.contextmanager
def _sole_builder(build_dir: Path):
    """Holds an OS lock on the build folder while torch builds or loads the kernels there. torch's own lock is a
    file (FileBaton) that a builder killed mid-build leaves behind, and every later start then waits on it for ever;
    the OS drops ours when its holder dies, so a baton found while we hold it is a dead builder's, and goes."""
    import fcntl

    build_dir.mkdir(parents=True, exist_ok=True)
    with open(build_dir / "inferplug-builder.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        (build_dir / "lock").unlink(missing_ok=True)  # torch's baton (cpp_extension's FileBaton)
        yield
