"""One step's rows as the model runner lays them out (StepLayout): the one step-layout type that the runner fills,
a tensor-parallel worker receives and the ops read to build their AttentionContext."""

from __future__ import annotations

from dataclasses import dataclass, field
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
    window_table: list[int] = field(default_factory=list)  # the sliding-window layers' (engine/window_blocks.py)


@dataclass
class StepLayout:
    """A step's rows in order: decode rows (one generated token each, longest context first), then the rows in
    `prefills`: verification rows (a decode token and its proposals), prefill chunks and recompute spans. Beside
    them the flat per-row lists the model reads. Plain lists, no tensors: a tensor-parallel worker gets it pickled
    and builds its own on its device."""

    decodes: list[tuple[Sequence | SeqView, int]]  # (sequence, 1) each
    prefills: list[tuple[Sequence | SeqView, int]]  # (sequence, rows), in row order after the decodes
    block_size: int
    verify_rows: int = 0  # the first prefills rows check proposals: decode arithmetic in the linears (block_linear)
    input_ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)  # flat pool slot (block * block_size + offset) of each row
    sample_rows: list[int] = field(default_factory=list)
    prompt_rows: list[int] = field(default_factory=list)  # rows scoring the next prompt token (prompt_logprobs)
    probes: list[tuple[int, int, int]] = field(default_factory=list)  # rag_recompute.DeviationProbe.segments
    probe_layer: int = 0
    states: list[tuple[int, int, bool]] = field(default_factory=list)  # AttentionContext.states: a hybrid model's
    window_slots: list[int] = field(default_factory=list)  # each row's slot in the sliding-window layers' own pools

    def windowed(self) -> StepLayout:
        """The step as the sliding-window layers see it, where they keep their KV in a pool of their own: the same
        rows, each sequence read through its window table and each row stored in its window slot."""
        def view(rows):
            return [(SeqView(s.num_computed_tokens, s.window_table), n) for s, n in rows]

        return StepLayout(view(self.decodes), view(self.prefills), self.block_size, self.verify_rows,
                          slots=self.window_slots)

    def padded_tables(self, seqs: list[Sequence | SeqView], width: int, device: torch.device,
                      dtype=torch.long) -> torch.Tensor:
        """[len(seqs), width] block tables, cut or padded with block 0 to `width`."""
        return torch.tensor([s.block_table[:width] + [0] * (width - len(s.block_table[:width])) for s in seqs],
                            dtype=dtype, device=device)
