"""Pure-torch paged prefill attention: the specification of prefill_attention.py, and its random test inputs."""

from __future__ import annotations

import torch

from inferplug.kernels.paged_attention_ref import random_pool


def prefill_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cu_seqlens: torch.Tensor,
                          ctx_lens: torch.Tensor, block_tables: torch.Tensor, scale: float) -> torch.Tensor:
    """Sequences packed along q's rows: sequence i's query rows are [cu_seqlens[i], cu_seqlens[i + 1]), its
    last q_len tokens of ctx_lens[i], whose K/V (the cached prefix and the chunk itself) are all in the pools
    ([kv_heads, blocks, block_size, D]) through block_tables[i]. Query j (at position ctx_len - q_len + j)
    attends causally to positions 0..its own. q [T, heads, D] -> [T, heads, D] in q's dtype; fp32 math or q's."""
    heads, head_dim = q.shape[1:]
    kv_heads, block_size = k_cache.shape[0], k_cache.shape[2]
    math = torch.float64 if q.dtype == torch.float64 else torch.float32
    out = torch.empty_like(q)
    for i in range(len(ctx_lens)):
        first, last, ctx_len = int(cu_seqlens[i]), int(cu_seqlens[i + 1]), int(ctx_lens[i])
        blocks = block_tables[i, : -(-ctx_len // block_size)].long()
        keys = k_cache[:, blocks].reshape(kv_heads, -1, head_dim)[:, :ctx_len].to(math)
        values = v_cache[:, blocks].reshape(kv_heads, -1, head_dim)[:, :ctx_len].to(math)
        keys = keys.repeat_interleave(heads // kv_heads, dim=0)  # [heads, ctx_len, D]
        values = values.repeat_interleave(heads // kv_heads, dim=0)
        queries = q[first:last].transpose(0, 1).to(math)  # [heads, q_len, D]
        positions = torch.arange(ctx_len - (last - first), ctx_len)
        visible = torch.arange(ctx_len)[None, :] <= positions[:, None]  # [q_len, ctx_len]
        scores = (queries @ keys.transpose(1, 2) * scale).masked_fill(~visible, float("-inf"))
        out[first:last] = (scores.softmax(dim=-1) @ values).transpose(0, 1).to(q.dtype)
    return out


def random_prefill(*, chunks: list[tuple[int, int]], heads: int, kv_heads: int, head_dim: int, block_size: int,
                   dtype=torch.float32, device="cpu", seed=0):
    """Pools holding each sequence's full context behind a scrambled block table, and the packed queries of
    `chunks`: (cached prefix, new tokens) per sequence. Returns q, k_cache, v_cache, cu_seqlens, ctx_lens, tables."""
    ctx_lens = [prefix + new for prefix, new in chunks]
    _, k_cache, v_cache, tables, lens = random_pool(batch=len(chunks), heads=heads, kv_heads=kv_heads,
                                                    head_dim=head_dim, block_size=block_size, seq_lens=ctx_lens,
                                                    device=device, dtype=dtype, seed=seed)  # fmt: skip
    generator = torch.Generator().manual_seed(seed + 1)
    total = sum(new for _, new in chunks)
    q = torch.randn(total, heads, head_dim, generator=generator).to(device, dtype)
    cu = torch.tensor([0] + [new for _, new in chunks]).cumsum(0).to(device, torch.int32)
    return q, k_cache, v_cache, cu, lens, tables
