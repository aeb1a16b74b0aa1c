"""Small per-row math whose bits do not depend on how many rows share the call (batch invariance).

ATen runs a tensor's last elements through scalar libm and the rest through SIMD code, which round transcendentals
differently; a float GEMM (MKL) rounds by its row count. So a row's sigmoid or exp, or a one-output projection,
would change with the step's other rows. Here each row is padded to whole vector steps, and a one-output projection
is each row's own dot product."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

LANES = 32  # floats in two AVX-512 vectors: ATen's vector loop's step (its tail runs scalar code)


def by_rows(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """fn over [rows, n] (elementwise), each row padded to whole vector steps."""
    return fn(F.pad(x, (0, -x.shape[-1] % LANES)))[..., :x.shape[-1]]


def row_gate(h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """sigmoid(weight . h) for each row of h [rows, hidden] ([1, hidden] weight): [rows, 1], in h's dtype."""
    logits = (h.float() * weight.float()).sum(-1, keepdim=True)
    return by_rows(torch.sigmoid, logits).to(h.dtype)
