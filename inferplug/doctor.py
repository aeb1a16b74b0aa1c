"""The `inferplug doctor` report: the machine, each backend (usable here or why not), each profile (fits?).

Nothing heavy is imported: backends are checked with importlib.util.find_spec (exllamav2 is never
imported, least of all without CUDA), and torch only when an NVIDIA driver is present.
"""

from __future__ import annotations

import json
from typing import Any

from inferplug.kernels import cpu as cpu_kernels
from inferplug.compute_path_plan import onednn_max_isa
from inferplug.errors import InferPlugError
from inferplug.hardware import Hardware, probe
from inferplug.memory_plan import gib
from inferplug.models import huge_pages
from inferplug.parallel_plan import doctor_line

LOCAL_BACKENDS = ("native", "ctranslate2", "exllamav2")


def backend_status(hw: Hardware) -> dict[str, dict[str, Any]]:
    """name -> {"usable": bool, "why": str}."""
    from inferplug.backends.base import available_backends

    registered = set(available_backends())
    where = "cuda" if hw.gpus else "cpu"
    checks = {
        "native": [("torch", "pip install torch==2.13.0 'inferplug[native]'"), ("transformers", "pip install transformers")],
        "ctranslate2": [("ctranslate2", "pip install 'inferplug[ctranslate2]'")],
        "exllamav2": [("exllamav2", "pip install 'inferplug[exllamav2]'")],
        "openai": [("httpx", "pip install 'inferplug[openai]'")],
    }
    status = {}
    for name, needs in checks.items():
        missing = [f"{pkg} is not installed ({fix})" for pkg, fix in needs if not hw.has(pkg)]
        if name == "exllamav2" and not hw.gpus:
            missing.insert(0, "needs a CUDA GPU; none found")
        if name not in registered:
            missing.append("its entry point is not registered (pip install -e .)")
        usable_on = "a remote OpenAI-compatible server" if name == "openai" else where
        status[name] = {"usable": not missing, "why": "; ".join(missing) or f"usable on {usable_on}"}
    return status


def ray_status(hw: Hardware) -> dict[str, Any]:
    """Can `serve --replicas N` run here: Ray installed, and the cluster RAY_ADDRESS names reachable."""
    import os

    from inferplug.errors import BackendUnavailable
    from inferplug.replica_plan import INSTALL, check_reachable

    address = os.environ.get("RAY_ADDRESS") or None
    if not hw.has("ray"):
        return {"installed": False, "address": address, "reachable": None,
                "why": f"not installed: replicas > 1 need it ({INSTALL})"}
    if address is None:
        return {"installed": True, "address": None, "reachable": None,
                "why": "installed; no RAY_ADDRESS: `serve --replicas N` starts a local Ray"}
    try:
        check_reachable(address)
    except BackendUnavailable as exc:
        return {"installed": True, "address": address, "reachable": False, "why": str(exc)}
    return {"installed": True, "address": address, "reachable": True, "why": f"installed; cluster at {address} answers"}


def profile_status(hw: Hardware) -> list[dict[str, Any]]:
    """Each profile found by name: does it fit here, on what, and how much context x batch."""
    from inferplug.profile import list_profiles, load_profile
    from inferplug.resolver import resolve
    from inferplug.sources import cached_path

    rows = []
    for name, path in list_profiles().items():
        row: dict[str, Any] = {"name": name, "fits": False}
        try:
            profile = load_profile(path)
            model = profile.model
            if model.kind and model.hints is None and cached_path(model) is None:
                row["why"] = f"model not pulled yet (inferplug pull {name})"
                row["fits"] = None
            else:
                plan = resolve(profile, hw)
                row.update(fits=True, backend=plan.backend, device=plan.device, dtype=plan.compute_type or plan.dtype,
                           weights=plan.weight_format,
                           max_model_len=plan.max_model_len, max_num_seqs=plan.max_num_seqs,
                           seqs_at_full_context=plan.memory.seqs_at_full_context if plan.memory else None,
                           weights_bytes=plan.memory.weights_bytes if plan.memory else None,
                           prefill=next((r for r in plan.reasons if r.startswith("prefill: ")), None),
                           why=_fit_summary(plan, profile.cache.memory))
        except InferPlugError as exc:
            rejected = getattr(exc, "rejected", None)
            row["why"] = next(f"{b}: {why}" for b, why in rejected.items()) if rejected else str(exc)
            row["rejected"] = rejected
        rows.append(row)
    return rows


def _fit_summary(plan: Any, cache_memory: str | float) -> str:
    """The plan's memory in a line, with the rule that sized its KV cache (memory_plan.plan_memory)."""
    if plan.memory is None:
        return plan.reasons[-1]
    m = plan.memory
    if cache_memory != "auto":
        rule = f"cache.memory = {cache_memory!r}"
    elif plan.device == "cpu":
        rule = "auto: one full context"
    else:
        rule = "auto: up to 90% of what the weights leave"
    return f"weights {gib(m.weights_bytes)} + KV cache {gib(m.kv_budget_bytes)} ({m.cache_tokens} tokens, {rule})"


def collect(hw: Hardware | None = None) -> dict[str, Any]:
    hw = hw or probe()
    backends = backend_status(hw)
    profiles = profile_status(hw)
    local_fit = any(p["fits"] for p in profiles if p.get("backend") != "openai")
    unknown_but_usable = all(p["fits"] is None for p in profiles) and any(
        backends[b]["usable"] for b in LOCAL_BACKENDS)
    return {
        "machine": {"os": hw.os, "python": hw.python, "cpu": hw.cpu_model, "isa": hw.isa_summary,
                    "cores": hw.cpu_count, "ram_total": hw.ram_total, "ram_available": hw.ram_available},
        "gpus": [{"index": g.index, "name": g.name, "capability": f"{g.capability[0]}.{g.capability[1]}",
                  "total_memory": g.total_memory, "free_memory": g.free_memory} for g in hw.gpus],
        **_kernel_status(hw), "amx": onednn_max_isa(hw)[1] or None, "huge_pages": huge_pages.status(),
        "tensor_parallel": doctor_line(hw),
        "cuda_version": hw.cuda_version, "driver_version": hw.driver_version, "gpu_note": hw.gpu_note,
        "backends": backends, "ray": ray_status(hw), "profiles": profiles, "ok": local_fit or unknown_but_usable,
    }


