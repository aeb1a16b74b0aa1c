"""The KV blocks of a model's sliding-window layers: a group of its own, whose blocks a sequence gives back once they
fall behind its window, so a long context holds a window's worth of them, not the whole context's (vLLM's sliding
window manager and llama.cpp's SWA cache do the same).

A sequence's `window_table` has an entry per block of its context, as its block table has; an entry behind the
window is the null block (block 0, held by nobody, never written: zeros, as the pools are allocated). The C++
kernel skips the tiles before a row's window; the torch path, and Triton in a tile that straddles the window's
start, read its zeros and mask them.

What a sequence keeps: the blocks holding its last `window` tokens before its next row, and the one before that (so a
beam that steps back over a token still has its window: Scheduler.rewind). Whole steps are written first and trimmed
after: a prompt chunk longer than the window holds its own blocks while it runs.

Prefix caching: a block is keyed as the block table's is (BlockManager.commit) and stays cached when freed, until it
is evicted. A prefix hit is usable only as far as this group still holds the window before its end (`usable`)."""

from __future__ import annotations

from inferplug.engine.block_manager import BlockManager
from inferplug.engine.sequence import Sequence


class WindowBlocks(BlockManager):
    null = 0

    def __init__(self, num_blocks: int, block_size: int, window: int, enable_prefix_caching: bool):
        """num_blocks: models/config.window_pool_blocks', the null block included."""
        super().__init__(num_blocks, block_size, enable_prefix_caching)
        self.window_tokens = window
        del self.free[self.null]
        self.ref_counts[self.null] = 1  # pinned: nobody allocates or frees it

    @staticmethod
    def table(seq: Sequence) -> list[int]:
        return seq.window_table

    def first_kept(self, position: int) -> int:
        """The first block a sequence whose next row is at `position` keeps: the one holding position - window
        (blocks wholly before it are behind every row it can compute, a beam's rewind included)."""
        return max(position - self.window_tokens, 0) // self.block_size

    def trim(self, seq: Sequence) -> None:
        """Return seq's blocks behind its window (their keys stay cached until evicted)."""
        table = seq.window_table
        j = min(self.first_kept(seq.num_computed_tokens), len(table)) - 1
        while j >= 0 and table[j] != self.null:  # the entries before the first kept are null already from there
            self._drop(table[j])
            table[j] = self.null
            j -= 1

    def hits(self, seq: Sequence, num_hits: int) -> list[int]:
        """The window-table entries of an admission whose first num_hits blocks are prefix hits (`usable` said
        they are): null up to the window of the hit's end, this group's cached blocks from there."""
        first = self.first_kept(num_hits * self.block_size)
        return [self.null] * first + [self.cached[key] for key in seq.block_hashes[first:num_hits]]

    def usable(self, seq: Sequence, hits: list[int]) -> list[int]:
        """The longest prefix of `hits` (the block table's cached blocks of seq's prefix) for which this group
        holds every block of the window before its end; the KV of the other layers alone is of no use."""
        run = 0  # cached window blocks ending at block j
        longest = 0
        for j, key in enumerate(seq.block_hashes[:len(hits)]):
            run = run + 1 if key in self.cached else 0
            if run >= j + 1 - self.first_kept((j + 1) * self.block_size):
                longest = j + 1
        return hits[:longest]
