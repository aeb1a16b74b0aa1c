"""RAG document KV cache: a retrieved chunk's KV is cached and found per document, not per exact prefix.

The front ends pass `Request.documents` (character spans + content keys). Here each span becomes
a token *segment* (the document's tokens), keyed by its token ids. When a request reaches a segment whose KV is cached, the engine copies it into the
request's KV blocks instead of computing it, even if the neighbours or the position differ:

- Position: K is stored after RoPE at the position it was computed; rotations compose, so moving
  it by `delta` positions is one more RoPE rotation by `delta` (EPIC, arXiv 2410.15332, and
  CacheBlend, arXiv 2405.16444, do the same). V has no position and is copied as is.
- Cross-attention: a reused segment attends to the neighbours it was first computed with, not
  to the current ones. The question and every non-cached token are computed in full and attend
  to everything; selective recompute (engine/rag_recompute.py) computes some of a reused segment's tokens
  again, and bench/rag_cache.py measures both (greedy answers against full recompute).
- Isolation and exactness: segment keys include the request's cache_salt, so salted tenants
  never share document KV. Injected KV is approximate, so the scheduler keys the blocks from an
  injected segment onwards under `block_hash.doc_approx_key`: a later request without document
  hints never gets them and computes exact KV.
- Memory: entries live in host memory (capacity_bytes of it), never on the KV device, whose
  memory the resolver's plan already gives to the block pool.
- Disk (engine/doc_disk.py, when the profile gives it a size): every segment computed is written there too, and a
  segment missing in memory is looked for there once, and loaded, so a restarted or second process reuses a
  corpus's KV (precomputed at indexing time: rag/precompute.py). A shared corpus's salt (`shared_salt`) is looked
  up after the request's own: every tenant reads that corpus, and writes only under its own salt.

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
from inferplug.engine.doc_disk import DocumentKVDisk
from inferplug.ops.attention import read_kv, write_kv
from inferplug.ops.torch_ops import apply_rope
from inferplug.rag.documents import as_rag_document
from inferplug.types import DocumentSpan


@dataclass
class Segment:
    start: int  # token positions [start, end) in the prompt
    end: int
    key: bytes  # hash of the segment's token ids and the request's cache salt
    done: bool = False  # stored or injected already
    doc_key: str = ""  # the document's content key (DocumentSpan.key): what evict_document finds it by
    salt: str | None = None  # the request's cache salt
    shared_key: bytes | None = None  # its key under the shared corpus's salt, looked up after `key`
    found: bytes | None = None  # the key its cached KV was found under
    looked_on_disk: bool = False


@dataclass
class _Entry:
    k: torch.Tensor  # [layers, tokens, kv_heads, head_dim] on the CPU, post-RoPE at `position`
    v: torch.Tensor
    position: int
    doc_key: str = ""
    salt: str | None = None

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes


class DocumentKVCache:
    def __init__(self, model: Any, kv_caches: list[tuple[torch.Tensor, torch.Tensor]], block_size: int,
                 tokenizer: Any, *, capacity_bytes: int = 512 << 20, min_tokens: int = 8,
                 disk: DocumentKVDisk | None = None, shared_salt: str | None = None):
        self.model, self.kv_caches, self.block_size, self.tokenizer = model, kv_caches, block_size, tokenizer
        self.capacity_bytes, self.min_tokens = capacity_bytes, min_tokens
        self.disk, self.shared_salt = disk, shared_salt or None
        self.computed_segments = 0
        self.entries: OrderedDict[bytes, _Entry] = OrderedDict()  # LRU order, newest last
        self.nbytes = 0
        self.plans: weakref.WeakKeyDictionary[Any, list[Segment]] = weakref.WeakKeyDictionary()
        self.hit_tokens = self.stored_segments = self.injected_segments = 0

    # --- planning ---------------------------------------------------------------------
    def plan(self, seq: Any, prompt_text: str | None, documents: list[DocumentSpan] | None, covered: int) -> None:
        """Map the request's document spans to token segments of seq's prompt, whose first `covered` tokens the text
        is (all of them, but for a scored continuation: LLMEngine.prompt_logprob_rows)."""
        if not documents or prompt_text is None:
            return
        enc = self.tokenizer(prompt_text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = enc["input_ids"], enc["offset_mapping"]
        shift = covered - len(ids)  # special tokens the engine prepended
        if shift < 0 or seq.prompt_ids[shift:covered] != ids:
            return  # the engine tokenized differently: no hints, plain computing
        spans = sorted(documents, key=lambda d: d.start)
        # a segment is the document's own tokens: with the separator to the next document in it, a document
        # that moves to or from the last place (no separator after it) would never match its cached KV
        starts = [_first_token_at(offsets, s.start) for s in spans]
        ends = [_first_token_at(offsets, s.end) for s in spans]
        last = covered - 1  # the last prompt token is always computed, for its logits
        segments = []
        salt = seq.cache_salt or None
        shared = self.shared_salt if self.shared_salt != salt else None
        for span, start, end in zip(spans, starts, ends):
            start, end = start + shift, min(end + shift, last)
            if end - start >= self.min_tokens:
                tokens = seq.prompt_ids[start:end]
                segments.append(Segment(start, end, hash_block(None, tokens, salt), doc_key=span.key, salt=salt,
                                        shared_key=hash_block(None, tokens, shared) if shared else None))
        if segments:
            self.plans[seq] = segments

    # --- what the scheduler asks (scheduler.PrefixSource) ------------------------------------
    def has_spans(self, seq: Any) -> bool:
        return seq in self.plans

    def chunk_end(self, seq: Any, computed: int, n: int) -> int:
        """Shorten a prefill chunk so it ends where the next cached segment starts (it is filled there)."""
        for seg in self.plans.get(seq, ()):
            if not seg.done and seg.start > computed and self._cached(seg):
                return min(n, seg.start - computed)
        return n

    def cached_tokens(self, seq: Any, start: int) -> int:
        """Tokens of the segments from `start` on whose KV is in memory now (engine/cache_aware.py ranks waiting
        requests by it). A probe only: no disk load, nothing evicted, and the segment's one disk lookup is kept for
        its admission."""
        return sum(seg.end - seg.start for seg in self.plans.get(seq, ())
                   if not seg.done and seg.start >= start and self._in_memory(seg) is not None)

    def _in_memory(self, seg: Segment) -> bytes | None:
        """The key seg's KV is in memory under: the request's salt's, else the shared corpus's; None if neither."""
        return next((key for key in (seg.key, seg.shared_key) if key is not None and key in self.entries), None)

    def store_computed(self, seq: Any) -> None:
        """Store the segments computed by now. A segment partly computed before (a chunk boundary, a prefix hit)
        was finished normally, and is stored too."""
        for seg in self.plans.get(seq, ()):
            if not seg.done and seg.end <= seq.num_computed_tokens:
                self._store(seq, seg)

    def next_span(self, seq: Any, at: int) -> Segment | None:
        """The cached segment starting exactly at token `at` (where seq's computed tokens end, or its prefix hit)."""
        for seg in self.plans.get(seq, ()):
            if not seg.done and seg.start == at and self._cached(seg):
                return seg
        return None

    def skip(self, seg: Segment) -> None:
        seg.done = True
        self.computed_segments += 1

    def _slots(self, seq: Any, start: int, end: int) -> torch.Tensor:
        bs = self.block_size
        return torch.tensor([seq.block_table[p // bs] * bs + p % bs for p in range(start, end)],
                            dtype=torch.long, device=self.kv_caches[0][0].device)

    def _store(self, seq: Any, seg: Segment) -> None:
        seg.done = True
        if seg.key in self.entries:  # its start came from the prefix cache, or a chunk ended inside it
            self.entries.move_to_end(seg.key)
            return
        self.computed_segments += 1
        slots = self._slots(seq, seg.start, seg.end)
        k = torch.stack([read_kv(kc, slots) for kc, _ in self.kv_caches]).cpu()
        v = torch.stack([read_kv(vc, slots) for _, vc in self.kv_caches]).cpu()
        entry = _Entry(k, v, seg.start, seg.doc_key, seg.salt)
        if self.disk is not None:
            self.disk.save(seg.key, seg.salt, seg.doc_key, k, v, seg.start)
        if self._insert(seg.key, entry):
            self.stored_segments += 1

    def _insert(self, key: bytes, entry: _Entry) -> bool:
        if entry.nbytes > self.capacity_bytes:
            return False
        while self.nbytes + entry.nbytes > self.capacity_bytes:  # on disk too, when there is a disk tier
            self.nbytes -= self.entries.popitem(last=False)[1].nbytes
        self.entries[key] = entry
        self.nbytes += entry.nbytes
        return True

    def _cached(self, seg: Segment) -> bool:
        """Whether seg's KV is at hand (seg.found: under which key): in memory under the request's salt or the
        shared one, else loaded from disk, where a segment is looked for once."""
        seg.found = self._in_memory(seg)
        if seg.found is None and self.disk is not None and not seg.looked_on_disk:
            seg.looked_on_disk = True
            for key, salt in [(seg.key, seg.salt), *([(seg.shared_key, self.shared_salt)] if seg.shared_key else [])]:
                loaded = self.disk.load(key, salt, seg.doc_key)
                if loaded is not None and self._fits(seg, loaded[0]) and \
                        self._insert(key, _Entry(*loaded, seg.doc_key, salt)):
                    seg.found = key
                    break
        return seg.found is not None

    def _fits(self, seg: Segment, k: torch.Tensor) -> bool:
        """A loaded entry holds seg's tokens in this pool's layout (its namespace says so; a mismatch is a bug)."""
        pool = self.kv_caches[0][0]
        return tuple(k.shape) == (len(self.kv_caches), seg.end - seg.start, pool.shape[0], pool.shape[-1]) and \
            k.dtype == pool.dtype

    def fill(self, seq: Any, seg: Segment) -> None:
        """Copy a cached segment's KV (re-rotated to its new position) into the blocks the scheduler gave seq."""
        key = seg.found or seg.key
        entry = self.entries[key]
        self.entries.move_to_end(key)
        if self.disk is not None:
            self.disk.touch(key, entry.salt, entry.doc_key)  # a use: the disk's LRU order
        slots = self._slots(seq, seg.start, seg.end)
        k, v = entry.k.to(slots.device), entry.v.to(slots.device)
        for layer, (kc, vc) in enumerate(self.kv_caches):  # each layer by its own RoPE (Gemma 3's sliding ones)
            write_kv(kc, vc, rerotate(k[layer], seg.start - entry.position, *self.model.rope_of(layer)), v[layer],
                     slots)
        seg.done = True
        self.hit_tokens += seg.end - seg.start
        self.injected_segments += 1

    # --- eviction ---------------------------------------------------------------------------
    def evict(self, docs: list[Any] | None, salt: str | None = None) -> int:
        """Drop the KV stored under `salt` of each document (a str, LangChain Document or LlamaIndex node, found by
        its content key), or of every document when docs is None, in memory and on disk. Returns the entries
        dropped."""
        salt = salt or None
        if docs is None:
            return self._evict(lambda e: e.salt == salt, lambda disk: disk.evict_salt(salt))
        keys = {as_rag_document(d).key for d in docs}
        return self._evict(lambda e: e.salt == salt and e.doc_key in keys,
                           lambda disk: sum(disk.evict_document(key, salt) for key in keys))

    def _evict(self, matches: Any, on_disk: Any) -> int:
        gone = [key for key, entry in self.entries.items() if matches(entry)]
        for key in gone:
            self.nbytes -= self.entries.pop(key).nbytes
        return len(gone) + (on_disk(self.disk) if self.disk is not None else 0)

    def stats(self) -> dict[str, Any]:
        looked_up = self.injected_segments + self.computed_segments
        disk = self.disk
        return {"doc_cache_entries": len(self.entries), "doc_cache_bytes": self.nbytes,
                "doc_cache_hit_tokens": self.hit_tokens, "doc_cache_injected": self.injected_segments,
                "doc_cache_stored": self.stored_segments,
                # of the segments this cache filled or saw computed (a prefix-cache hit is neither)
                "doc_cache_hit_rate": self.injected_segments / looked_up if looked_up else 0.0,
                "doc_cache_disk_bytes": disk.nbytes if disk else 0, "doc_cache_disk_loads": disk.loads if disk else 0,
                "doc_cache_disk_writes": disk.writes if disk else 0,
                "doc_cache_disk_rejected": disk.rejected if disk else 0}


def rerotate(k: torch.Tensor, delta: int, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Move post-RoPE keys by `delta` positions: one more RoPE rotation (sin is odd in delta). The tables' own
    magnitude (YaRN scales cos and sin; cos at position 0 holds it) is divided out: the keys already carry it."""
    if delta == 0:
        return k
    magnitude = cos[0, 0].float()
    c = cos[abs(delta)].float() / magnitude
    s = signed_sin[abs(delta)].float() * ((1 if delta > 0 else -1) / magnitude)
    return apply_rope(k.float(), c, s).to(k.dtype)


def _first_token_at(offsets: list[tuple[int, int]], char: int) -> int:
    """The first token that starts at or after `char`."""
    for i, (start, _) in enumerate(offsets):
        if start >= char:
            return i
    return len(offsets)
