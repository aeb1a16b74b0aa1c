"""Pure-torch paged-attention decode: the reference the Triton and C++ kernels are tested against, and their
random test inputs."""

from __future__ import annotations

import torch


def paged_attention_decode_ref(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
) -> torch.Tensor:  # fmt: skip
    """One query token per sequence, attending to its first seq_lens[b] cached tokens.

    q [B, heads, D]; k_cache / v_cache [kv_heads, num_blocks, block_size, D] (the engine's pool
    layout); block_tables [B, max_blocks] int; seq_lens [B] int. Returns [B, heads, D] in q's dtype.
    """
    batch, heads, head_dim = q.shape
    kv_heads, block_size = k_cache.shape[0], k_cache.shape[2]
    out = torch.empty_like(q)
    for b in range(batch):
        length = int(seq_lens[b])
        blocks = block_tables[b, : (length + block_size - 1) // block_size].long()
        keys = k_cache[:, blocks].reshape(kv_heads, -1, head_dim)[:, :length].transpose(0, 1).float()  # [S, kv_heads, D]
        values = v_cache[:, blocks].reshape(kv_heads, -1, head_dim)[:, :length].transpose(0, 1).float()
        keys = keys.repeat_interleave(heads // kv_heads, dim=1)  # clarity over speed: one K/V per head
        values = values.repeat_interleave(heads // kv_heads, dim=1)
        scores = torch.einsum("hd,shd->hs", q[b].float(), keys) * scale
        out[b] = torch.einsum("hs,shd->hd", scores.softmax(dim=-1), values).to(q.dtype)
    return out


def random_pool(*, batch, heads, kv_heads, head_dim, block_size, seq_lens, device="cpu", dtype=torch.float32, seed=0):
    """Random K/V pools with each sequence's blocks scattered in a shuffled order, as after churn."""
    generator = torch.Generator().manual_seed(seed)
    blocks_per_seq = [(n + block_size - 1) // block_size for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + 3  # a few blocks nobody owns
    order = torch.randperm(num_blocks, generator=generator)
    tables = torch.zeros(batch, max(blocks_per_seq), dtype=torch.int32)
    taken = 0
    for b, count in enumerate(blocks_per_seq):
        tables[b, :count] = order[taken : taken + count]
        taken += count
    shape = (kv_heads, num_blocks, block_size, head_dim)  # the engine's pool layout
    k_cache = torch.randn(shape, generator=generator).to(device, dtype)
    v_cache = torch.randn(shape, generator=generator).to(device, dtype)
    q = torch.randn(batch, heads, head_dim, generator=generator).to(device, dtype)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    return q, k_cache, v_cache, tables.to(device), lens.to(device)


def paged_attention_ref(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    query_starts: torch.Tensor, context_lens: torch.Tensor, scale: float, dtype: torch.dtype = torch.float64,
    window: int = 0, sinks: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """Causal attention for chunks of new query rows: sequence s has q rows [query_starts[s], query_starts[s + 1]),
    the last at position context_lens[s] - 1, each attending to the positions up to its own (its cached prefix
    and the chunk's rows before it; with a `window`, only the last `window` of them). `sinks` [heads]: each head's
    attention-sink logit, a last column in its softmax that is then dropped (gpt-oss, as HF's eager attention).
    Computed in `dtype` (fp64: the kernels' errors are measured against it). Returns [tokens, heads, D] in `dtype`."""
    heads, block_size = q.shape[1], k_cache.shape[2]
    out = torch.empty(q.shape, dtype=dtype)
    for s in range(len(context_lens)):
        start, end, length = int(query_starts[s]), int(query_starts[s + 1]), int(context_lens[s])
        blocks = block_tables[s, : (length + block_size - 1) // block_size].long()
        keys, values = (c[:, blocks].flatten(1, 2)[:, :length].to(dtype) for c in (k_cache, v_cache))  # [kv_heads, S, D]
        keys = keys.repeat_interleave(heads // k_cache.shape[0], dim=0)  # clarity over speed: one K/V per head
        values = values.repeat_interleave(heads // k_cache.shape[0], dim=0)
        scores = torch.einsum("thd,hsd->hts", q[start:end].to(dtype), keys) * scale
        positions = torch.arange(length - (end - start), length)
        scores.masked_fill_(torch.arange(length)[None, :] > positions[:, None], float("-inf"))
        if window:
            scores.masked_fill_(torch.arange(length)[None, :] <= positions[:, None] - window, float("-inf"))
        if sinks is None:
            probs = scores.softmax(dim=-1)
        else:
            sink = sinks.to(dtype)[:, None, None].expand(-1, end - start, 1)
            probs = torch.cat([scores, sink], dim=-1).softmax(dim=-1)[..., :-1]
        out[start:end] = torch.einsum("hts,hsd->thd", probs, values)
    return out
