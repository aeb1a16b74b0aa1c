"""Pure-torch specification of the chunked gated delta rule (kernels/delta_rule.py is its Triton form): a
sequence's prompt rows through Gated DeltaNet's recurrence (models/delta_net.py) a chunk of CHUNK tokens at a time,
in flash-linear-attention's WY form. The torch ops run it as it is."""

from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK = 64  # the chunked form's tokens per chunk (flash-linear-attention's and HF's)


def chunked_delta_rule(q, k, v, g, beta, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's n tokens ([n, heads, dim]; g, beta [n, heads]) from `state` [heads, key dim, value dim]:
    their outputs [n, heads, value dim] and the state after them. Per chunk of CHUNK tokens, with the decays
    cumulated from its start (c), the delta rule's updates solve (I + L) U = beta V and (I + L) W = beta K exp(c),
    L the strictly lower part of beta K K^T exp(c_i - c_j); then each chunk reads S, corrects U by what S predicts,
    and moves S on."""
    n = q.shape[0]
    pad = -n % CHUNK
    q, k, v = (F.pad(t.transpose(0, 1), (0, 0, 0, pad)).unflatten(1, (-1, CHUNK)) for t in (q, k, v))
    g, beta = (F.pad(t.transpose(0, 1), (0, pad)).unflatten(1, (-1, CHUNK)) for t in (g, beta))
    decay = g.cumsum(-1)  # [heads, chunks, CHUNK]
    later = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device).triu(1)
    pair = (decay.unsqueeze(-1) - decay.unsqueeze(-2)).masked_fill(later, float("-inf")).exp()
    k_beta = k * beta.unsqueeze(-1)
    system = (k_beta @ k.transpose(-1, -2)) * pair  # its diagonal is taken as 1 (unitriangular)
    u = torch.linalg.solve_triangular(system, v * beta.unsqueeze(-1), upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(system, k_beta * decay.exp().unsqueeze(-1), upper=False, unitriangular=True)
    inner = (q @ k.transpose(-1, -2)) * pair
    q_decayed = q * decay.exp().unsqueeze(-1)
    k_to_end = k * (decay[..., -1:] - decay).exp().unsqueeze(-1)
    chunk_decay = decay[..., -1].exp()[..., None, None]
    out = torch.empty_like(u)
    for c in range(q.shape[1]):
        new = u[:, c] - w[:, c] @ state
        out[:, c] = q_decayed[:, c] @ state + inner[:, c] @ new
        state = state * chunk_decay[:, c] + k_to_end[:, c].transpose(-1, -2) @ new
    return out.flatten(1, 2)[:, :n].transpose(0, 1), state
