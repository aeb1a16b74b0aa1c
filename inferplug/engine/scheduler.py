"""Iteration-level scheduling with no prefill/decode phases (vLLM v1's idea).

Each step hands out a token budget: running sequences first (a decode is one token, an
unfinished prefill gets the next chunk), then waiting ones in arrival order (schedule="cache_aware":
those with cached tokens first, each wait within 2x FIFO's, engine/cache_aware.py), shared out between clients (each
admission goes to a client with the fewest running sequences). When the pool runs
short, the newest running sequence is preempted by recompute: its blocks go back to the pool,
its full blocks usually stay cached, and it rejoins the front of the queue.

A hybrid model (Qwen3.5) keeps a fixed-size state per running sequence in its DeltaNet layers: a sequence is admitted
only with a state slot free, holds it while it runs, and gives it back when it finishes or is preempted (the state is
freed, not kept). Its prompt's chunks end on the DeltaNet's chunk grid (state_chunk), so the chunked delta rule
cuts the prompt the same way however the steps split it: a sequence's state and outputs do not depend on what shares
its steps. A prefix hit is cut back to the longest one a state snapshot continues (engine/state_snapshots.py), whose
state the sequence starts from; a prompt's last chunk starts at its snapshot point, so that its state is kept there.

The scheduler is the one writer of a sequence's token counts, tokens and blocks: it admits,
advances (`update_after_step`, `append_token`), preempts and finishes. A prefix source (the RAG
document cache) is asked, never given the pool: where a prefill chunk must stop, which cached
blocks continue a prefix hit, and which spans it can fill once the scheduler has given them blocks. A filled span may
leave rows to recompute (engine/rag_recompute.py): they go with the sequence's next chunk, in the same step, and the
span's blocks are committed to the prefix cache only after that step.
A proposer (engine/spec_decode.py, engine/draft.py) is asked likewise, once a step for all decoding rows, for
their speculative tokens: a row becomes a 1 + k token chunk, and after the step the scheduler keeps the
accepted ones and returns the rejected slots; the proposer rolls its own state back when next asked.
"""

from __future__ import annotations

import time
from collections import Counter, deque

from inferplug.engine.block_manager import BlockManager
from inferplug.engine.cache_aware import CacheAwareOrder
from inferplug.engine.prompt_scores import cacheable_blocks
from inferplug.engine.rag_recompute import RecomputePolicy
from inferplug.engine.scheduler_peers import PrefixSource, Proposer
from inferplug.engine.sequence import Sequence, SequenceStatus


def _generating(seq: Sequence) -> bool:
    """seq is past its prompt: its next row computes a generated token (its prompt, and any recompute, are done).
    A state of the sequence, where model_runner.is_decode_row classes one scheduled row."""
    return seq.num_computed_tokens >= seq.num_prompt_tokens and seq.num_computed_tokens == len(seq.token_ids) - 1


