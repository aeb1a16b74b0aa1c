"""A decode-attention reference that shares no code with inferplug/kernels/paged_attention_ref.py: each sequence's K/V
gathered token by token (block = slot // block_size, offset = slot % block_size), padded to the longest,
and torch's scaled_dot_product_attention with a length mask and its own GQA head mapping (enable_gqa)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def sdpa_decode(q, k_cache, v_cache, block_tables, seq_lens, scale: float) -> torch.Tensor:
    """q [B, heads, D]; pools [kv_heads, blocks, block_size, D]; tables [B, max_blocks]; lens [B]. fp32 math."""
    block_size = k_cache.shape[2]
    slots = torch.arange(int(seq_lens.max()), device=q.device)
    blocks = block_tables.long()[:, slots // block_size]  # [B, L]: row b's block of each token slot
    keys = k_cache[:, blocks, slots % block_size].transpose(0, 1).float()  # [B, kv_heads, L, D]
    values = v_cache[:, blocks, slots % block_size].transpose(0, 1).float()
    visible = (slots[None, :] < seq_lens.to(slots.device)[:, None])[:, None, None, :]  # [B, 1, 1, L]
    out = F.scaled_dot_product_attention(q.float()[:, :, None], keys, values, attn_mask=visible, scale=scale,
                                         enable_gqa=True)
    return out[:, :, 0].to(q.dtype)
