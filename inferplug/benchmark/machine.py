"""What a benchmark report records about the run and reads from this process, shared by `inferplug bench` and
bench/*.py: the machine and the peers' versions, the process's memory, the default profile's model file."""

from __future__ import annotations

import os
import platform
from pathlib import Path

from inferplug.hardware import version_of

REPORTED_PACKAGES = ("inferplug", "torch", "transformers", "ctranslate2", "llama_cpp_python")


def machine(cores: int | None = None) -> dict:
    """The CPU, its ISA, the cores used (all by default), RAM, Python, the OS and the peers' versions."""
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")),
               platform.processor() or "?")
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f" {f}" in cpuinfo]
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {"cpu": cpu, "cores": cores or os.cpu_count() or 1, "isa": isa, "memory_gib": round(mem, 1),
            "python": platform.python_version(), "os": platform.platform(),
            "versions": {p: version_of(p) for p in REPORTED_PACKAGES}}


def memory_bytes(*fields: str) -> dict[str, int]:
    """This process's /proc/self/status memory fields in bytes: VmRSS now, VmHWM its peak so far."""
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    missing = [f for f in fields if f not in status]
    if missing:
        raise RuntimeError(f"/proc/self/status has no {', '.join(missing)}")
    return {f: int(status[f].split()[0]) * 1024 for f in fields}


def default_model() -> Path:
    """The default profile's model file, pulled into INFERPLUG_HOME on first use."""
    from inferplug.profile import load_profile
    from inferplug.sources import ensure_local

    return ensure_local(load_profile("smollm2-135m").model)
