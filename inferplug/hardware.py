"""Facts about this machine: CPU ISA, RAM, GPUs, installed backend packages. Facts only, no decisions.

`probe()` is cheap on a machine without an NVIDIA driver: torch is imported only when a driver
is present, so `inferplug doctor` starts fast on CPU-only hosts. Tests build `Hardware` by hand.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.metadata
import importlib.util
import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

# Packages whose presence decides what can run; looked up with find_spec, never imported here.
PACKAGES = ("torch", "transformers", "gguf", "ctranslate2", "exllamav2", "triton", "flash_attn", "httpx", "openai",
            "ray")
ISA_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx_vnni", "avx512_bf16",
             "amx_tile", "amx_bf16", "amx_int8")


@dataclass(frozen=True)
class GPU:
    index: int
    name: str
    capability: tuple[int, int]
    total_memory: int  # bytes
    free_memory: int  # bytes

    @property
    def device(self) -> str:
        return f"cuda:{self.index}"


@dataclass(frozen=True)
class Hardware:
    cpu_model: str = "unknown"
    cpu_flags: frozenset[str] = frozenset()
    cpu_count: int = 1
    ram_total: int = 0  # bytes
    ram_available: int = 0  # bytes
    gpus: tuple[GPU, ...] = ()
    cuda_version: str | None = None
    driver_version: str | None = None
    packages: frozenset[str] = frozenset()  # importable packages among PACKAGES
    gpu_note: str | None = None  # why GPUs that seem present are not usable
    # CTranslate2's compute types per device ("cpu", "cuda"). None: ask the installed ctranslate2 the
    # first time a CTranslate2 plan needs them (it is heavy to import); tests inject them.
    ct2_compute_types: Mapping[str, frozenset[str]] | None = field(default=None, hash=False)
    os: str = field(default_factory=lambda: f"{platform.system()} {platform.release()}")
    python: str = field(default_factory=platform.python_version)
    # AMX tile data for this process: None where the CPU has no AMX, "granted", or why not (amx_tiles())
    amx_tiles: str | None = None

    def has(self, package: str) -> bool:
        return package in self.packages

    def ct2_compute_types_on(self, device: str) -> frozenset[str]:
        """What CTranslate2 can compute in on `device` ("cpu" or "cuda"); empty when it cannot run there."""
        if self.ct2_compute_types is not None:
            return frozenset(self.ct2_compute_types.get(device, ()))
        return _installed_ct2_compute_types(device)

    @property
    def isa_summary(self) -> list[str]:
        names = {"avx2": "AVX2", "avx512f": "AVX-512", "avx512_vnni": "AVX512-VNNI", "avx_vnni": "AVX-VNNI",
                 "avx512_bf16": "AVX512-BF16", "amx_tile": "AMX", "amx_bf16": "AMX-BF16", "amx_int8": "AMX-INT8"}
        return [label for flag, label in names.items() if flag in self.cpu_flags]


def probe() -> Hardware:
    model, flags = _cpu_info()
    total, available = _memory_info()
    gpus, cuda, driver, note = _gpu_info()
    packages = frozenset(p for p in PACKAGES if importlib.util.find_spec(p) is not None)
    return Hardware(
        cpu_model=model, cpu_flags=flags, cpu_count=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1, ram_total=total,
        ram_available=available, gpus=gpus, cuda_version=cuda, driver_version=driver, packages=packages,
        gpu_note=note, amx_tiles=amx_tiles(flags),
    )


def version_of(package: str) -> str:
    """The installed version of `package`, or "?" where it is not installed."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "?"


@functools.cache
def _installed_ct2_compute_types(device: str) -> frozenset[str]:
    if importlib.util.find_spec("ctranslate2") is None:
        return frozenset()
    import ctranslate2

    try:
        return frozenset(ctranslate2.get_supported_compute_types(device))
    except RuntimeError:  # e.g. "cuda" where its CUDA runtime does not work with the driver
        return frozenset()


