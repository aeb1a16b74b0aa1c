"""Iteration-level scheduling with no prefill/decode phases (vLLM v1's idea).

Each step hands out a token budget: running sequences first (a decode is one token, an
unfinished prefill gets the next chunk), then waiting ones in arrival order. When the pool runs
short, the newest running sequence is preempted by recompute: its blocks go back to the pool,
its full blocks usually stay cached, and it rejoins the front of the queue.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from inferplug.engine.block_manager import BlockManager
from inferplug.engine.sequence import Sequence, SequenceStatus


class Scheduler:
    def __init__(self, blocks: BlockManager, *, max_num_seqs: int, max_num_batched_tokens: int):
        self.blocks = blocks
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        # doc_cache: shortens a prefill chunk to end where a cached RAG document starts, and extends a prefix
        # hit through blocks an earlier request filled from cached documents (engine/doc_cache.py)
        self.cap_chunk: Callable[[Sequence, int, int], int] = lambda seq, computed, n: n
        self.extend_hits: Callable[[Sequence, list[int]], list[int]] = lambda seq, hits: hits

    def add(self, seq: Sequence, *, front: bool = False) -> None:
        seq.status = SequenceStatus.WAITING
        (self.waiting.appendleft if front else self.waiting.append)(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[tuple[Sequence, int]]:
        """The (sequence, number of new tokens) pairs to compute this step."""
        budget = self.max_num_batched_tokens
        scheduled: list[tuple[Sequence, int]] = []
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = self.cap_chunk(seq, seq.num_computed_tokens, min(len(seq.token_ids) - seq.num_computed_tokens, budget))
            while not self.blocks.allocate(seq, seq.num_computed_tokens + n):
                victim = self.running.pop()
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            else:
                scheduled.append((seq, n))
                budget -= n
                i += 1
                continue
            break
        if preempted:  # admitting now would only take blocks the preempted need back
            return scheduled
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            hits = self.extend_hits(seq, self.blocks.lookup_prefix(seq))
            computed = len(hits) * self.blocks.block_size
            n = self.cap_chunk(seq, computed, min(len(seq.token_ids) - computed, budget))
            if not self.blocks.allocate(seq, computed + n, hits):
                break
            self.waiting.popleft()
            seq.num_computed_tokens = computed
            if seq.num_cached_tokens is None:  # first admission: count it in the prefix hit rate
                seq.num_cached_tokens = min(computed, seq.num_prompt_tokens)
                self.blocks.queried_tokens += seq.num_prompt_tokens
                self.blocks.hit_tokens += seq.num_cached_tokens
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            scheduled.append((seq, n))
            budget -= n
        return scheduled

    def _preempt(self, seq: Sequence) -> None:
        self.blocks.release(seq)
        self.num_preemptions += 1
        self.add(seq, front=True)

    def finish(self, seq: Sequence) -> None:
        """Drop a finished or aborted sequence wherever it is and free its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.blocks.release(seq)
        seq.status = SequenceStatus.FINISHED
