"""Selective recompute of reused RAG documents: which of a reused segment's tokens are computed again.

A segment filled from the document cache (engine/doc_cache.py) kept the cross-attention of the neighbours it was
first computed with. Recomputing some of its tokens, at their positions in this prompt, lets them attend to their
real neighbours; their new K/V replace the reused ones in this request's blocks (the cache entry is not touched).
Two selections (profile `[cache] rag_recompute`):

- "chunk_heads" (EPIC, arXiv 2410.15332): each segment's first tokens, which were computed as a prompt's start
  (duplicate attention sinks);
- "deviation" (CacheBlend, arXiv 2405.16444): every token of the segment runs the first layers (to
  `probe_layer`), then only those whose fresh K there deviates most from the reused K go on through the later
  layers (LMCache checks one early layer, layer 1, by the K difference).

`rag_recompute_fraction` of each segment's tokens (rounded up) are recomputed; 0 recomputes nothing. The scheduler
turns each filled segment into a `Recompute` (rows the next step computes from layer 0) and the model runner lays
those rows out before the sequence's next chunk; `DeviationProbe` narrows a step's rows after the probe layer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

POLICIES = ("none", "deviation", "chunk_heads")
DEVIATION_LAYER = 1  # layer 0's K depends only on the token and its position: the first layer that sees neighbours


@dataclass(frozen=True)
class Recompute:
    """A filled segment's rows for the next step: positions [start, end) from layer 0; with a probe layer, only
    the `keep` rows whose K deviates most go on past it."""

    start: int
    end: int
    keep: int
    probe_layer: int | None = None

    @property
    def rows(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class RecomputePolicy:
    kind: str = "none"
    fraction: float = 0.0
    probe_layer: int = DEVIATION_LAYER  # the engine caps it at the model's last layer

    def __post_init__(self) -> None:
        if self.kind not in POLICIES:
            raise ValueError(f"rag_recompute {self.kind!r} is not a policy; use one of {', '.join(POLICIES)}")
        if not 0.0 <= self.fraction <= 1.0:
            raise ValueError(f"rag_recompute_fraction {self.fraction} is outside [0, 1]; use e.g. 0.15")

    @property
    def active(self) -> bool:
        return self.kind != "none" and self.fraction > 0

    def for_segment(self, start: int, end: int) -> Recompute:
        keep = min(end - start, math.ceil(self.fraction * (end - start)))
        if self.kind == "chunk_heads":
            return Recompute(start, start + keep, keep)
        return Recompute(start, end, keep, self.probe_layer)


@dataclass
class DeviationProbe:
    """A step's probed rows: after `layer`, each segment keeps its `keep` rows of largest K deviation from the
    reused K (read from the pools before the step overwrote it); the other rows stop there."""

    layer: int
    segments: list[tuple[int, int, int]]  # (first row, end row, rows to keep) in the step's flat rows
    reused_k: torch.Tensor  # [probed rows, kv_heads, head_dim], the segments' rows in order
    rebuild: Callable[[torch.Tensor], Any]  # the step's attention context for the kept rows
    total_rows: int
    kept: torch.Tensor | None = None  # the kept row indices, once narrowed

    def narrow(self, k: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """k: this layer's fresh K of every row of the step. Returns the kept row indices and their context."""
        rows = torch.cat([torch.arange(a, b) for a, b, _ in self.segments]).to(k.device)
        deviation = (k[rows].float() - self.reused_k.float()).square().sum(dim=(1, 2))
        drop, offset = [], 0
        for first, end, keep in self.segments:
            scores = deviation[offset : offset + end - first]
            chosen = set((torch.topk(scores, keep).indices + first).tolist()) if keep else set()
            drop += [r for r in range(first, end) if r not in chosen]
            offset += end - first
        mask = torch.ones(self.total_rows, dtype=torch.bool)
        mask[drop] = False
        self.kept = mask.nonzero().flatten().to(k.device)
        return self.kept, self.rebuild(self.kept)


def runs(positions: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted positions as maximal runs [start, end) of consecutive ones."""
    spans: list[tuple[int, int]] = []
    for p in positions:
        if spans and spans[-1][1] == p:
            spans[-1] = (spans[-1][0], p + 1)
        else:
            spans.append((p, p + 1))
    return spans
