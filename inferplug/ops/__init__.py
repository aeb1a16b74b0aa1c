"""The one ops interface LlamaModel calls (attention, KV store, RoPE, norms, activation), chosen once when the
model is built by `select_ops`; nothing else decides which kernels run.

- `TorchOps` (torch_ops.py): torch everywhere; the base the others override method by method.
- `CpuKernelOps` (cpu_ops.py): inferplug's C++ kernels, fp32 on an AVX2/AVX-512 CPU (K/V pools fp32 or fp16).
- `TritonOps` (triton_ops.py): the Triton kernels in inferplug/kernels on CUDA (or in Triton's interpreter on
  CPU tensors, for tests); `FlashOps` runs prefill in flash-attn instead.
"""

from __future__ import annotations

import os

import torch

from inferplug.errors import ProfileError
from inferplug.ops.step import StepRows
from inferplug.ops.torch_ops import TorchOps

ATTENTION_CHOICES = ("auto", "torch", "sdpa", "triton", "flash")

__all__ = ["ATTENTION_CHOICES", "StepRows", "TorchOps", "select_ops"]


def select_ops(attention: str, device: torch.device, dtype: torch.dtype, kv_dtype: torch.dtype, head_dim: int) -> TorchOps:
    """The ops set for `attention` (the plan's choice) on `device`. ProfileError when it cannot run here."""
    if attention not in ATTENTION_CHOICES:
        raise ProfileError(f"attention {attention!r} is not one the native engine runs; use one of "
                           f"{', '.join(ATTENTION_CHOICES)}")
    if attention in ("triton", "flash") or (attention == "auto" and device.type == "cuda" and _has_triton()):
        return _triton_ops(attention, device, dtype)
    from inferplug.kernels import cpu as cpu_kernels

    if device.type == "cpu" and dtype == torch.float32 and str(kv_dtype).removeprefix("torch.") in cpu_kernels.KV_DTYPES:
        kernels = cpu_kernels.ops()  # None where the CPU or the compiler cannot run them
        if kernels is not None:
            from inferplug.ops.cpu_ops import CpuKernelOps

            return CpuKernelOps(kernels, dtype, head_dim=head_dim)
    return TorchOps(dtype)


def _triton_ops(attention: str, device: torch.device, dtype: torch.dtype) -> TorchOps:
    interpreted = os.environ.get("TRITON_INTERPRET", "") not in ("", "0")
    if device.type != "cuda" and not interpreted:
        raise ProfileError(f"attention {attention!r} runs Triton kernels, which need a CUDA device (this engine is on "
                           f"{device}); use attention = 'auto' or 'torch'")
    if not _has_triton():
        raise ProfileError(f"attention {attention!r} needs the triton package; install it or use attention = 'torch'")
    if attention == "flash":
        from inferplug.ops.flash_ops import FlashOps

        return FlashOps(dtype)
    from inferplug.ops.triton_ops import TritonOps

    return TritonOps(dtype)


def _has_triton() -> bool:
    import importlib.util

    return importlib.util.find_spec("triton") is not None
