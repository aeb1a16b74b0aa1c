"""Cache-aware admission (RAGCache, arXiv 2404.12457): a waiting request whose prefix or documents are cached
has little to prefill, so it is admitted before uncached requests queued ahead of it, each wait within twice
its FIFO wait.

A request's *cost* is the prompt tokens it would compute if admitted now: its prompt, less its prefix-cache hit and
the cached document segments after it (the prefix source's `cached_tokens`). The scheduler asks `to_front` before
each admission; it moves the cheapest request that has something cached, and costs less than the queue's head, to
the front.

Bound (no request waits more than twice its FIFO wait): when a request r is first seen in the window, its FIFO wait
is the prefill FIFO computes up to its first token: what the running sequences have left, the cost of the requests
queued ahead of it, and its own, A tokens, so FIFO takes at least A / B' steps (B: a step's token budget; B' = B
less a row for each seat already running, rows that take budget every step under both orders and are not in A). A
request p moved ahead of r is *charged* to r's allowance, and may not move past a request it would overdraw: its
cost c, and its decode rows, which take budget before r's next chunk every step from p's first token on: at most one
row of 1 + k tokens a step (k: the speculative tokens a row may carry), for at most min(m - 1, W) steps (m: p's
max_tokens; W = ceil(2A / B'), r's bound in steps). A step carries at least b' = min(b, B') tokens of the work
charged or in A (b: the decode cap, `max_prefill_tokens_while_decoding`, which binds while any stream decodes, as a
request moved first soon does; b = B without a cap): without a cap every step is full, and under one the prefill is
min(b, B - rows), so prefill and charged rows together are at least b'. So with an allowance of A (2b - B) / B, r's
first token comes within (A + A (2b - B) / B) / b' = (2b / B) A / b' steps: without a cap (allowance A) 2A / B', and
under one at most 2A / B' too (b' = b where b <= B', else b' = B' and 2b <= 2B): twice FIFO's least, by
construction. Under a cap of half the budget or less (the CPU's default, 16 of 256) the allowance is 0: no request
is passed, because a cheap request put first starts decoding and holds every step to b prefill tokens, where FIFO
would have computed the passed one's prompt at B a step. A request moves only while a seat is free for it and each
request it passes (a seat it took would keep one of them waiting, a step at a time, for the running to end), and
only a request of one sequence (n > 1 siblings and beams bring more rows and seats than one). The bound takes FIFO's
order to have the same work ahead of a request at its arrival (without a cap every order computes the same prefill
in the same steps) and each request to cost the same under both; a document the other order computed first is the
difference. A sequence that ran before (preempted) keeps its place at the front, and only requests never admitted
move or are passed.
"""

from __future__ import annotations

import weakref
from collections import deque
from typing import Any

from inferplug.engine.block_manager import BlockManager
from inferplug.engine.prompt_scores import wants_prompt_logprobs
from inferplug.engine.sequence import Sequence

WINDOW = 32  # waiting requests looked at: a deeper one waits its turn to enter (its allowance starts then)


class CacheAwareOrder:
    def __init__(self, blocks: BlockManager, source: Any, step_tokens: int, prefill_cap: int, row_tokens: int = 1):
        """source: the scheduler's PrefixSource, or None; step_tokens: a step's token budget (B); prefill_cap: the
        prefill tokens a step carries beside decode rows (b; 0: no cap); row_tokens: the most a decode row takes
        (1 + k)."""
        self.blocks, self.source, self.step_tokens, self.row_tokens = blocks, source, step_tokens, row_tokens
        least = prefill_cap if 0 < prefill_cap < step_tokens else step_tokens
        self.share = max(2 * least - step_tokens, 0) / step_tokens  # of a request's FIFO wait that may pass it
        # a request's [allowance left in tokens, W: its bound in steps], set when it is first seen
        self.allowance: weakref.WeakKeyDictionary[Sequence, list[int]] = weakref.WeakKeyDictionary()
        self.moved = 0  # requests admitted out of arrival order

    def to_front(self, waiting: deque[Sequence], running: list[Sequence], free_seats: int) -> None:
        """Put the request to admit next at the front of `waiting` (running: the sequences that prefill first;
        free_seats: max_num_seqs less the running sequences' seats)."""
        window = []
        for seq in list(waiting)[:WINDOW] if self.share else ():
            if seq.first_scheduled_time is not None:  # it ran before: FIFO from here on
                break
            window.append(seq)
        if len(window) < 2:
            return
        costs = [self._cost(seq) for seq in window]
        ahead = sum(self._left(seq, seq.num_computed_tokens) for seq in running)
        rest = max(self.step_tokens - self.row_tokens * sum(seq.seats for seq in running), 1)  # B' a step
        for seq, (cost, _) in zip(window, costs):
            ahead += cost  # its FIFO wait, to its first token
            self.allowance.setdefault(seq, [int(ahead * self.share), -(-2 * ahead // rest)])
        best, floor, seats = None, costs[0][0], window[0].seats
        for i in range(1, len(window)):
            cost, cached = costs[i]
            if (cached and cost < floor and seats < free_seats and _one_sequence(window[i])
                    and all(self.allowance[r][0] >= self._charge(window[i], cost, r) for r in window[:i])):
                best, floor = i, cost
            seats += window[i].seats
        if best is None:
            return
        for passed in window[:best]:
            self.allowance[passed][0] -= self._charge(window[best], floor, passed)
        del waiting[best]
        waiting.appendleft(window[best])
        self.moved += 1

    def _charge(self, seq: Sequence, cost: int, passed: Sequence) -> int:
        """What moving seq ahead of `passed` takes from its allowance: seq's prefill and the decode rows it runs
        before passed's first token."""
        return cost + self.row_tokens * min(seq.max_tokens - 1, self.allowance[passed][1])

    def _cost(self, seq: Sequence) -> tuple[int, int]:
        """(tokens to compute, tokens cached) were seq admitted now."""
        total = len(seq.token_ids)
        if wants_prompt_logprobs(seq):  # it takes no cached KV
            return total, 0
        hits = self.blocks.lookup_prefix(seq)
        if self.blocks.window is not None:  # as admission takes it: as far as the window group still holds
            hits = self.blocks.window.usable(seq, hits)
        hit = len(hits) * self.blocks.block_size
        left = self._left(seq, hit)
        return left, total - left

    def _left(self, seq: Sequence, start: int) -> int:
        """Prompt tokens seq computes from `start` on: its cached documents after it are filled, not computed."""
        docs = self.source.cached_tokens(seq, start) if self.source is not None and self.source.has_spans(seq) else 0
        return max(seq.num_prompt_tokens - start - docs, 0)


def _one_sequence(seq: Sequence) -> bool:
    """seq decodes one row a step and takes one seat: no siblings (n > 1) join it, and it is no beam search."""
    return seq.seats == 1 and not seq.siblings_waiting
