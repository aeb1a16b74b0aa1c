"""The Triton ops set (inferplug/kernels) for CUDA; under TRITON_INTERPRET=1 the same kernels run on CPU
tensors, which is how CI checks this path end to end without a GPU.

A step's decode rows go to the paged decode kernel (split-K), its prefill rows, packed with cu_seqlens, to the
prefill kernel, which reads each chunk's cached prefix and the chunk itself through the block table. RoPE runs in
place and K/V are stored through the slot mapping before attention; RMSNorm is fused with the residual add. A hybrid
model's prompt rows take the Triton chunked delta rule in its DeltaNet layers."""

from __future__ import annotations

import torch


from inferplug.kernels.delta_rule import chunked_delta_rule
from inferplug.kernels.layer_ops import add_rms_norm, rope_, store_kv
from inferplug.kernels.moe_gemm import grouped_matmul
from inferplug.kernels.paged_attention import paged_attention_decode
from inferplug.kernels.prefill_attention import prefill_attention
from inferplug.ops.attention import AttentionContext, PagedRows, PackedPrefill
from inferplug.ops.step import StepLayout
from inferplug.ops.torch_ops import TorchOps


class TritonOps(TorchOps):
    name = "triton"
    grouped_matmul = staticmethod(grouped_matmul)  # every selected expert of an MoE layer in one launch
    chunked_delta_rule = staticmethod(chunked_delta_rule)  # a hybrid model's prompt rows in its DeltaNet layers

    def context(self, step: StepLayout, slot_mapping: torch.Tensor) -> AttentionContext:
        ctx = AttentionContext(slot_mapping, len(step.decodes), step.verify_rows)
        device = slot_mapping.device
        if step.decodes:
            seqs = [s for s, _ in step.decodes]
            lengths = [s.num_computed_tokens + 1 for s in seqs]
            tables = step.padded_tables(seqs, -(-max(lengths) // step.block_size), device, torch.int32)
            ctx.paged_rows = [PagedRows(0, len(seqs), tables, None,
                                             lengths=torch.tensor(lengths, dtype=torch.int32, device=device))]
        if step.prefills:
            ctx.packed_prefill = self.pack_prefill(step, device)
        return ctx

    def decode_graphs(self, model, kv_caches, *, max_num_seqs: int, max_blocks: int, windowed: bool = False):
        """On CUDA: decode steps never sync with the host on this path (lengths stay on the device), so they replay.
        Not for an MoE model: its routing lays the experts' rows out anew each step, on the host's side."""
        if model.device.type != "cuda" or any(layer.moe is not None for layer in model.layers):
            return None
        from inferplug.ops.cuda_graphs import DecodeGraphs

        graphs = DecodeGraphs(model, kv_caches, max_num_seqs=max_num_seqs, max_blocks=max_blocks, windowed=windowed)
        graphs.capture()
        return graphs

    def pack_prefill(self, step: StepLayout, device: torch.device) -> PackedPrefill:
        seqs = [s for s, _ in step.prefills]
        ctx_lens = [s.num_computed_tokens + n for s, n in step.prefills]
        offsets = [0]
        for _, n in step.prefills:
            offsets.append(offsets[-1] + n)
        tables = step.padded_tables(seqs, -(-max(ctx_lens) // step.block_size), device, torch.int32)
        return PackedPrefill(torch.tensor(offsets, dtype=torch.int32, device=device),
                             torch.tensor(ctx_lens, dtype=torch.int32, device=device), tables,
                             max(n for _, n in step.prefills))

    def rope_and_store(self, qkv, positions, cos, signed_sin, k_cache, v_cache, ctx: AttentionContext, num_heads: int):
        qkv = qkv.view(qkv.shape[0], -1, cos.shape[-1])
        kv_heads = (qkv.shape[1] - num_heads) // 2
        rope_(qkv[:, : num_heads + kv_heads], positions, cos, signed_sin)
        q, k, v = qkv.split([num_heads, kv_heads, kv_heads], dim=1)
        store_kv(k_cache, v_cache, k, v, ctx.slot_mapping)
        return q, k, v

    def attention(self, q, k, v, k_cache, v_cache, ctx: AttentionContext, scale: float, window: int = 0,
                  sinks: torch.Tensor | None = None) -> torch.Tensor:
        rows = ctx.decode_rows
        if ctx.packed_prefill is None:  # a decode step: the kernel writes the whole output
            return self.decode(q, k_cache, v_cache, ctx.paged_rows[0], scale, window, sinks).flatten(1)
        out = torch.empty_like(q)
        if rows:
            out[:rows] = self.decode(q[:rows], k_cache, v_cache, ctx.paged_rows[0], scale, window, sinks)
        out[rows:] = self.prefill(q[rows:], k_cache, v_cache, ctx.packed_prefill, scale, window, sinks)
        return out.flatten(1)

    def decode(self, q, k_cache, v_cache, rows: PagedRows, scale: float, window: int = 0,
               sinks: torch.Tensor | None = None) -> torch.Tensor:
        return paged_attention_decode(q, k_cache, v_cache, rows.block_tables, rows.lengths, scale, window=window,
                                      sinks=sinks)

    def prefill(self, q, k_cache, v_cache, packed: PackedPrefill, scale: float, window: int = 0,
                sinks: torch.Tensor | None = None) -> torch.Tensor:
        """The prefill rows' attention: each chunk's K/V is in the pools already, with its cached prefix."""
        return prefill_attention(q, k_cache, v_cache, packed.cu_seqlens, packed.ctx_lens, packed.block_tables, scale,
                                 window=window, sinks=sinks, max_q_len=packed.max_q_len)

    def add_rms_norm(self, x, delta, weight, eps: float) -> torch.Tensor:
        return add_rms_norm(x, delta, weight, eps)
