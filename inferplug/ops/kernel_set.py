"""Which ops set runs a model's attention, KV store, RoPE, norms and activation: the one decision. The resolver asks
it with the plan's hardware facts (Plan.attention is its answer, so `resolve` names what runs), and select_ops asks
it again only for an engine built without a plan ("auto", a test's or a bench's pin).

- `cpu-kernels`: inferplug's C++ kernels, on a CPU where they run, fp32 compute, K/V pools fp32 or fp16;
- `torch`: torch's own ops (scaled_dot_product_attention for prefill, batched matmuls for decode), anywhere;
- `triton`: the Triton kernels on CUDA (or in Triton's interpreter, TRITON_INTERPRET=1, on CPU tensors);
- `flash`: as triton, prefill in flash-attn.
"""

from __future__ import annotations

import importlib.util
import os
import warnings

from inferplug.errors import InferPlugDeprecationWarning, ProfileError
from inferplug.kernels import cpu as cpu_kernels

KERNEL_SETS = ("cpu-kernels", "torch", "triton", "flash")
ATTENTION_CHOICES = ("auto", *KERNEL_SETS)
OLD_ATTENTION = ("sdpa",)  # before the rename it ran what `torch` did: the CPU kernels where they ran, else torch
_BUILD_FAILED = "they failed to build"


def kernel_set(attention: str, device_type: str, dtype: str, kv_dtype: str | None, hw=None) -> str:
    """The ops set (one of KERNEL_SETS) that `attention` runs on `device_type` in `dtype` with K/V pools in
    `kv_dtype` (None: not pinned, the pools follow the ops). `hw`: hardware.Hardware, the resolver's facts; without
    it the packages are looked up and the CPU kernels built. ProfileError naming the fix where a pin cannot run."""
    if attention not in ATTENTION_CHOICES + OLD_ATTENTION:
        raise ProfileError(f"attention {attention!r} is not one the native engine runs; use one of "
                           f"{', '.join(ATTENTION_CHOICES)}")
    kernels_off = cpu_kernels_off(device_type, dtype, kv_dtype, hw)
    if attention == "sdpa":
        new = "torch" if kernels_off else "cpu-kernels"
        warnings.warn(f"attention = 'sdpa' is renamed: here it runs {new!r}; set attention = {new!r} (or 'auto'). "
                      "The old name goes in the next release.", InferPlugDeprecationWarning, stacklevel=2)
        return new
    if attention == "torch" and not kernels_off:
        warnings.warn("attention = 'torch' now runs torch's own attention; until this release it ran inferplug's C++ "
                      "kernels on this CPU: set attention = 'cpu-kernels' (or 'auto') to keep them.",
                      InferPlugDeprecationWarning, stacklevel=2)
    if attention == "cpu-kernels" and kernels_off and kernels_off.startswith(_BUILD_FAILED):
        return "torch"  # the plan saw the ISA, the compiler failed here: keep serving (cpu_kernels.ops() logged it)
    if attention == "cpu-kernels" and kernels_off:
        raise ProfileError(f"attention = 'cpu-kernels' cannot run here: {kernels_off}; use attention = 'auto' or "
                           "'torch'")
    if attention in ("triton", "flash"):
        _check_triton(attention, device_type, hw)
    if attention != "auto":
        return attention
    if device_type == "cuda" and _has("triton", hw):
        return "triton"
    return "torch" if kernels_off else "cpu-kernels"


def cpu_kernels_off(device_type: str, dtype: str, kv_dtype: str | None, hw) -> str | None:
    """Why inferplug's CPU kernels cannot take this model's ops, or None where they can."""
    if device_type != "cpu":
        return f"the model is on {device_type}, not the CPU"
    if dtype != "float32":
        return f"they compute in float32, and dtype is {dtype}"
    if kv_dtype is not None and kv_dtype not in cpu_kernels.KV_DTYPES:
        return f"they read K/V pools in {' or '.join(cpu_kernels.KV_DTYPES)}, and kv_dtype is {kv_dtype}"
    if not cpu_kernels.runs_on("cpu", hw):
        return cpu_kernels.unavailable_reason(hw) or f"{_BUILD_FAILED}: {cpu_kernels.build_error()}"
    return None


def _check_triton(attention: str, device_type: str, hw) -> None:
    interpreted = hw is None and os.environ.get("TRITON_INTERPRET", "") not in ("", "0")
    if device_type != "cuda" and not interpreted:
        raise ProfileError(f"attention = {attention!r} needs a CUDA GPU for its Triton kernels (this engine is on "
                           f"{device_type}); use attention = 'auto' or 'torch'")
    if not _has("triton", hw):
        raise ProfileError(f"attention = {attention!r} needs the triton package; it is not installed (install it, "
                           "or use attention = 'torch')")
    if attention == "flash" and not _has("flash_attn", hw):
        raise ProfileError("attention = 'flash' needs the flash-attn package; it is not installed (use auto or "
                           "triton)")


def _has(package: str, hw) -> bool:
    return hw.has(package) if hw is not None else importlib.util.find_spec(package) is not None
