"""What the scheduler (engine/scheduler.py) asks of its peers, and nothing more: a prefix source (the RAG document
cache, engine/doc_cache.py) and a proposer of speculative tokens (engine/spec_decode.py, engine/draft.py)."""

from __future__ import annotations

from typing import Any, Protocol

from inferplug.engine.block_manager import BlockManager
from inferplug.engine.sequence import Sequence


class PrefixSource(Protocol):
    """KV for prompt spans that the exact prefix cache does not hold (engine/doc_cache.py)."""

    def has_spans(self, seq: Sequence) -> bool: ...

    def chunk_end(self, seq: Sequence, computed: int, n: int) -> int:
        """n, or fewer so that the chunk stops where a span this source can fill starts."""

    def cached_tokens(self, seq: Sequence, start: int) -> int:
        """Tokens of seq's spans from `start` on that this source could fill now (the admission order asks)."""

    def store_computed(self, seq: Sequence) -> None:
        """Keep the spans seq has computed by now (reads the KV, changes nothing of seq)."""

    def next_span(self, seq: Sequence, at: int) -> Any:
        """A span (with .start/.end) this source can fill that starts at token `at`, or None."""

    def fill(self, seq: Sequence, span: Any) -> None:
        """Write the span's KV into the slots seq's blocks hold for it."""

    def skip(self, span: Any) -> None:
        """Leave the span to be computed like any other token."""


class Proposer(Protocol):
    """Speculative tokens for sequences about to decode (engine/spec_decode.py)."""

    pools: tuple[BlockManager, ...]  # KV pools of its own (a draft model's), checked like the target's
    num_tokens: int  # the most tokens it proposes for a row

    def propose(self, seqs: list[Sequence], limits: list[int]) -> list[Any]:
        """One spec_verify.Proposal per sequence, at most its limit tokens."""

    def release(self, seq: Sequence) -> None:
        """seq left the running set (finished, aborted, preempted): drop what is held for it."""
