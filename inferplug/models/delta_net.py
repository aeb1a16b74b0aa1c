"""Gated DeltaNet, the linear-attention layer of Qwen3.5's hybrid stack (HF's Qwen3_5GatedDeltaNet, llama.cpp's
delta-net-base.cpp): q, k and v through a short causal conv with SiLU, q and k L2-normed, then the gated delta rule

    S_t = exp(g_t) S_{t-1} + k_t beta_t (v_t - exp(g_t) S_{t-1}^T k_t)^T,    o_t = S_t^T q_t / sqrt(key dim),

with beta = sigmoid(b . x) and g = -exp(A_log) softplus(a . x + dt_bias); the output RMS-normed per head, gated by
silu(z . x) and projected out.

A sequence's memory here is fixed-size: the conv's last kernel - 1 inputs and S [value heads, key dim, value dim]
(fp32), in its slot of the layer's state pools (allocate_states). Prompt rows take the chunked (WY) form: within a
chunk of 64 tokens the updates become two triangular solves and a few matmuls, between chunks S carries. A lone row
(a decode row) takes one step of the recurrence, every such row of the step at once (on CPUs the whole step from the
projections to the gated norm is one C++ call, ops.delta_net_step, in place on the slots), each row's arithmetic its
own, so its state and output do not depend on the step's other rows. On CPUs a sequence's prompt rows are one C++
call too (ops.delta_net_prompt), the chunked form inside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

from inferplug.models.config import ModelConfig
from inferplug.ops.row_math import by_rows
from inferplug.quant.linear import linear


@dataclass
class DeltaNetWeights:
    qkv: Any  # in_proj_qkv: [2 * key + value, hidden]
    z: Any  # the output gate's projection: [value, hidden]
    b: Any  # beta's: [value heads, hidden]
    a: Any  # the decay's: [value heads, hidden]
    conv: torch.Tensor  # the depthwise causal conv: [channels, kernel]
    dt_bias: torch.Tensor  # [value heads] fp32
    neg_a: torch.Tensor  # -exp(A_log): [value heads] fp32
    norm: torch.Tensor  # the gated RMSNorm's scale: [value dim] (used as stored)
    out: Any  # out_proj: [hidden, value]
    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int
    key_of_value: torch.Tensor  # [value heads] the q/k head each value head reads

    LINEARS = ("qkv", "z", "b", "a", "out")

    @classmethod
    def take(cls, take: Callable[[str], Any], prefix: str, c: ModelConfig, device) -> "DeltaNetWeights":
        """The layer's weights under `prefix` (e.g. "model.layers.0.linear_attn."), HF's names but A as -exp(A_log)
        and dt_bias as dt.bias (models/families/qwen35.py), taken by `take`."""
        def small(name: str) -> torch.Tensor:  # per-head constants stay fp32, as HF computes the decay
            return take(f"{prefix}{name}").float()

        heads = torch.arange(c.linear_num_value_heads)
        ratio = c.linear_num_value_heads // c.linear_num_key_heads
        return cls(
            qkv=take(f"{prefix}in_proj_qkv.weight"), z=take(f"{prefix}in_proj_z.weight"),
            b=take(f"{prefix}in_proj_b.weight"), a=take(f"{prefix}in_proj_a.weight"),
            conv=take(f"{prefix}conv1d.weight").reshape(c.delta_net_sizes()[2], -1),
            dt_bias=small("dt.bias"), neg_a=small("A"), norm=take(f"{prefix}norm.weight"),
            out=take(f"{prefix}out_proj.weight"), key_heads=c.linear_num_key_heads,
            value_heads=c.linear_num_value_heads, key_dim=c.linear_key_head_dim, value_dim=c.linear_value_head_dim,
            # HF groups a q/k head's value heads together; llama.cpp's GGUF tiles them (its converter's reorder)
            key_of_value=(heads % c.linear_num_key_heads if c.linear_heads_tiled else heads // ratio).to(device))


def allocate_states(w: DeltaNetWeights, slots: int, dtype: torch.dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    """A layer's state pools: each slot's conv window [kernel - 1, channels] (`dtype`) and recurrent state
    [value heads, key dim, value dim] (fp32)."""
    channels, kernel = w.conv.shape
    return (torch.zeros(slots, kernel - 1, channels, dtype=dtype, device=device),
            torch.zeros(slots, w.value_heads, w.key_dim, w.value_dim, dtype=torch.float32, device=device))


def delta_net(h: torch.Tensor, w: DeltaNetWeights, pools: tuple[torch.Tensor, torch.Tensor],
              sequences: list[tuple[int, int, bool]], eps: float, rows: int | None, ops) -> torch.Tensor:
    """The layer's output for the step's normed rows `h` [T, hidden]. `sequences`: each sequence's (rows, state
    slot, fresh) in row order; a fresh one starts from zero state, the others from their slot's, and every slot is
    left holding its sequence's state after its last row. `rows`: the decode rows (quant/block_linear.py); `ops`:
    the model's ops set, whose delta_net_step (or, where it has none, delta_rule_step) runs the decode rows and
    delta_net_prompt (or, where it has none, chunked_delta_rule: kernels/delta_rule_ref.py, Triton on CUDA) a
    sequence's prompt rows."""
    mixed, b, a, z = (linear(h, weight, None, rows) for weight in (w.qkv, w.b, w.a, w.z))
    gated = torch.empty_like(z)  # each row's gated norm, for the output projection
    starts = _starts(sequences)
    steps = [(row, slot) for row, (n, slot, fresh) in zip(starts, sequences) if n == 1 and not fresh]
    if steps:  # every decode row at once: one step of the recurrence each
        at = [row for row, _ in steps]
        # a step's decode rows come first: a slice of them is a view, where an index copies (five times a layer)
        in_order = at == list(range(at[0], at[0] + len(at)))
        rows_at = slice(at[0], at[0] + len(at)) if in_order else torch.tensor(at, device=h.device)
        slots = torch.tensor([slot for _, slot in steps], device=h.device)
        step = mixed[rows_at], b[rows_at], a[rows_at], z[rows_at]
        fused = ops.delta_net_step(w, pools, slots, *step, eps)  # on CPUs one kernel call; None: the torch ops here
        gated[rows_at] = fused if fused is not None else _decode_step(w, pools, slots, *step, eps, ops)
    for row, (n, slot, fresh) in zip(starts, sequences):
        if n == 1 and not fresh:
            continue
        span = slice(row, row + n)
        step = mixed[span], b[span], a[span], z[span]
        fused = ops.delta_net_prompt(w, pools, slot, fresh, *step, eps)  # on CPUs one kernel call; None: torch ops
        gated[span] = fused if fused is not None else _prompt_rows(w, pools, slot, fresh, *step, eps, ops)
    return linear(gated, w.out, None, rows)


