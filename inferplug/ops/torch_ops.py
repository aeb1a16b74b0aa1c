"""The torch ops: what any device runs, and the base the kernel sets (C++ CPU, Triton) override method by method.

Decode rows are grouped by similar context lengths (one gather and two batched matmuls a group, padded to the
group's longest); each prefill chunk runs scaled_dot_product_attention over its context (ops/attention.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from inferplug.kernels.delta_rule_ref import chunked_delta_rule
from inferplug.ops.attention import AttentionContext, PagedRows, PrefillChunk, paged_attention, write_kv
from inferplug.ops.row_math import by_rows
from inferplug.ops.step import StepLayout

if TYPE_CHECKING:  # the ops read a row's block table and computed count; they never import the engine
    from inferplug.engine.sequence import Sequence

# A row starts a new decode group when it needs at most 2/3 of the group's blocks and 8 fewer: past that,
# reading the padding costs more than another gather and matmul pair (about 0.1 ms a layer).
GROUP_WIDTH_RATIO, GROUP_MIN_GAP_BLOCKS = 2 / 3, 8
ROUTER_ROWS = 16  # rows a router product takes at once: [16, experts, hidden] floats (16 MB at 30B-A3B)


class TorchOps:
    """attention, KV store, RoPE, norms and activation for DecoderModel.forward; `context` builds what `attention`
    reads for one step. Subclasses override only what they run faster or differently."""

    name = "torch"
    grouped_matmul = None  # an MoE's grouped expert GEMM (models/moe.py); None: a matmul pair per expert

    def __init__(self, dtype: torch.dtype = torch.float32):
        self.dtype = dtype  # the model's compute dtype

    def context(self, step: StepLayout, slot_mapping: torch.Tensor) -> AttentionContext:
        """What attention reads for `step`, whose rows store their K/V at `slot_mapping` (on the model's device)."""
        ctx = AttentionContext(slot_mapping, len(step.decodes), step.verify_rows)
        ctx.paged_rows = self.paged_rows_of(step, [s for s, _ in step.decodes], slot_mapping.device)
        q_start = len(step.decodes)
        for seq, n in step.prefills:
            ctx.prefills.append(self._prefill_chunk(step, seq, n, q_start, slot_mapping.device))
            q_start += n
        return ctx

    def decode_graphs(self, model, kv_caches, *, max_num_seqs: int, max_blocks: int, windowed: bool = False):
        """Captured CUDA graphs for decode steps (ops/cuda_graphs.py), or None where this set offers none. windowed:
        the sliding-window layers keep their own pools (AttentionContext.window)."""
        return None

    def run_layers(self, model, x: torch.Tensor, positions: torch.Tensor, ctx: AttentionContext, kv_caches,
                   per_layer: tuple[torch.Tensor, torch.Tensor] | None = None) -> bool:
        """Run every layer on `x` in place in one call and return True, where this set can; else False.
        `per_layer`: Gemma 4's per-layer inputs' sources (DecoderModel.per_layer_input's embedding and table rows)."""
        return False

    def rope_and_store(self, qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor,
                       k_cache: torch.Tensor, v_cache: torch.Tensor, ctx: AttentionContext, num_heads: int):
        """RoPE on the q and k heads of qkv ([T, (heads + 2 kv_heads) * head_dim]), K and V stored in the pools at
        ctx.slot_mapping. Returns q, k, v: [T, heads or kv_heads, head_dim]."""
        head_dim = cos.shape[-1]
        rows = _rope_rows(positions, cos, signed_sin, ctx, qkv.dtype)
        qkv = qkv.view(qkv.shape[0], -1, head_dim)
        kv_heads = (qkv.shape[1] - num_heads) // 2
        qk = apply_rope(qkv[:, : num_heads + kv_heads], *rows)  # q and k heads in one go
        q, k = qk.split([num_heads, kv_heads], dim=1)
        v = qkv[:, num_heads + kv_heads:]
        write_kv(k_cache, v_cache, k, v, ctx.slot_mapping)
        return q, k, v

    def rope_q(self, q: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor,
               ctx: AttentionContext) -> torch.Tensor:
        """RoPE on q alone ([T, heads * head_dim] -> [T, heads, head_dim]): a layer attending over another layer's KV
        (Gemma 4's shared KV) stores none."""
        return apply_rope(q.view(q.shape[0], -1, cos.shape[-1]), *_rope_rows(positions, cos, signed_sin, ctx, q.dtype))

    def attention(self, q, k, v, k_cache, v_cache, ctx: AttentionContext, scale: float, window: int = 0,
                  sinks: torch.Tensor | None = None) -> torch.Tensor:
        """q: [T, heads, D]; k, v: [T, kv_heads, D], already in the pools. Returns [T, heads * D]. `window`: a
        sliding window's size (0: the whole context); `sinks`: [heads] fp32 attention-sink logits, or None."""
        return paged_attention(q, k, v, k_cache, v_cache, ctx, scale, window, sinks)

    def add_rms_norm(self, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """x += delta in place (when given), then RMSNorm(x); equal to HF's RMSNorm in fp32 (HF rounds to
        the model dtype before the scale in bf16)."""
        if delta is not None:
            x.add_(delta)
        if x.dtype == torch.float32:
            return F.rms_norm(x, weight.shape, weight, eps)
        if weight.dtype == torch.float32:  # Gemma's 1 + w: scaled in fp32, rounded once (HF's Gemma3RMSNorm)
            return F.rms_norm(x.float(), weight.shape, weight, eps).to(x.dtype)
        return F.rms_norm(x.float(), weight.shape, None, eps).to(x.dtype) * weight  # HF's rounding in bf16/fp16

    def router_logits(self, h: torch.Tensor, router: torch.Tensor) -> torch.Tensor:
        """h @ router.T ([T, experts]) with each row's sums in one order whatever the row count (a GEMM's blocking
        changes with it, and a last-bit change in a router logit can change an expert): products, then a sum over
        hidden, ROUTER_ROWS rows at a time."""
        return torch.cat([(part[:, None, :] * router[None]).sum(dim=-1) for part in h.split(ROUTER_ROWS)])

    def moe_experts(self, h: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor, moe, decode_rows: int | None,
                    activation) -> torch.Tensor | None:
        """An MoE layer's experts (models/moe.py) in one call, or None where these ops have none for them."""
        return None

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate).mul_(up)

    def gelu_tanh_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """GeGLU (Gemma): gelu with the tanh approximation on the gate."""
        gate, up = gate_up.chunk(2, dim=-1)
        return F.gelu(gate, approximate="tanh").mul_(up)

    def swiglu_oai_mul(self, gate_up: torch.Tensor, limit: float = 7.0, alpha: float = 1.702) -> torch.Tensor:
        """gpt-oss's expert activation: gate = min(g, limit), up = clamp(u, -limit, limit),
        gate * sigmoid(alpha * gate) * (up + 1)."""
        gate, up = gate_up.chunk(2, dim=-1)
        gate = gate.clamp(max=limit)
        return (gate * torch.sigmoid(gate * alpha)).mul_(up.clamp(-limit, limit) + 1)

    def delta_rule_step(self, state_pool: torch.Tensor, slots: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                        v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
        """One token of each row ([B, heads, dim]; g, beta [B, heads]) through the gated delta rule, from and back
        into its slot's state (models/delta_net.py); its output [B, heads, value dim]."""
        state = state_pool[slots] * by_rows(torch.exp, g)[..., None, None]  # [B, heads, key dim, value dim]
        delta = (v - (state * k.unsqueeze(-1)).sum(-2)) * beta.unsqueeze(-1)
        state += k.unsqueeze(-1) * delta.unsqueeze(-2)
        state_pool[slots] = state
        return (state * q.unsqueeze(-1)).sum(-2)

    def delta_net_step(self, w, pools, slots, mixed, b, a, z, eps: float) -> torch.Tensor | None:
        """A DeltaNet layer's decode rows from its projections (mixed, b, a, z) to its gated norm in one call, in
        place on the slots' states (models/delta_net.py), or None where these ops have none: the model's torch
        ops then take them."""
        return None

    def delta_net_prompt(self, w, pools, slot: int, fresh: bool, mixed, b, a, z, eps: float) -> torch.Tensor | None:
        """One sequence's prompt rows of a DeltaNet layer from its projections to its gated norm in one call, on its
        slot (fresh: from zero), or None where these ops have none: the model's torch ops around chunked_delta_rule
        then take them."""
        return None

    def chunked_delta_rule(self, q, k, v, g, beta, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One sequence's prompt rows through the gated delta rule from `state`: their outputs and the state after
        them (kernels/delta_rule_ref.py, in torch ops)."""
        return chunked_delta_rule(q, k, v, g, beta, state)

    def qk_rms_norm_(self, qkv: torch.Tensor, q_norm: torch.Tensor, k_norm: torch.Tensor | None, num_heads: int,
                     kv_heads: int, eps: float, v_norm: bool = False) -> None:
        """QK-norm in place on qkv ([T, (heads + 2 kv_heads) * head_dim], or q alone where kv_heads is 0): each q
        head by q_norm, each k head by k_norm (one weight of head_dim for every head); with v_norm each v head by an
        RMSNorm without a scale (Gemma 4)."""
        heads = qkv.view(qkv.shape[0], -1, q_norm.shape[0])
        parts = [(heads[:, :num_heads], q_norm)]
        if kv_heads:
            parts.append((heads[:, num_heads:num_heads + kv_heads], k_norm))
        if v_norm:
            parts.append((heads[:, num_heads + kv_heads:], None))
        for part, weight in parts:
            rows = part.reshape(-1, part.shape[-1]).contiguous()  # one kv head: a strided view, not a copy
            normed = self.add_rms_norm(rows, None, weight, eps) if weight is not None else \
                F.rms_norm(rows.float(), (rows.shape[-1],), None, eps).to(rows.dtype)
            part.copy_(normed.view(part.shape))

    # --- the step's attention metadata ---------------------------------------------------------------
    def paged_rows_of(self, step: StepLayout, seqs: list[Sequence], device: torch.device) -> list[PagedRows]:
        """Cut the decode rows (longest first) into groups of similar widths (GROUP_WIDTH_RATIO)."""
        blocks = [-(-(s.num_computed_tokens + 1) // step.block_size) for s in seqs]
        groups, start = [], 0
        for i in range(1, len(seqs) + 1):
            if i == len(seqs) or (blocks[i] <= GROUP_WIDTH_RATIO * blocks[start]
                                  and blocks[start] - blocks[i] >= GROUP_MIN_GAP_BLOCKS):
                groups.append(self._decode_group(step, seqs[start:i], start, blocks[start], device))
                start = i
        return groups

    def _decode_group(self, step: StepLayout, seqs: list[Sequence], start: int, width: int,
                      device: torch.device) -> PagedRows:
        lengths = [s.num_computed_tokens + 1 for s in seqs]
        tables = step.padded_tables(seqs, width, device)
        if len(seqs) == 1:  # nothing to pad: attention cuts the keys at the length
            return PagedRows(start, start + 1, tables, None, lengths[0])
        keys = torch.arange(width * step.block_size, device=device)
        lengths = torch.tensor(lengths, device=device)
        past_end = keys[None, :] >= lengths[:, None]
        bias = torch.zeros(past_end.shape, dtype=self.dtype, device=device)
        return PagedRows(start, start + len(seqs), tables, bias.masked_fill_(past_end, float("-inf"))[None, :, None, :],
                         lengths=lengths)  # a sliding window's bias is made from the lengths

    def _prefill_chunk(self, step: StepLayout, seq: Sequence, n: int, q_start: int,
                       device: torch.device) -> PrefillChunk:
        start = seq.num_computed_tokens
        if start == 0:
            return PrefillChunk(q_start, n, n, None, None)
        ctx_len = start + n
        blocks = torch.tensor(seq.block_table[: -(-ctx_len // step.block_size)], device=device)
        query_pos = torch.arange(start, ctx_len, device=device)
        mask = torch.arange(ctx_len, device=device)[None, :] <= query_pos[:, None]
        return PrefillChunk(q_start, n, ctx_len, blocks, mask)


def _rope_rows(positions: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor, ctx: AttentionContext,
               dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's rows of a RoPE table pair, [T, 1, head_dim] each: made once per step and table, not per layer."""
    rows = ctx.rope_rows.get(cos.data_ptr())
    if rows is None:
        rows = cos[positions].to(dtype).unsqueeze(1), signed_sin[positions].to(dtype).unsqueeze(1)
        ctx.rope_rows[cos.data_ptr()] = rows
    return rows


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE (HF layout: the first and second halves of head_dim pair up).

    `signed_sin` is sin with its first half negated, so HF's rotate_half(x) * sin is x.roll(half) * signed_sin:
    four ops instead of six, each rounding where HF's does (bit-identical in bf16 and fp16 too)."""
    return (x * cos).add_(x.roll(x.shape[-1] // 2, dims=-1).mul_(signed_sin))
