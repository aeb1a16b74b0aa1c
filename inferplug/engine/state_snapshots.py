"""Prefix caching for a hybrid model (Qwen3.5): snapshots of a sequence's DeltaNet state, so that a prompt sharing
a prefix (a chat's next turn, a shared system prompt, the other choices of n > 1) starts from the state there instead
of computing the prefix again. The attention layers' KV of the prefix comes from the prefix cache's blocks as for
any model; a hit is usable only up to a point where a snapshot of the state holds (vLLM's hybrid prefix caching is
the anchor: the state is cached at block-aligned points, the KV per block).

Granularity: a snapshot sits on a `grid` point (the delta rule's 64-token chunks, a whole number of blocks), keyed by
the prefix cache's key of the block that ends there. A sequence leaves two kinds:
- its prompt's: at the prompt's last grid point before its last token (the scheduler ends a prefill chunk there);
- its reply's: at each grid point it passes while generating, each replacing its previous one, so a chat's next
  turn starts at the last grid point of this turn's reply.
Memory: `capacity` snapshots, each one sequence's whole state (ModelConfig.state_bytes_per_sequence: 50 MB at
Qwen3.5-9B's geometry, as much KV as 1,500 of its tokens), the least recently used dropped first; the memory plan
counts them."""

from __future__ import annotations

from collections import OrderedDict

import torch

from inferplug.engine.sequence import Sequence


class StateSnapshots:
    def __init__(self, runner, grid: int, block_size: int, capacity: int):
        """`runner`: the ModelRunner whose state pools hold the running sequences' states (read_state,
        write_state)."""
        self.runner, self.grid, self.block_size, self.capacity = runner, grid, block_size, capacity
        self.snapshots: OrderedDict[bytes, list[torch.Tensor]] = OrderedDict()
        self.reply_key: dict[Sequence, bytes] = {}  # a generating sequence's latest snapshot

    def prompt_point(self, seq: Sequence) -> int:
        """The position of seq's prompt snapshot: its last grid point before its last prompt token (0: none)."""
        return (seq.num_prompt_tokens - 1) // self.grid * self.grid

    def usable_blocks(self, seq: Sequence, hits: int) -> int:
        """Of seq's first `hits` cached blocks, how many a snapshot continues (the longest such prefix)."""
        per_point = self.grid // self.block_size
        for points in range(hits // per_point, 0, -1):
            if seq.block_hashes[points * per_point - 1] in self.snapshots:
                return points * per_point
        return 0

    def restore(self, seq: Sequence, blocks: int) -> None:
        """Put the snapshot at block `blocks`' start into seq's state slot (seq is admitted, computed up to it)."""
        key = seq.block_hashes[blocks - 1]
        self.snapshots.move_to_end(key)
        self.runner.write_state(seq.state_slot, self.snapshots[key])

    def keep(self, seq: Sequence) -> None:
        """After a step: snapshot seq's state if it now stands on its prompt's point or, generating, on a grid
        point (its previous reply snapshot then goes)."""
        at = seq.num_computed_tokens
        if not at or at % self.grid or at // self.block_size > len(seq.block_hashes):
            return
        generating = at >= seq.num_prompt_tokens
        if not generating and at != self.prompt_point(seq):
            return
        key = seq.block_hashes[at // self.block_size - 1]
        if generating:  # its previous reply snapshot goes
            self.snapshots.pop(self.reply_key.get(seq), None)
            self.reply_key[seq] = key
        self.snapshots[key] = self.runner.read_state(seq.state_slot)
        self.snapshots.move_to_end(key)
        while len(self.snapshots) > self.capacity:
            self.snapshots.popitem(last=False)

    def forget(self, seq: Sequence) -> None:
        """seq left the running set: its snapshots stay for others, it no longer replaces its reply's."""
        self.reply_key.pop(seq, None)
