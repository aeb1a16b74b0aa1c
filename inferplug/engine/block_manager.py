"""The KV block pool: ref counts, an LRU free queue, and the automatic prefix cache.

Free blocks sit in an OrderedDict (a doubly linked list: O(1) removal when a cached block is
revived, O(1) pop of the least recently freed). A full block keeps its hash while free, so a
later request with the same prefix reuses it until it is evicted for a new allocation.

A model with sliding-window layers (Gemma 3, Gemma 4, gpt-oss) keeps their KV in a second group of blocks,
engine/window_blocks.py's, which frees each sequence's blocks once they fall behind its window: this manager allocates,
shares, commits and returns a sequence's blocks in both groups at once (vLLM's hybrid KV cache manager is the
anchor: one group of blocks per attention kind, the same block hashes keying both).
"""

from __future__ import annotations

from collections import OrderedDict

from inferplug.engine.block_hash import doc_approx_key, hash_block, rekey_from
from inferplug.engine.sequence import Sequence


class BlockManager:
    null: int | None = None  # the table entry of a block nobody holds (WindowBlocks': one behind the window)

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True, *,
                 window: BlockManager | None = None):
        """window: the sliding-window layers' group (engine/window_blocks.WindowBlocks; None: they keep their KV in
        this pool, as the other layers do)."""
        self.num_blocks, self.block_size = num_blocks, block_size
        self.enable_prefix_caching = enable_prefix_caching  # False: plain pool, nothing hashed or reused
        self.ref_counts = [0] * num_blocks
        self.block_keys: list[bytes | None] = [None] * num_blocks
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self.cached: dict[bytes, int] = {}  # key -> block id holding that KV
        self.queried_tokens = 0
        self.hit_tokens = 0
        self.window = window

    @staticmethod
    def table(seq: Sequence) -> list[int]:
        """seq's table of blocks in this group."""
        return seq.block_table

    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0

    def _update_keys(self, seq: Sequence) -> None:
        bs = self.block_size
        for i in range(len(seq.block_hashes), len(seq.token_ids) // bs):
            parent = seq.block_hashes[-1] if seq.block_hashes else None
            seq.block_hashes.append(hash_block(parent, seq.token_ids[i * bs:(i + 1) * bs], seq.cache_salt))

    def lookup_prefix(self, seq: Sequence) -> list[int]:
        """Cached blocks holding the longest prefix of seq, leaving at least its last token to compute."""
        if not self.enable_prefix_caching:
            return []
        self._update_keys(seq)
        return self.cached_run(seq.block_hashes[: (len(seq.token_ids) - 1) // self.block_size])

    def approximate_run(self, seq: Sequence, first: int) -> list[int]:
        """Cached blocks continuing seq's prefix from block `first` under the approximate key: blocks an earlier
        request filled from the RAG document cache (block_hash.doc_approx_key). Nothing of seq changes."""
        limit = (len(seq.token_ids) - 1) // self.block_size
        if not self.enable_prefix_caching or first >= limit:
            return []
        keys = seq.block_hashes[:first]
        rekey_from(keys, seq.token_ids, self.block_size, first, doc_approx_key(seq.cache_salt))
        return self.cached_run(keys[first:limit])

    def mark_approximate(self, seq: Sequence, first: int) -> None:
        """Key seq's blocks from block `first` on as approximate KV (none of them may be committed yet)."""
        assert seq.num_committed_blocks <= first, "an approximate block was already offered as exact"
        if self.enable_prefix_caching:  # else nothing is keyed
            rekey_from(seq.block_hashes, seq.token_ids, self.block_size, first, doc_approx_key(seq.cache_salt))

    def cached_run(self, keys: list[bytes]) -> list[int]:
        """The cached blocks of the leading keys, up to the first key not cached."""
        hits: list[int] = []
        for key in keys:
            block = self.cached.get(key)
            if block is None:
                break
            hits.append(block)
        return hits

    def allocate(self, seq: Sequence, num_tokens: int, prefix_hits: list[int] = ()) -> bool:
        """Give seq (plus prefix_hits, for a new admission) blocks for num_tokens tokens, in both groups; False if a
        pool is short."""
        window_hits = self.window.hits(seq, len(prefix_hits)) if self.window is not None else []
        if not self._fits(seq, num_tokens, prefix_hits) or \
                (self.window is not None and not self.window._fits(seq, num_tokens, window_hits)):
            return False
        for group, hits in ((self, prefix_hits), (self.window, window_hits)):
            if group is not None:
                group._extend(seq, num_tokens, hits)
        return True

    def _fits(self, seq: Sequence, num_tokens: int, hits: list[int]) -> bool:
        needed = -(-num_tokens // self.block_size) - len(self.table(seq)) - len(hits)
        return needed <= len(self.free) - sum(1 for b in set(hits) if b != self.null and self.ref_counts[b] == 0)

    def _extend(self, seq: Sequence, num_tokens: int, hits: list[int]) -> None:
        table = self.table(seq)
        for block in hits:
            if block != self.null:
                if self.ref_counts[block] == 0:
                    del self.free[block]
                self.ref_counts[block] += 1
            table.append(block)
        while len(table) < -(-num_tokens // self.block_size):
            table.append(self._take())

    def _take(self) -> int:
        """A free block with one reference; the least recently freed goes first (a cached one is evicted)."""
        block, _ = self.free.popitem(last=False)
        key = self.block_keys[block]
        if key is not None:
            del self.cached[key]
            self.block_keys[block] = None
        self.ref_counts[block] = 1
        return block

    def retain(self, tables: tuple[list[int], list[int]]) -> None:
        """One more holder of these blocks, all in use: a beam forking from its parent takes its tables (its block
        table and its window table, which_tables gives)."""
        for group, table in zip((self, self.window), tables):
            for block in table if group is not None else ():
                if block != group.null:
                    group.ref_counts[block] += 1

    def which_tables(self, seq: Sequence) -> tuple[list[int], list[int]]:
        """Copies of seq's tables, for retain."""
        return list(seq.block_table), list(seq.window_table)

    def needs_copy(self, seq: Sequence) -> bool:
        """Whether seq's next token goes into a partial block other sequences hold too, in either group."""
        return any(group._shared_partial(seq) for group in (self, self.window) if group is not None)

    def can_copy(self, seq: Sequence) -> bool:
        """Whether each group where seq needs a copy has a free block for it."""
        return all(group.free for group in (self, self.window) if group is not None and group._shared_partial(seq))

    def _shared_partial(self, seq: Sequence) -> bool:
        computed = seq.num_computed_tokens
        return computed % self.block_size != 0 and self.ref_counts[self.table(seq)[computed // self.block_size]] > 1

    def copy_on_write(self, seq: Sequence) -> list[tuple[int, int, bool]]:
        """Give seq a copy of each shared partial block (can_copy); returns (source, copy, windowed) for the runner
        to copy the KV, in the window group's pools where windowed. The block is partial, so it was never hashed:
        the copy needs no key."""
        copies = []
        for group in (self, self.window):
            if group is not None and group._shared_partial(seq):
                table, index = group.table(seq), seq.num_computed_tokens // self.block_size
                source, copy = table[index], group._take()
                group.ref_counts[source] -= 1
                table[index] = copy
                copies.append((source, copy, group is self.window))
        return copies

    def commit(self, seq: Sequence) -> None:
        """Offer seq's newly computed full blocks to the prefix cache, in both groups; then the window group
        returns the blocks now behind seq's window."""
        if self.enable_prefix_caching:
            self._update_keys(seq)
            full = min(seq.num_computed_tokens // self.block_size, len(seq.block_hashes))
            for group in (self, self.window):
                if group is not None:
                    group._offer(seq, full)
            seq.num_committed_blocks = max(seq.num_committed_blocks, full)
        if self.window is not None:
            self.window.trim(seq)

    def _offer(self, seq: Sequence, full: int) -> None:
        table = self.table(seq)
        for i in range(seq.num_committed_blocks, full):
            key, block = seq.block_hashes[i], table[i]
            if block != self.null and self.block_keys[block] is None and key not in self.cached:
                self.block_keys[block] = key
                self.cached[key] = block

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        """Return the tail blocks seq holds past num_tokens tokens (rejected speculative slots). They were never
        committed: commit stops at the computed, accepted tokens."""
        keep = -(-num_tokens // self.block_size)
        assert keep >= seq.num_committed_blocks, "a committed block would be dropped"
        for group in (self, self.window):
            table = group.table(seq) if group is not None else []
            while len(table) > keep:
                group._drop(table.pop())

    def release(self, seq: Sequence) -> None:
        """Return seq's blocks in both groups, tail first, so a prefix outlives its tail in the LRU order."""
        for group in (self, self.window):
            table = group.table(seq) if group is not None else []
            for block in reversed(table):
                group._drop(block)
            table.clear()
        seq.num_committed_blocks = 0

    def _drop(self, block: int) -> None:
        """One holder fewer; a block nobody holds is free (and stays cached under its key until evicted)."""
        if block != self.null:
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self.free[block] = None

    def check_invariants(self) -> None:
        if self.window is not None:
            self.window.check_invariants()
        used = sum(1 for r in self.ref_counts if r > 0)
        assert used + len(self.free) == self.num_blocks, (used, len(self.free), self.num_blocks)
        assert all(self.ref_counts[b] == 0 for b in self.free), "a free block still has references"
        assert all(self.block_keys[b] == k for k, b in self.cached.items()), "cache index out of sync"