class Scheduler:
    def __init__(self, blocks: BlockManager, *, max_num_seqs: int, max_num_batched_tokens: int,
                 max_prefill_tokens_while_decoding: int = 0, prefix_source: PrefixSource | None = None,
                 proposer: Proposer | None = None, recompute: RecomputePolicy = RecomputePolicy(),
                 schedule: str = "fifo", state_slots: int = 0, state_chunk: int = 0, snapshots=None):
        """max_prefill_tokens_while_decoding: prefill tokens a step may carry beside decode rows (0: the whole
        budget), so a long prompt's chunks stretch the running streams' steps by a bounded amount. schedule:
        "cache_aware" admits waiting requests with cached tokens early, each wait within 2x FIFO's (cache_aware.py).
        state_slots: a hybrid model's per-sequence DeltaNet states (0: the model keeps none), state_chunk the
        chunk its delta rule cuts a prompt into, and snapshots its engine/state_snapshots.StateSnapshots (None: a
        prefix hit gives it nothing)."""
        self.blocks = blocks
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_prefill_tokens_while_decoding = max_prefill_tokens_while_decoding
        self.prefix_source = prefix_source
        self.proposer = proposer
        self.recompute = recompute  # which tokens of a segment the prefix source filled are computed again
        self.num_recomputed_tokens = 0
        self.num_draft_tokens = self.num_accepted_tokens = self.num_spec_steps = 0
        self.free_state_slots = list(range(state_slots))[::-1]
        self.needs_state = state_slots > 0
        self.state_chunk = state_chunk
        self.snapshots = snapshots
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.order = CacheAwareOrder(blocks, prefix_source, max_num_batched_tokens, max_prefill_tokens_while_decoding,
                                     1 + (proposer.num_tokens if proposer else 0)) if schedule == "cache_aware" \
            else None  # None: arrival order

    def add(self, seq: Sequence, *, front: bool = False, siblings: list[Sequence] = ()) -> None:
        """Queue seq; its siblings (the other choices of n > 1) join once its prompt is computed, to share it."""
        seq.status = SequenceStatus.WAITING
        seq.siblings_waiting = list(siblings) or seq.siblings_waiting
        (self.waiting.appendleft if front else self.waiting.append)(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[tuple[Sequence, int]]:
        """The (sequence, number of new tokens) pairs to compute this step."""
        budget = prefill_budget = self.max_num_batched_tokens
        if self.max_prefill_tokens_while_decoding and any(map(_generating, self.running)):
            prefill_budget = self.max_prefill_tokens_while_decoding
        step_limit = prefill_budget  # the most prefill rows this step can hold
        scheduled: list[tuple[Sequence, int]] = []
        preempted = False
        self._propose(budget)
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            decoding = _generating(seq)
            if not decoding and prefill_budget <= 0:  # the decode rows' step is full of prefill: next step
                i += 1
                continue
            self._trim_proposal(seq, budget - 1)  # those before it may have taken the budget it was proposed for
            limit = budget if decoding else min(budget, prefill_budget)
            extra = sum(r.keep for r in seq.recompute)  # a probe's rows that stop at its early layer do not count
            if extra and extra >= limit and prefill_budget < step_limit:  # they go with its next chunk, in one
                i += 1  # step: one with room for them, or else one no other prefill shares (over the budget)
                continue
            n = self._chunk(seq, seq.num_computed_tokens, max(limit - extra, 1))
            if not n:  # no whole chunk fits beside this step's other rows: the next step
                i += 1
                continue
            if seq.spec_token_ids and not self.blocks.allocate(seq, seq.num_computed_tokens + n):
                self._trim_proposal(seq, 0)  # no room to speculate: decode plainly rather than preempt another
                n = self._chunk(seq, seq.num_computed_tokens, budget)
            while not self.blocks.allocate(seq, seq.num_computed_tokens + n):
                victim = self.running.pop()
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            else:
                scheduled.append((seq, n))
                budget -= n + extra
                prefill_budget -= 0 if decoding else n + extra
                i += 1
                continue
            break
        for seq in self.running[i:]:  # out of budget this step: no proposal stands for it
            self._trim_proposal(seq, 0)
        if preempted:  # admitting now would only take blocks the preempted need back
            return scheduled
        seats = sum(seq.seats for seq in self.running)
        self._order_waiting(seats)
        while (self.waiting and min(budget, prefill_budget) > 0
               and (self.free_state_slots or not self.needs_state)
               and seats + (seq := self._next_waiting()).seats <= self.max_num_seqs):
            hits = self._prefix_hits(seq)
            computed = len(hits) * self.blocks.block_size
            # a cached document starting where the hit ends is filled now, and seq computes on from it next step
            fills = self._source_fills_at(seq, computed)
            n = 0 if fills else self._chunk(seq, computed, min(budget, prefill_budget))
            if not n and not fills:
                break
            if not self.blocks.allocate(seq, computed + n, hits):
                break
            self.waiting.remove(seq)
            self._admit(seq, computed)
            if self.needs_state and computed:  # from the snapshot its hit ends at (_prefix_hits)
                self.snapshots.restore(seq, len(hits))
            seats += seq.seats
            self._order_waiting(seats)
            if fills:
                self._fill_from_source(seq)
                continue
            scheduled.append((seq, n))
            budget -= n
            prefill_budget -= n
        return scheduled

    def update_after_step(self, scheduled: list[tuple[Sequence, int]],
                          accepted: dict[Sequence, int] | None = None) -> None:
        """The step computed the scheduled tokens: count them, offer full blocks to the prefix cache, and let the
        prefix source keep what it wants and fill the spans that start where a sequence now stands. `accepted`:
        how many of a speculating sequence's proposals the sampler kept; the KV of the rest is dropped (the
        count steps back over it and its tail blocks return), before anything is committed."""
        for seq, n in scheduled:
            if seq.spec_token_ids:
                seq.num_computed_tokens += n - self._settle_proposals(seq, (accepted or {}).get(seq, 0))
                self.blocks.truncate(seq, seq.num_computed_tokens + 1)  # the next decode's slot stays
            else:
                seq.num_computed_tokens += n
            recomputed = sum(r.keep for r in seq.recompute)  # done in this step, with the chunk
            self.num_recomputed_tokens += recomputed
            if recomputed:  # computed after all: not cached (usage's cached_tokens)
                seq.num_cached_tokens -= recomputed
            seq.recompute = []
            self.blocks.commit(seq)
            if self.snapshots is not None:
                self.snapshots.keep(seq)
            if self.prefix_source is not None and self.prefix_source.has_spans(seq):
                self._fill_from_source(seq)

    def append_token(self, seq: Sequence, token_id: int) -> None:
        """A sampled token joins seq; its first one means its prompt is cached, so its siblings can share it."""
        seq.token_ids.append(token_id)
        for sibling in reversed(seq.siblings_waiting):
            self.add(sibling, front=True)
        seq.siblings_waiting = []

    def fork(self, beams: list[Sequence], parents: list[Sequence], tokens: list[int]) -> list[tuple[int, int, bool]]:
        """Beam search moved on: beams[i] becomes parents[i] plus tokens[i] (a beam may be its own or another's
        parent; a beam not yet running joins). Beams share their parents' blocks; a shared partial block, where
        the next token is written, is copied (copy on write), or the beam is preempted when no block is free.
        Returns the (source, copy, windowed) blocks whose KV the runner must copy before the next step."""
        states = [(list(p.token_ids), self.blocks.which_tables(p), list(p.block_hashes), p.num_committed_blocks,
                   p.num_computed_tokens, p.num_cached_tokens) for p in parents]
        for state in states:  # take the new tables before the old ones go, so shared blocks stay
            self.blocks.retain(state[1])
        for beam in beams:
            self.blocks.release(beam)
        for beam, (token_ids, tables, hashes, committed, computed, cached), token in zip(beams, states, tokens):
            beam.token_ids, (beam.block_table, beam.window_table), beam.block_hashes = token_ids + [token], tables, hashes
            beam.num_committed_blocks, beam.num_computed_tokens = committed, computed
            beam.num_cached_tokens = cached if beam.num_cached_tokens is None else beam.num_cached_tokens
            if beam.status is not SequenceStatus.RUNNING:
                beam.status = SequenceStatus.RUNNING
                self.running.append(beam)
        copies = []
        for beam in beams:
            if not self.blocks.needs_copy(beam):
                continue
            if self.blocks.can_copy(beam):
                copies += self.blocks.copy_on_write(beam)
            else:
                self.running.remove(beam)
                self._preempt(beam)
        return copies

    def rewind(self, seq: Sequence) -> None:
        """Step back over seq's last computed token (a beam whose siblings missed this step computes it again
        with them). Its slot and block stay; a full block stays cached, its KV being that of an accepted token."""
        seq.num_computed_tokens -= 1

    def finish(self, seq: Sequence) -> None:
        """Drop a finished or aborted sequence wherever it is and free its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self._release(seq)
        seq.status = SequenceStatus.FINISHED

    # --- internals ------------------------------------------------------------------
    def _chunk(self, seq: Sequence, computed: int, budget: int) -> int:
        n = min(len(seq.token_ids) + len(seq.spec_token_ids) - computed, budget)
        if self.prefix_source is not None and self.prefix_source.has_spans(seq):
            n = self.prefix_source.chunk_end(seq, computed, n)
        if self.snapshots is not None and computed < (point := self.snapshots.prompt_point(seq)) < computed + n:
            n = point - computed  # the state there is kept for prefix hits (state_snapshots.py)
        if self.state_chunk and computed + n < len(seq.token_ids):  # a piece of a hybrid model's prompt
            aligned = (computed + n) // self.state_chunk * self.state_chunk - computed
            # 0: wait for a step with room, unless no step ever has it (then the grid is left, and met again later)
            n = aligned if aligned > 0 or self.max_num_batched_tokens >= self.state_chunk else n
        return n

    def _propose(self, budget: int) -> None:
        """Ask the proposer, in one call, for the running decoding sequences' next tokens: each at most
        budget - 1, and never past max_tokens with the extra token every verification yields (so positions stay
        inside the context too)."""
        for seq in self.running:
            self._trim_proposal(seq, 0)
        if self.proposer is None:
            return
        decoding = [s for s in self.running if _generating(s)]
        limits = [min(budget - 1, s.max_tokens - s.num_output_tokens - 1) for s in decoding]
        for seq, proposal in zip(decoding, self.proposer.propose(decoding, limits)):
            seq.spec_token_ids, seq.spec_probs = proposal.token_ids, proposal.probs

    @staticmethod
    def _trim_proposal(seq: Sequence, limit: int) -> None:
        """Keep at most `limit` of seq's proposed tokens (a prefix of a proposal is a proposal)."""
        k = max(limit, 0)
        if len(seq.spec_token_ids) > k:
            seq.spec_token_ids = seq.spec_token_ids[:k]
            if seq.spec_probs is not None:
                seq.spec_probs = seq.spec_probs[:k] if k else None

    def _settle_proposals(self, seq: Sequence, accepted: int) -> int:
        """Count seq's proposals and clear them; returns how many were rejected."""
        proposed = len(seq.spec_token_ids)
        seq.num_draft_tokens += proposed
        seq.num_accepted_tokens += accepted
        seq.num_spec_steps += 1
        self.num_draft_tokens += proposed
        self.num_accepted_tokens += accepted
        self.num_spec_steps += 1
        self._trim_proposal(seq, 0)
        return proposed - accepted

    def _next_waiting(self) -> Sequence:
        """The waiting sequence to admit next: the first, in queue order, of a client with the fewest running seats.
        So one client's flood (its n > 1 siblings and preempted sequences queue first) holds another's request
        back for one freed seat at most, not for the whole flood. With one client (or none named): the queue's head."""
        running = Counter(seq.client for seq in self.running)
        best = self.waiting[0]
        for seq in self.waiting:
            if not running[seq.client]:
                return seq
            if running[seq.client] < running[best.client]:
                best = seq
        return best

    def _prefix_hits(self, seq: Sequence) -> list[int]:
        """Cached blocks of seq's longest cached prefix, exact first, then blocks filled from the prefix source."""
        hits = self.blocks.lookup_prefix(seq)
        if self.prefix_source is not None and self.prefix_source.has_spans(seq):
            # a request with the same documents would fill these blocks with the same KV: take them instead
            more = self.blocks.approximate_run(seq, len(hits))
            if more:
                self.blocks.mark_approximate(seq, len(hits))
                hits = hits + more
        # a scored prompt row's logits are asked for, and a cached block has none: only the blocks before it
        hits = hits[:cacheable_blocks(seq, self.blocks.block_size)]
        cut = None
        while cut != len(hits):  # each cut may undo the other's point: until both hold
            cut = len(hits)
            if self.needs_state:  # a hybrid model's state must continue from the hit's end
                hits = hits[:self.snapshots.usable_blocks(seq, len(hits))] if self.snapshots is not None else []
            if self.blocks.window is not None:  # and sliding-window layers' KV must reach back a window from there
                hits = self.blocks.window.usable(seq, hits)
        return hits

    def _admit(self, seq: Sequence, computed: int) -> None:
        seq.num_computed_tokens = computed
        if seq.num_cached_tokens is None:  # first admission: count it in the prefix hit rate
            seq.num_cached_tokens = min(computed, seq.num_prompt_tokens)
            self.blocks.queried_tokens += seq.num_prompt_tokens
            self.blocks.hit_tokens += seq.num_cached_tokens
        seq.first_scheduled_time = seq.first_scheduled_time or time.perf_counter()
        seq.status = SequenceStatus.RUNNING
        if self.needs_state:
            seq.state_slot = self.free_state_slots.pop()
        self.running.append(seq)

    def _order_waiting(self, seats: int) -> None:
        if self.order is not None:
            self.order.to_front(self.waiting, self.running, self.max_num_seqs - seats)

    def _source_fills_at(self, seq: Sequence, computed: int) -> bool:
        source = self.prefix_source
        return source is not None and source.has_spans(seq) and source.next_span(seq, computed) is not None

    def _fill_from_source(self, seq: Sequence) -> None:
        source = self.prefix_source
        source.store_computed(seq)
        while (span := source.next_span(seq, seq.num_computed_tokens)) is not None:
            if not self.blocks.allocate(seq, span.end):
                source.skip(span)  # the pool is short: compute it like any other token
                return
            source.fill(seq, span)
            self.blocks.mark_approximate(seq, span.start // self.blocks.block_size)
            seq.num_computed_tokens = span.end
            seq.num_cached_tokens = (seq.num_cached_tokens or 0) + span.end - span.start
            if self.recompute.active:
                seq.recompute.append(self.recompute.for_segment(span.start, span.end))
            if not seq.recompute:  # else once recomputed: no other request may read the blocks before that
                self.blocks.commit(seq)


    def _preempt(self, seq: Sequence) -> None:
        self._release(seq)
        self.num_preemptions += 1
        self.add(seq, front=True)

    def _release(self, seq: Sequence) -> None:
        self.blocks.release(seq)
        if seq.state_slot >= 0:
            self.free_state_slots.append(seq.state_slot)
            seq.state_slot = -1
        if self.snapshots is not None:
            self.snapshots.forget(seq)
        seq.recompute = []
        if self.proposer is not None:
            self.proposer.release(seq)
        seq.num_computed_tokens = 0
        self._trim_proposal(seq, 0)