def _kernel_status(hw: Hardware) -> dict[str, str | None]:
    """cpu_kernels: why the CPU kernels are off (None: they run); cpu_kernels_isa: the set that runs."""
    off = cpu_kernels.unavailable_reason(hw)
    if off:
        return {"cpu_kernels": off, "cpu_kernels_isa": None}
    try:
        return {"cpu_kernels": None, "cpu_kernels_isa": {"avx2": "AVX2", "avx512": "AVX-512 + VNNI"}[cpu_kernels.chosen_isa(hw)]}
    except InferPlugError as exc:  # INFERPLUG_CPU_ISA names a set this CPU cannot run
        return {"cpu_kernels": str(exc), "cpu_kernels_isa": None}


def run_doctor(as_json: bool = False, bench: bool = False, bench_seconds: float = 20.0) -> int:
    if bench:  # the profiles' kernel paths are timed again as they resolve (host_timings.py)
        from inferplug.host_timings import forget

        forget()
    report = collect()
    if bench:
        report["bench"] = _bench(print_report=not as_json, seconds=bench_seconds)
        add_bandwidth_bounds(report["profiles"], report["bench"]["memory_bandwidth_bytes_per_s"])
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report)
    return 0 if report["ok"] else 1


def add_bandwidth_bounds(profiles: list[dict[str, Any]], bandwidth: float) -> None:
    """The single-stream decode speed this host's measured memory bandwidth allows each fitting profile: each
    step streams the weights once (an upper bound: the embedding is counted whole, the KV cache not at all)."""
    for row in profiles:
        if row["fits"] and row.get("weights_bytes"):
            row["bandwidth_bound_tokens_per_s"] = bandwidth / row["weights_bytes"]


def _bench(print_report: bool, seconds: float) -> dict[str, Any]:
    try:
        from inferplug import selftest
    except ImportError:
        raise InferPlugError("`doctor --bench` needs inferplug.selftest, which this install lacks") from None
    return selftest.run(seconds=seconds, print_report=print_report)


def print_report(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    m = report["machine"]
    machine = Table(title="machine", show_header=False)
    for key, value in [("os", m["os"]), ("python", m["python"]), ("cpu", m["cpu"]),
                       ("isa", ", ".join(m["isa"]) or "none of AVX2/AVX-512/VNNI/AMX"), ("cores", m["cores"]),
                       ("ram", f"{gib(m['ram_available'])} free of {gib(m['ram_total'])}")]:
        machine.add_row(key, str(value))
    for g in report["gpus"]:
        machine.add_row(f"gpu {g['index']}", f"{g['name']} (sm {g['capability']}), {gib(g['free_memory'])} free of "
                        f"{gib(g['total_memory'])}")
    off = report["cpu_kernels"]
    machine.add_row("cpu kernels", f"off: {escape(off)}" if off else f"{escape(report['cpu_kernels_isa'])}: the native "
                    "engine's int8/int4 matmuls, paged decode attention and RMSNorm (compiled on first use)")
    if report["amx"]:
        machine.add_row("amx", escape(report["amx"]))
    if report["huge_pages"]:
        machine.add_row("2 MiB pages", escape(report["huge_pages"]))
    machine.add_row("tensor parallel", escape(report["tensor_parallel"]))
    machine.add_row("cuda", f"{report['cuda_version'] or 'none'} (driver {report['driver_version'] or 'none'})")
    if report["gpu_note"]:
        machine.add_row("gpu", escape(report["gpu_note"]))
    machine.add_row("ray", escape(report["ray"]["why"]))
    console.print(machine)
    backends = Table("backend", "usable", "why", title="backends")
    for name, s in report["backends"].items():
        backends.add_row(name, "[green]yes[/]" if s["usable"] else "[red]no[/]", escape(s["why"]))
    console.print(backends)
    profiles = Table("profile", "fits", "runs on", "max context x batch", "why", title="profiles")
    for p in report["profiles"]:
        fits = {True: "[green]yes[/]", False: "[red]no[/]", None: "[yellow]?[/]"}[p["fits"]]
        runs = " ".join(p[k] for k in ("backend", "device", "dtype") if p[k] != "auto") if p["fits"] else ""
        if p.get("weights"):
            runs += f", {p['weights']} weights"
        if p.get("bandwidth_bound_tokens_per_s"):
            runs += f", <= {p['bandwidth_bound_tokens_per_s']:.0f} tok/s one stream (memory bandwidth)"
        ctx = f"{p['max_model_len']} x {p['seqs_at_full_context'] or p['max_num_seqs']}" if p["fits"] else ""
        profiles.add_row(p["name"], fits, runs, ctx, escape(p.get("why", "")))
    console.print(profiles)
    prefill = Table("profile", "prompt rows of block layers (the paths timed on this host)", title="prefill paths")
    for p in report["profiles"]:
        if p.get("prefill"):
            prefill.add_row(p["name"], escape(p["prefill"].removeprefix("prefill: ")))
    if prefill.row_count:
        console.print(prefill)
    if not report["ok"]:
        console.print("[bold red]nothing can run here[/]: install a backend (see above) or add a profile that fits")
