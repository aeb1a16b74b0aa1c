"""attention = "flash": prefill rows in flash-attn's varlen kernel, everything else as TritonOps.

flash-attn reads contiguous K/V, not this engine's head-major pools, so each prefill sequence's context is
gathered through its block table first; its causal mask aligns the chunk's queries to the end of the context
(a chunk over a cached prefix), as the Triton prefill kernel does."""

from __future__ import annotations

import torch

from inferplug.errors import ProfileError
from inferplug.ops.attention import PackedPrefill
from inferplug.ops.triton_ops import TritonOps


class FlashOps(TritonOps):
    name = "flash"

    def __init__(self, dtype: torch.dtype = torch.bfloat16):
        super().__init__(dtype)
        try:
            from flash_attn import flash_attn_varlen_func
        except ImportError as exc:
            raise ProfileError(f"attention 'flash' needs flash-attn ({exc}); install flash-attn or use attention = "
                               "'triton'") from exc
        self.varlen = flash_attn_varlen_func

    def prefill(self, q, k_cache, v_cache, packed: PackedPrefill, scale: float, window: int = 0,
                sinks: torch.Tensor | None = None) -> torch.Tensor:
        if sinks is not None:  # flash-attn's varlen kernel has no sinks: the Triton kernel takes them
            return super().prefill(q, k_cache, v_cache, packed, scale, window, sinks)
        block_size = k_cache.shape[2]
        lens = packed.ctx_lens.tolist()
        keys, values = [], []
        for i, length in enumerate(lens):
            blocks = packed.block_tables[i, : -(-length // block_size)].long()
            for pool, out in ((k_cache, keys), (v_cache, values)):  # [kv_heads, length, D] -> [length, kv_heads, D]
                out.append(pool[:, blocks].flatten(1, 2)[:, :length].transpose(0, 1).to(q.dtype))
        cu_k = torch.tensor([0, *lens], device=q.device).cumsum(0).to(torch.int32)
        return self.varlen(q.contiguous(), torch.cat(keys), torch.cat(values), packed.cu_seqlens, cu_k,
                           packed.max_q_len, max(lens), softmax_scale=scale, causal=True,
                           window_size=(window - 1, 0) if window else (-1, -1))  # flash-attn's: keys i-left..i