def _prompt_rows(w: DeltaNetWeights, pools: tuple[torch.Tensor, torch.Tensor], slot: int, fresh: bool, mixed, b, a, z,
                 eps: float, ops) -> torch.Tensor:
    """One sequence's prompt rows from the projections to the gated norm, the rule in its chunked form."""
    conv_pool, state_pool = pools
    x = _conv(mixed.unsqueeze(0), conv_pool, torch.tensor([slot], device=mixed.device), w.conv, fresh).squeeze(0)
    q, k, v = _heads(x, w)
    beta, g = _gates(b, a, w)
    initial = torch.zeros_like(state_pool[slot]) if fresh else state_pool[slot]
    out, state_pool[slot] = ops.chunked_delta_rule(q, k, v, g, beta, initial)
    # contiguous: the norm's bits follow its input's layout, and the chunked rule's output's layout its row count
    return _gated_norm(out.contiguous(), z, w.norm, eps)


def _decode_step(w: DeltaNetWeights, pools: tuple[torch.Tensor, torch.Tensor], slots: torch.Tensor, mixed, b, a, z,
                 eps: float, ops) -> torch.Tensor:
    """Decode rows (one token each, from their slots' states) from the projections to the gated norm."""
    conv_pool, state_pool = pools
    q, k, v = _heads(_conv(mixed.unsqueeze(1), conv_pool, slots, w.conv, fresh=False).squeeze(1), w)
    beta, g = _gates(b, a, w)
    return _gated_norm(ops.delta_rule_step(state_pool, slots, q, k, v, g, beta), z, w.norm, eps)


def _starts(sequences: list[tuple[int, int, bool]]) -> list[int]:
    starts, row = [], 0
    for n, _, _ in sequences:
        starts.append(row)
        row += n
    return starts


def _conv(x: torch.Tensor, conv_pool: torch.Tensor, slots: torch.Tensor, weight: torch.Tensor,
          fresh: bool) -> torch.Tensor:
    """The causal conv with SiLU over [B, n, channels] rows, each batch row's window read from and left in its slot."""
    window = torch.zeros_like(conv_pool[slots]) if fresh else conv_pool[slots]
    full = torch.cat([window, x.to(conv_pool.dtype)], dim=1)  # [B, kernel - 1 + n, channels]
    conv_pool[slots] = full[:, -window.shape[1]:]
    taps = full.unfold(1, weight.shape[1], 1)  # [B, n, channels, kernel]
    return F.silu((taps * weight).sum(-1)).to(x.dtype)


def _gates(b: torch.Tensor, a: torch.Tensor, w: DeltaNetWeights) -> tuple[torch.Tensor, torch.Tensor]:
    """beta = sigmoid(b) and the log of the decay g = -exp(A_log) softplus(a + dt_bias), fp32, per value head: on
    whole vector steps, so a row's bits do not depend on its step (ops/row_math.py)."""
    return by_rows(torch.sigmoid, b.float()), w.neg_a * by_rows(F.softplus, a.float() + w.dt_bias)


def _heads(x: torch.Tensor, w: DeltaNetWeights) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k (L2-normed, fp32, q scaled by 1 / sqrt(key dim), one per value head) and v, [..., value heads, dim]."""
    key = w.key_heads * w.key_dim
    q, k, v = x.float().split([key, key, w.value_heads * w.value_dim], dim=-1)
    q, k = (t.unflatten(-1, (w.key_heads, w.key_dim)) for t in (q, k))
    q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) * w.key_dim**-0.5
    k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    return (q.index_select(-2, w.key_of_value), k.index_select(-2, w.key_of_value),
            v.unflatten(-1, (w.value_heads, w.value_dim)))


def _gated_norm(o: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of each head's output (fp32, rounded to z's dtype, times the scale) times silu(z), as HF rounds it."""
    dtype = z.dtype
    normed = (o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + eps)).to(dtype) * weight
    return (normed * F.silu(z.float().unflatten(-1, o.shape[-2:]))).to(dtype).flatten(-2)
