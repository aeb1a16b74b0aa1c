"""Shared checks for the Triton kernel tests: relative error against an fp64 reference."""

from __future__ import annotations

import torch


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return ((got.double() - expected).norm() / expected.norm()).item()