def _cpu_info() -> tuple[str, frozenset[str]]:
    model, flags = platform.processor() or "unknown", frozenset()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return model, flags
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and model in ("unknown", "", platform.machine()):
            model = value.strip()
        elif key.strip() in ("flags", "Features") and not flags:
            flags = frozenset(f for f in value.split() if f in ISA_FLAGS)
    return model, flags


@functools.cache
def this_cpu() -> tuple[str, frozenset[str]]:
    """This host's CPU model and ISA flags, as probe() reports them: whether a Hardware describes this host."""
    return _cpu_info()


AMX_OFF_ENV = "INFERPLUG_NO_AMX"  # 1: answer as a host whose kernel refuses the tiles (tests, a suspect host)
_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA = 158, 0x1023, 18  # x86_64 Linux


def amx_tiles(flags: frozenset[str]) -> str | None:
    """Whether this process may use AMX tiles: None where the CPU has none, else "granted" or why not. Linux gives
    a process the tile state only once it asks (arch_prctl ARCH_REQ_XCOMP_PERM); where it refuses, a tile
    instruction dies with SIGILL, as a native llama.cpp build does at tilezero on such a host."""
    if "amx_tile" not in flags:
        return None
    if os.environ.get(AMX_OFF_ENV, "") not in ("", "0"):
        return f"refused: {AMX_OFF_ENV}={os.environ[AMX_OFF_ENV]}"
    return _request_tile_data()


@functools.cache
def _request_tile_data() -> str:
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return f"refused: no arch_prctl on {platform.system()} {platform.machine()}"
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0:
        return "granted"
    return f"refused by the kernel (arch_prctl ARCH_REQ_XCOMP_PERM: {os.strerror(ctypes.get_errno())})"


def _memory_info() -> tuple[int, int]:
    values: dict[str, int] = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            values[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    total = values.get("MemTotal", 0)
    available = values.get("MemAvailable", total)
    limit = _cgroup_memory_limit()  # in a container /proc/meminfo shows the host; the cgroup is the real bound
    if limit is not None:
        limit_total, limit_free = limit
        total, available = min(total, limit_total), min(available, limit_free)
    return total, available


def _cgroup_memory_limit(root: Path = Path("/sys/fs/cgroup")) -> tuple[int, int] | None:
    """(limit, limit - usage) of the cgroup v2 this process runs in, or None without a limit."""
    try:
        raw = (root / "memory.max").read_text().strip()
        if raw == "max":
            return None
        limit, used = int(raw), int((root / "memory.current").read_text())
    except (OSError, ValueError):
        return None
    return limit, max(limit - used, 0)


def nvidia_driver_present() -> bool:
    return Path("/proc/driver/nvidia/version").exists() or Path("/dev/nvidia0").exists()


def _gpu_info() -> tuple[tuple[GPU, ...], str | None, str | None, str | None]:
    if not nvidia_driver_present():
        return (), None, None, None
    if importlib.util.find_spec("torch") is None:
        return (), None, _driver_version(), "an NVIDIA driver is present but torch is not installed"
    import torch

    if not torch.cuda.is_available():
        why = f"torch {torch.__version__} has no CUDA" if torch.version.cuda is None else "CUDA is not usable"
        return (), torch.version.cuda, _driver_version(), f"an NVIDIA driver is present but {why}"
    gpus = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        free, total = torch.cuda.mem_get_info(i)
        gpus.append(GPU(i, props.name, (props.major, props.minor), total, free))
    return tuple(gpus), torch.version.cuda, _driver_version(), None


def _driver_version() -> str | None:
    try:
        first = Path("/proc/driver/nvidia/version").read_text().splitlines()[0]
    except (OSError, IndexError):
        return None
    words = first.split()
    return next((w for w in words if w.count(".") >= 1 and w.replace(".", "").isdigit()), None)
