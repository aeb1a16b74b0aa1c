"""The one ops interface DecoderModel calls (attention, KV store, RoPE, norms, activation), built once when the
model is built by `select_ops`, for the set that `kernel_set.kernel_set` names: nothing else decides which
kernels run.

- `TorchOps` (torch_ops.py): torch everywhere; the base the others override method by method.
- `CpuKernelOps` (cpu_ops.py): inferplug's C++ kernels, fp32 on an AVX2/AVX-512 CPU (K/V pools fp32 or fp16).
- `TritonOps` (triton_ops.py): the Triton kernels in inferplug/kernels on CUDA (or in Triton's interpreter on
  CPU tensors, for tests); `FlashOps` runs prefill in flash-attn instead.
"""

from __future__ import annotations

import torch

from inferplug.ops.kernel_set import ATTENTION_CHOICES, kernel_set
from inferplug.ops.step import StepLayout
from inferplug.ops.torch_ops import TorchOps

__all__ = ["ATTENTION_CHOICES", "StepLayout", "TorchOps", "select_ops"]


def select_ops(attention: str, device: torch.device, dtype: torch.dtype, kv_dtype: torch.dtype, head_dim: int) -> TorchOps:
    """The ops set for `attention` (the plan's kernel set, or a choice kernel_set resolves) on `device`.
    ProfileError when it cannot run here."""
    chosen = kernel_set(attention, device.type, _name(dtype), _name(kv_dtype), warn=False)  # the resolver warned
    if chosen == "cpu-kernels":
        from inferplug.kernels import cpu as cpu_kernels
        from inferplug.ops.cpu_ops import CpuKernelOps

        return CpuKernelOps(cpu_kernels.ops(), dtype, head_dim=head_dim)
    if chosen == "flash":
        from inferplug.ops.flash_ops import FlashOps

        return FlashOps(dtype)
    if chosen == "triton":
        from inferplug.ops.triton_ops import TritonOps

        return TritonOps(dtype)
    return TorchOps(dtype)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
