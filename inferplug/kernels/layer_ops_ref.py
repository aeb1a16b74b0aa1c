"""Pure-torch specifications of the Triton layer kernels in layer_ops.py: the KV store through the slot
mapping, RMSNorm with the residual add, and rotate-half RoPE. Clarity over speed."""

from __future__ import annotations

import torch


def store_kv_ref(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 slots: torch.Tensor) -> None:
    """Row t of k / v ([T, kv_heads, D]) goes to flat slot slots[t] (block * block_size + offset) of the pools
    ([kv_heads, blocks, block_size, D]), cast to the pool's dtype; a slot of -1 stores nothing."""
    block_size = k_cache.shape[2]
    for t, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        block, offset = divmod(slot, block_size)
        k_cache[:, block, offset] = k[t].to(k_cache.dtype)
        v_cache[:, block, offset] = v[t].to(v_cache.dtype)


def add_rms_norm_ref(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x += delta in place (rounded to x's dtype), then x / sqrt(mean(x^2) + eps) in fp32, rounded to x's dtype
    and scaled by weight (HF's RMSNorm rounding). Returns the normalised rows."""
    if delta is not None:
        x.add_(delta)
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps)
    return normed.to(x.dtype) * weight


def rope_ref(qk: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE of qk [T, heads, D] at `positions`: the first and second halves of D pair up,
    x1' = x1 cos - x2 sin and x2' = x2 cos + x1 sin (signed_sin holds -sin then +sin)."""
    half = qk.shape[-1] // 2
    c = cos[positions].to(qk.dtype)[:, None]
    s = signed_sin[positions].to(qk.dtype)[:, None]
    swapped = torch.cat([qk[..., half:], qk[..., :half]], dim=-1)
    return qk * c + swapped * s
