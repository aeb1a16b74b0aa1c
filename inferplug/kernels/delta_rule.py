"""Triton chunked gated delta rule (Qwen3.5's Gated DeltaNet prompt rows on CUDA): delta_rule_ref.py's WY form in
one launch a sequence, a program per (value head, block of value dims) carrying its slice of the state [key dim,
BLOCK_V] through the chunks in registers. In a chunk of CHUNK tokens the two unit-triangular systems are solved by
forward substitution (a row at a time: CHUNK - 1 steps), then the chunk reads S, corrects U by what S predicts and
moves S on, as the specification does; its sums run in other orders, so it matches it to rounding. The chunks start
on the prompt's CHUNK grid (engine/scheduler.py), so a prompt's state does not depend on how its steps cut it."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from inferplug.kernels.delta_rule_ref import CHUNK

BLOCK_V = 32
NUM_WARPS = 4


@triton.jit
def _unit_lower_solve(lower, rhs, CHUNK: tl.constexpr):
    """X with (I + lower) X = rhs, `lower` [CHUNK, CHUNK] strictly lower: row i is rhs_i less lower_i . X, rows
    before i final by then."""
    rows = tl.arange(0, CHUNK)
    x = rhs
    for i in range(1, CHUNK):
        pick = rows[:, None] == i
        lower_i = tl.sum(tl.where(pick, lower, 0.0), axis=0)  # row i of lower, by column j
        x_i = tl.sum(tl.where(pick, x, 0.0), axis=0) - tl.sum(lower_i[:, None] * x, axis=0)
        x = tl.where(pick, x_i[None, :], x)
    return x


@triton.jit
def _chunked_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, state_ptr, out_ptr, n, HEADS: tl.constexpr,
                    KEY_DIM: tl.constexpr, VALUE_DIM: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
                    CHUNK: tl.constexpr):  # fmt: skip
    head, v_block = tl.program_id(0), tl.program_id(1)
    dk = tl.arange(0, BLOCK_K)
    dv = v_block * BLOCK_V + tl.arange(0, BLOCK_V)
    dk_ok, dv_ok = dk < KEY_DIM, dv < VALUE_DIM
    state_at = state_ptr + head * KEY_DIM * VALUE_DIM + dk[:, None] * VALUE_DIM + dv[None, :]
    state_ok = dk_ok[:, None] & dv_ok[None, :]
    s = tl.load(state_at, mask=state_ok, other=0.0)  # [BLOCK_K, BLOCK_V]
    rows = tl.arange(0, CHUNK)
    causal = rows[None, :] <= rows[:, None]  # j <= i
    for first in range(0, n, CHUNK):
        t = first + rows
        t_ok = t < n  # padding tokens: g = 0 and beta = 0, so they leave S as it is
        k = tl.load(k_ptr + (t[:, None] * HEADS + head) * KEY_DIM + dk[None, :], mask=t_ok[:, None] & dk_ok[None, :],
                    other=0.0)
        q = tl.load(q_ptr + (t[:, None] * HEADS + head) * KEY_DIM + dk[None, :], mask=t_ok[:, None] & dk_ok[None, :],
                    other=0.0)
        v = tl.load(v_ptr + (t[:, None] * HEADS + head) * VALUE_DIM + dv[None, :],
                    mask=t_ok[:, None] & dv_ok[None, :], other=0.0)
        g = tl.load(g_ptr + t * HEADS + head, mask=t_ok, other=0.0)
        beta = tl.load(beta_ptr + t * HEADS + head, mask=t_ok, other=0.0)
        decay = tl.cumsum(g, axis=0)
        last = tl.sum(tl.where(rows == CHUNK - 1, decay, 0.0), axis=0)
        pair = tl.where(causal, tl.exp(decay[:, None] - decay[None, :]), 0.0)
        k_beta = k * beta[:, None]
        lower = tl.where(rows[None, :] < rows[:, None],
                         tl.dot(k_beta, tl.trans(k), input_precision="ieee") * pair, 0.0)
        u = _unit_lower_solve(lower, v * beta[:, None], CHUNK)
        w = _unit_lower_solve(lower, k_beta * tl.exp(decay)[:, None], CHUNK)
        inner = tl.dot(q, tl.trans(k), input_precision="ieee") * pair
        new = u - tl.dot(w, s, input_precision="ieee")
        out = tl.dot(q * tl.exp(decay)[:, None], s, input_precision="ieee") + tl.dot(inner, new, input_precision="ieee")
        tl.store(out_ptr + (t[:, None] * HEADS + head) * VALUE_DIM + dv[None, :], out,
                 mask=t_ok[:, None] & dv_ok[None, :])
        k_to_end = k * tl.exp(last - decay)[:, None]
        s = s * tl.exp(last) + tl.dot(tl.trans(k_to_end), new, input_precision="ieee")
    tl.store(state_at, s, mask=state_ok)


def chunked_delta_rule(q, k, v, g, beta, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """delta_rule_ref.chunked_delta_rule's contract (fp32): q, k [n, heads, key dim], v [n, heads, value dim],
    g, beta [n, heads], state [heads, key dim, value dim] -> (out [n, heads, value dim], the state after)."""
    n, heads, key_dim = q.shape
    value_dim = v.shape[-1]
    q, k, v, g, beta = (t.float().contiguous() for t in (q, k, v, g, beta))
    # a contiguous copy: the caller's slot keeps its state until it takes the result
    state = state.float().clone(memory_format=torch.contiguous_format)
    out = torch.empty(n, heads, value_dim, dtype=torch.float32, device=q.device)
    if n:
        block_v = max(16, min(BLOCK_V, triton.next_power_of_2(value_dim)))  # tl.dot's sides are >= 16
        _chunked_kernel[(heads, triton.cdiv(value_dim, block_v))](
            q, k, v, g, beta, state, out, n, HEADS=heads, KEY_DIM=key_dim, VALUE_DIM=value_dim,
            BLOCK_K=max(16, triton.next_power_of_2(key_dim)), BLOCK_V=block_v, CHUNK=CHUNK, num_warps=NUM_WARPS,
        )  # fmt: skip
    return out, state
