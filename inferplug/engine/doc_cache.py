"""RAG document KV cache: a retrieved chunk's KV is cached and found per document, not per exact prefix.

The front ends pass `Request.documents` (character spans + content keys). Here each span becomes
a token *segment* (the document's tokens), keyed by its token ids. When a request reaches a segment whose KV is cached, the engine copies it into the
request's KV blocks instead of computing it, even if the neighbours or the position differ:

- Position: K is stored after RoPE at the position it was computed; rotations compose, so moving
  it by `delta` positions is one more RoPE rotation by `delta` (EPIC, arXiv 2410.15332, and
  CacheBlend, arXiv 2405.16444, do the same). V has no position and is copied as is.
- Cross-attention: a reused segment attends to the neighbours it was first computed with, not
  to the current ones. The question and every non-cached token are computed in full and attend
  to everything; bench/rag_cache.py measures what that costs (greedy-token agreement against
  full recompute). Selective recompute (CacheBlend) is the next step if agreement drops.
- Isolation and exactness: segment keys include the request's cache_salt, so salted tenants
  never share document KV. Injected KV is approximate, so the scheduler keys the blocks from an
  injected segment onwards under `block_hash.doc_approx_key`: a later request without document
  hints never gets them and computes exact KV.
- Memory: entries live in host memory (capacity_bytes of it), never on the KV device, whose
  memory the resolver's plan already gives to the block pool.

This cache is a prefix source the scheduler asks (scheduler.PrefixSource); it never allocates,
commits or counts tokens. LLMEngine.add_request calls `plan`; the scheduler stops prefill chunks
where a cached segment starts (`chunk_end`), continues prefix hits through blocks an earlier
injection filled, and after each step stores new segments (`store_computed`) and, once it has
given a segment's tokens blocks, has it filled (`next_span`, `fill`).
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

from inferplug.engine.block_hash import hash_block
from inferplug.ops.attention import read_kv, write_kv
from inferplug.ops.torch_ops import apply_rope
from inferplug.types import DocumentSpan


@dataclass
class Segment:
    start: int  # token positions [start, end) in the prompt
    end: int
    key: bytes  # hash of the segment's token ids and the request's cache salt
    done: bool = False  # stored or injected already


@dataclass
class _Entry:
    k: torch.Tensor  # [layers, tokens, kv_heads, head_dim] on the CPU, post-RoPE at `position`
    v: torch.Tensor
    position: int

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes


class DocumentKVCache:
    def __init__(self, model: Any, kv_caches: list[tuple[torch.Tensor, torch.Tensor]], block_size: int,
                 tokenizer: Any, *, capacity_bytes: int = 512 << 20, min_tokens: int = 8):
        self.model, self.kv_caches, self.block_size, self.tokenizer = model, kv_caches, block_size, tokenizer
        self.capacity_bytes, self.min_tokens = capacity_bytes, min_tokens
        self.entries: OrderedDict[bytes, _Entry] = OrderedDict()  # LRU order, newest last
        self.nbytes = 0
        self.plans: weakref.WeakKeyDictionary[Any, list[Segment]] = weakref.WeakKeyDictionary()
        self.hit_tokens = self.stored_segments = self.injected_segments = 0

    # --- planning ---------------------------------------------------------------------
    def plan(self, seq: Any, prompt_text: str | None, documents: list[DocumentSpan] | None) -> None:
        """Map the request's document spans to token segments of seq's prompt."""
        if not documents or prompt_text is None:
            return
        enc = self.tokenizer(prompt_text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = enc["input_ids"], enc["offset_mapping"]
        shift = len(seq.prompt_ids) - len(ids)  # special tokens the engine prepended
        if shift < 0 or seq.prompt_ids[shift:] != ids:
            return  # the engine tokenized differently: no hints, plain computing
        spans = sorted(documents, key=lambda d: d.start)
        # a segment is the document's own tokens: with the separator to the next document in it, a document
        # that moves to or from the last place (no separator after it) would never match its cached KV
        starts = [_first_token_at(offsets, s.start) for s in spans]
        ends = [_first_token_at(offsets, s.end) for s in spans]
        last = len(seq.prompt_ids) - 1  # the last prompt token is always computed, for its logits
        segments = []
        for start, end in zip(starts, ends):
            start, end = start + shift, min(end + shift, last)
            if end - start >= self.min_tokens:
                segments.append(Segment(start, end, hash_block(None, seq.prompt_ids[start:end], seq.cache_salt)))
        if segments:
            self.plans[seq] = segments

    # --- what the scheduler asks (scheduler.PrefixSource) ------------------------------------
    def has_spans(self, seq: Any) -> bool:
        return seq in self.plans

    def chunk_end(self, seq: Any, computed: int, n: int) -> int:
        """Shorten a prefill chunk so it ends where the next cached segment starts (it is filled there)."""
        for seg in self.plans.get(seq, ()):
            if not seg.done and seg.start > computed and seg.key in self.entries:
                return min(n, seg.start - computed)
        return n

    def store_computed(self, seq: Any) -> None:
        """Store the segments computed by now. A segment partly computed before (a chunk boundary, a prefix hit)
        was finished normally, and is stored too."""
        for seg in self.plans.get(seq, ()):
            if not seg.done and seg.end <= seq.num_computed_tokens:
                self._store(seq, seg)

    def next_span(self, seq: Any) -> Segment | None:
        """The cached segment starting exactly where seq's computed tokens end."""
        for seg in self.plans.get(seq, ()):
            if not seg.done and seg.start == seq.num_computed_tokens and seg.key in self.entries:
                return seg
        return None

    def skip(self, seg: Segment) -> None:
        seg.done = True

    def _slots(self, seq: Any, start: int, end: int) -> torch.Tensor:
        bs = self.block_size
        return torch.tensor([seq.block_table[p // bs] * bs + p % bs for p in range(start, end)],
                            dtype=torch.long, device=self.kv_caches[0][0].device)

    def _store(self, seq: Any, seg: Segment) -> None:
        seg.done = True
        if seg.key in self.entries:
            self.entries.move_to_end(seg.key)
            return
        slots = self._slots(seq, seg.start, seg.end)
        k = torch.stack([read_kv(kc, slots) for kc, _ in self.kv_caches]).cpu()
        v = torch.stack([read_kv(vc, slots) for _, vc in self.kv_caches]).cpu()
        entry = _Entry(k, v, seg.start)
        if entry.nbytes > self.capacity_bytes:
            return
        while self.nbytes + entry.nbytes > self.capacity_bytes:
            self.nbytes -= self.entries.popitem(last=False)[1].nbytes
        self.entries[seg.key] = entry
        self.nbytes += entry.nbytes
        self.stored_segments += 1

    def fill(self, seq: Any, seg: Segment) -> None:
        """Copy a cached segment's KV (re-rotated to its new position) into the blocks the scheduler gave seq."""
        entry = self.entries[seg.key]
        self.entries.move_to_end(seg.key)
        slots = self._slots(seq, seg.start, seg.end)
        k = rerotate(entry.k.to(slots.device), seg.start - entry.position, self.model.cos,
                     self.model.signed_sin)
        v = entry.v.to(slots.device)
        for layer, (kc, vc) in enumerate(self.kv_caches):
            write_kv(kc, vc, k[layer], v[layer], slots)
        seg.done = True
        self.hit_tokens += seg.end - seg.start
        self.injected_segments += 1

    def stats(self) -> dict[str, Any]:
        return {"doc_cache_entries": len(self.entries), "doc_cache_bytes": self.nbytes,
                "doc_cache_hit_tokens": self.hit_tokens, "doc_cache_injected": self.injected_segments,
                "doc_cache_stored": self.stored_segments}


def rerotate(k: torch.Tensor, delta: int, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Move post-RoPE keys by `delta` positions: one more RoPE rotation (sin is odd in delta)."""
    if delta == 0:
        return k
    c = cos[abs(delta)].float()
    s = signed_sin[abs(delta)].float() * (1 if delta > 0 else -1)
    return apply_rope(k.float(), c, s).to(k.dtype)


def _first_token_at(offsets: list[tuple[int, int]], char: int) -> int:
    """The first token that starts at or after `char`."""
    for i, (start, _) in enumerate(offsets):
        if start >= char:
            return i
    return len(offsets)
