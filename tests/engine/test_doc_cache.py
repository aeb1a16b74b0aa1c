"""RAG document KV cache: re-rotation math, and reuse of a document's KV across requests."""

from __future__ import annotations

import torch

from inferplug.engine.doc_cache import rerotate
from inferplug.models.loader import read_config
from inferplug.models.registry import family
from inferplug.models.rope import rope_tables
from inferplug.ops.torch_ops import apply_rope
from inferplug.rag import rag_prompt
from inferplug.rag.layout import document_spans
from inferplug.types import Request
from tests.engine.engine_helpers import greedy, make_engine, run_all, tokens_of


DOCS = ["The red fox lives in the northern forest and eats berries.",
        "Blue whales sing long songs that travel across the ocean.",
        "Copper wires carry current between the two brass plates."]


def test_rerotation_moves_keys_to_a_new_position(tiny_llama_dir):
    cos, sin = rope_tables(read_config(tiny_llama_dir), torch.device("cpu"))
    k = torch.randn(5, 2, cos.shape[1])
    at = lambda p: apply_rope(k, cos[p : p + 5, None], sin[p : p + 5, None])  # noqa: E731
    for old, new in [(3, 40), (40, 3), (7, 7)]:
        torch.testing.assert_close(rerotate(at(old), new - old, cos, sin), at(new), atol=1e-5, rtol=1e-5)


def _request(question: str, docs: list[str], session: str, *, hinted: bool = True, salt: str | None = None) -> Request:
    # a distinct first line per session keeps the block prefix cache out, so only the document cache reuses KV
    prompt = f"Session {session}.\n" + rag_prompt(question, docs)
    return Request(prompt=prompt, params=greedy(6), documents=document_spans(prompt, docs) if hinted else None,
                   cache_salt=salt)


def _fresh_tokens(model_dir, request: Request) -> list[int]:
    fresh = make_engine(model_dir, rag_document_cache=False)
    return tokens_of(run_all(fresh, [request])[request.request_id])


def test_same_position_reuse_is_exact(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir)
    run_all(engine, [_request("Who eats berries?", DOCS, "a")])
    second = _request("Who sings songs?", DOCS, "b")
    events = run_all(engine, [second])[second.request_id]
    assert engine.doc_cache.injected_segments == len(DOCS)
    assert events[-1].usage.cached_tokens > sum(len(d) for d in DOCS) // 2  # byte-level: ~1 token per char
    assert tokens_of(events) == _fresh_tokens(tiny_llama_dir, _request("Who sings songs?", DOCS, "b"))
    engine.blocks.check_invariants()


def test_a_document_hits_next_to_new_neighbours_and_positions(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir)
    run_all(engine, [_request("q1", DOCS[:2], "a")])
    moved = _request("q2", [DOCS[2], DOCS[1]], "b")  # DOCS[1] now has another neighbour and position
    events = run_all(engine, [moved])[moved.request_id]
    assert engine.doc_cache.hit_tokens > 0 and events[-1].usage.cached_tokens > 0
    assert events[-1].finish_reason == "length"
    engine.blocks.check_invariants()


def test_reused_document_kv_against_full_recompute(tiny_llama_dir):
    """What a reused document's KV may differ by, from the same document computed in full where it is reused:
    layer 0's K/V depend only on the token and its position, so there the difference is the re-rotation's
    rounding: fp32 angles p * theta (theta <= 1) are rounded to 2^-24 relative, the three rotations involved
    (old, new, delta) so to <= (p_old + p_new + |delta|) * 2^-24 rad, plus ~4 ulp from cos/sin and the
    rotation's multiply-adds. V has no position: equal. Later layers differ by what the other neighbours'
    cross-attention changes (CacheBlend recomputes that; bench/rag_quality.py judges what it does to answers)."""
    stored = make_engine(tiny_llama_dir)
    run_all(stored, [_request("q1", DOCS[:2], "a")])
    full = make_engine(tiny_llama_dir)  # DOCS[1] computed in full after another neighbour and a longer line
    run_all(full, [_request("q2", [DOCS[2], DOCS[1]], "b, with a longer first line")])
    (key,) = set(stored.doc_cache.entries) & set(full.doc_cache.entries)
    old, new = stored.doc_cache.entries[key], full.doc_cache.entries[key]
    delta = new.position - old.position
    assert delta > 0
    moved = rerotate(old.k[0], delta, stored.runner.model.cos, stored.runner.model.signed_sin)
    # a rotation off by angle a moves each (x, y) pair by <= a times its length, so the norm by <= a too
    error = ((moved - new.k[0]).norm() / new.k[0].norm()).item()
    assert error <= (old.position + new.position + delta + 4) * 2**-24, error
    assert torch.equal(old.v[0], new.v[0])


def test_salted_tenants_never_share_document_kv(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir)
    run_all(engine, [_request("q1", DOCS, "a", salt="tenant-1")])
    other = _request("q2", DOCS, "b", salt="tenant-2")
    events = run_all(engine, [other])[other.request_id]
    assert engine.doc_cache.injected_segments == 0 and events[-1].usage.cached_tokens == 0
    same = _request("q3", DOCS, "c", salt="tenant-1")
    run_all(engine, [same])
    assert engine.doc_cache.injected_segments == len(DOCS)  # the same tenant still reuses its documents
    engine.blocks.check_invariants()


