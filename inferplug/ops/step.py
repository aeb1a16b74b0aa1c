"""One step's scheduled rows as the model runner lays them out: decode rows first, then prefill chunks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # the ops read a row's block table and computed count; they never import the engine
    from inferplug.engine.sequence import Sequence


@dataclass
class SeqView:
    """The two fields of a Sequence a step's attention layout reads: what a tensor-parallel worker gets of it, and
    a span of rows recomputed at their own positions (engine/rag_recompute.py), rows [num_computed_tokens, + n)."""

    num_computed_tokens: int
    block_table: list[int]


@dataclass
class StepRows:
    decodes: list[tuple[Sequence, int]]  # (sequence, 1) each, longest context first
    prefills: list[tuple[Sequence | SeqView, int]]  # (sequence, new tokens), in row order after the decodes
    slot_mapping: torch.Tensor  # [T] flat pool slot of each new token
    block_size: int
    device: torch.device

    def tensor(self, values, dtype=torch.long) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=self.device)

    def padded_tables(self, seqs: list[Sequence], width: int, dtype=torch.long) -> torch.Tensor:
        """[len(seqs), width] block tables, cut or padded with block 0 to `width`."""
        return self.tensor([s.block_table[:width] + [0] * (width - len(s.block_table[:width])) for s in seqs], dtype)
