"""The shape handling every weight-only linear layer shares."""

from __future__ import annotations

import torch
from torch import nn

COMPUTE_DTYPE = torch.bfloat16


class WeightOnlyLinear(nn.Module):
    """Shared shape handling: any leading dims, compute in `compute_dtype`, result in the input's dtype."""

    in_features: int
    out_features: int
    compute_dtype = COMPUTE_DTYPE

    def forward(self, x: torch.Tensor, decode_rows: int | None = None) -> torch.Tensor:
        """`decode_rows`: how many leading rows are decode tokens (None: all); only BlockLinear treats them apart."""
        if x.dim() == 2 and x.dtype == self.compute_dtype:  # the engine's flat tokens: skip four no-op reshapes and casts
            out = self._matmul(x)
            return out if self.bias is None else out + self.bias
        flat = x.reshape(-1, self.in_features).to(self.compute_dtype)
        out = self._matmul(flat)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.buffers())

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