def test_a_plain_request_never_gets_approximate_kv(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir)
    run_all(engine, [_request("q1", DOCS, "a")])
    hinted = _request("q2", [DOCS[2], DOCS[0], DOCS[1]], "b")  # moved documents: re-rotated, approximate KV
    run_all(engine, [hinted])
    assert engine.doc_cache.injected_segments > 0
    first_doc = hinted.prompt.index(DOCS[1])  # rag_prompt lists the documents last first
    plain = _request("q2", [DOCS[2], DOCS[0], DOCS[1]], "b", hinted=False)
    events = run_all(engine, [plain])[plain.request_id]
    # only the exact blocks before the first document are shared (byte-level tokenizer: tokens ~ chars)
    assert 0 < events[-1].usage.cached_tokens <= first_doc + 1
    assert tokens_of(events) == _fresh_tokens(tiny_llama_dir, _request("q2", [DOCS[2], DOCS[0], DOCS[1]], "b",
                                                                       hinted=False))
    engine.blocks.check_invariants()


def test_a_repeated_retrieval_set_hits_the_blocks_its_injection_filled(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir)
    run_all(engine, [_request("q1", DOCS, "a")])
    moved = [DOCS[2], DOCS[0], DOCS[1]]
    first = _request("q2", moved, "b")  # approximate KV injected from the documents' cache
    first_events = run_all(engine, [first])[first.request_id]
    injected = engine.doc_cache.injected_segments
    assert injected > 0
    again = _request("q2", moved, "b")  # the same prompt with hints: a prefix hit through the injected blocks
    events = run_all(engine, [again])[again.request_id]
    assert engine.doc_cache.injected_segments == injected  # nothing injected again
    usage, block = events[-1].usage, engine.config.block_size
    assert usage.cached_tokens == (usage.prompt_tokens - 1) // block * block  # every full block of the prompt
    assert tokens_of(events) == tokens_of(first_events)  # the same approximate KV, so the same answer
    engine.blocks.check_invariants()



def _block_aligned_header(engine) -> str:
    """A first line whose tokens fill whole blocks, so the document after it starts on a block boundary."""
    block = engine.config.block_size
    for pad in range(4 * block):
        header = "Session " + "x" * pad + ".\n"
        if len(engine.tokenizer(header, add_special_tokens=False)["input_ids"]) % block == 0:
            return header
    raise AssertionError("no padding of the first line fills whole blocks")


def test_a_document_starting_where_a_prefix_hit_ends_is_reused(tiny_llama_dir):
    """The prefix cache holds the first line's blocks; the document right after them is in the document cache
    (it came second before): it is filled, not computed again (the chunk used to start inside it)."""
    engine = make_engine(tiny_llama_dir)
    header = _block_aligned_header(engine)
    first = header + "\n\n".join(DOCS[:2]) + "\n\nQuestion: q1\nAnswer:"
    run_all(engine, [Request(prompt=first, params=greedy(4), documents=document_spans(first, DOCS[:2]))])
    swapped = header + "\n\n".join([DOCS[1], DOCS[0]]) + "\n\nQuestion: q2\nAnswer:"
    request = Request(prompt=swapped, params=greedy(4), documents=document_spans(swapped, DOCS[:2]))
    events = run_all(engine, [request])[request.request_id]
    assert engine.doc_cache.injected_segments == 2  # both documents, the one at the hit's end too
    tokens = lambda text: len(engine.tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    assert events[-1].usage.cached_tokens >= tokens(header) + tokens(DOCS[1]) + tokens(DOCS[0])
    engine.blocks.check_invariants()


def test_every_family_reuses_document_kv_exactly_in_place_and_rerotated_per_layer(tiny_family_dir):
    """Qwen3, Qwen3-MoE and Gemma 3: a document reused at its own position gives a full prefill's tokens; moved, its
    layer-0 keys equal those computed at the new position, each layer by its own RoPE (Gemma 3's first layer is a
    sliding one, with its own 10k base beside the full layers' 1M). Gemma 4 (layers of two shapes) and Qwen3.5 (a
    DeltaNet state is not position-independent) run without it, and resolve says why."""
    engine = make_engine(tiny_family_dir)
    name = read_config(tiny_family_dir).family
    if family(name).document_cache_why:
        from inferplug.profile_schema import Cache
        from inferplug.rag_cache_plan import document_cache_why

        assert engine.doc_cache is None
        assert f"does not take a {name} model" in document_cache_why(Cache(rag_document_cache=True), name)
        default = document_cache_why(Cache(), name)  # the default says why too, not how to opt in
        assert f"does not take a {name} model" in default and "opts in" not in default
        return
    run_all(engine, [_request("Who eats berries?", DOCS, "a")])
    second = _request("Who sings songs?", DOCS, "b")
    events = run_all(engine, [second])[second.request_id]
    assert engine.doc_cache.injected_segments == len(DOCS)
    assert tokens_of(events) == _fresh_tokens(tiny_family_dir, _request("Who sings songs?", DOCS, "b"))

    full = make_engine(tiny_family_dir)
    run_all(full, [_request("q2", [DOCS[2], DOCS[1]], "b, with a longer first line")])
    key = next(k for k in set(engine.doc_cache.entries) & set(full.doc_cache.entries))
    old, new = engine.doc_cache.entries[key], full.doc_cache.entries[key]
    delta = new.position - old.position
    moved = rerotate(old.k[0], delta, *engine.runner.model.rope_of(0))
    error = ((moved - new.k[0]).norm() / new.k[0].norm()).item()
    assert error <= (old.position + new.position + abs(delta) + 4) * 2**-24, error
    engine.blocks.check_invariants()
