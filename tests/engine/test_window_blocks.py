"""The sliding-window layers' own KV blocks (engine/window_blocks.py): a sequence holds only its window's blocks in
them, and every token comes out bit for bit as with whole-context pools (the document cache keeps those), through
the C++ kernels and the torch path, prefix hits, n > 1, beam search, speculation and preemption; the window group's
prefix hits reach back a window or are cut."""

from __future__ import annotations

import pytest

from inferplug.engine.block_manager import BlockManager
from inferplug.engine.cache_aware import CacheAwareOrder
from inferplug.engine.sequence import Sequence
from inferplug.engine.window_blocks import WindowBlocks
from inferplug.models.config import window_pool_blocks
from inferplug.types import Request, SamplingParams
from tests.conftest import GEMMA3_TINY_WINDOW, GPT_OSS_TINY_WINDOW, _save_tiny
from tests.engine.engine_helpers import (greedy, logprob_trace, make_engine, prompts_of, run_all, spy_fused_steps,
                                         unfuse_steps)


@pytest.fixture(scope="module", params=["gemma3", "gpt_oss"])
def windowed_dir(request, tmp_path_factory):
    return _save_tiny(request.param, tmp_path_factory.mktemp(f"tiny-{request.param}"))


def _pair(model_dir, **overrides):
    """An engine whose sliding-window layers keep their own blocks, and one whose keep the whole context (the
    document cache on)."""
    common = {"block_size": 4, "max_num_batched_tokens": 32, **overrides}
    return make_engine(model_dir, rag_document_cache=False, **common), make_engine(model_dir, **common)


def _requests(lengths, seed, max_tokens=24):
    return [Request(prompt=p, request_id=str(i), params=greedy(max_tokens, logprobs=1))
            for i, p in enumerate(prompts_of(lengths, vocab=260, seed=seed))]


def _assert_close(got, want, requests):
    """The same tokens, their logprobs within 1e-5 (torch's and Triton's attention sum a different number of zero
    terms when a row reads the null block or a pad)."""
    for r in requests:
        trace, reference = logprob_trace(got[r.request_id]), logprob_trace(want[r.request_id])
        assert [t[0] for t in trace] == [t[0] for t in reference], r.request_id
        assert [t[1] for t in trace] == pytest.approx([t[1] for t in reference], abs=1e-5), r.request_id


@pytest.mark.parametrize("weight_format", [None, "fp16"])
def test_tokens_equal_whole_context_pools(windowed_dir, weight_format, cpu_kernel_ops):
    """Prompts of 3 to 90 tokens (past the window: chunks of 32 rows, then decode steps), batched."""
    own, whole = _pair(windowed_dir, weight_format=weight_format)
    assert own.blocks.window is not None and whole.blocks.window is None
    requests = _requests([3, 40, 90, 17], seed=1)
    got, want = run_all(own, requests), run_all(whole, requests)
    for r in requests:
        assert logprob_trace(got[r.request_id]) == logprob_trace(want[r.request_id]), r.request_id


def test_fused_decode_reads_the_window_pools(tmp_path_factory, cpu_kernel_ops, monkeypatch):
    """Gemma 3 in Q8_0 blocks: decode steps take decode_layers' one call, which stores and reads the windowed
    layers' K/V through their own slots and tables; the same bits as the layer-by-layer path, and as whole pools."""
    model_dir = _save_tiny("gemma3", tmp_path_factory.mktemp("tiny-gemma3-q8"))
    own, whole = _pair(model_dir, weight_format="int8")
    requests = _requests([60, 5, 33], seed=6)
    fused_steps = spy_fused_steps(monkeypatch)
    got = run_all(own, requests)
    assert any(fused_steps)
    want = run_all(whole, requests)
    unfuse_steps(monkeypatch)
    layered = run_all(make_engine(model_dir, rag_document_cache=False, block_size=4, max_num_batched_tokens=32,
                                  weight_format="int8"), requests)
    for r in requests:
        assert logprob_trace(got[r.request_id]) == logprob_trace(want[r.request_id]), r.request_id
        assert logprob_trace(got[r.request_id]) == logprob_trace(layered[r.request_id]), r.request_id


def test_torch_path_equals_whole_context_pools(windowed_dir):
    """The torch attention path gathers the null block behind the window and masks it."""
    own, whole = _pair(windowed_dir, attention="torch")
    requests = _requests([50, 9], seed=2)
    got, want = run_all(own, requests), run_all(whole, requests)
    _assert_close(got, want, requests)


def test_triton_path_equals_whole_context_pools(tmp_path_factory):
    """Triton's decode and prefill kernels (in its interpreter) skip the tiles before a row's window: the null
    block is never read."""
    model_dir = _save_tiny("gemma3", tmp_path_factory.mktemp("tiny-gemma3-triton"))
    own, whole = _pair(model_dir, attention="triton")
    assert own.runner.model.ops.name == "triton"
    requests = _requests([45, 6], seed=7, max_tokens=8)
    got, want = run_all(own, requests), run_all(whole, requests)
    _assert_close(got, want, requests)


def test_a_sequence_holds_only_its_window(windowed_dir):
    own, _ = _pair(windowed_dir)
    window = own.model_config.kv_window()
    assert window in (GEMMA3_TINY_WINDOW, GPT_OSS_TINY_WINDOW)
    own.add_request(Request(prompt=prompts_of([120], vocab=260, seed=3)[0], request_id="long", params=greedy(40)))
    most = 0
    while own.has_unfinished():
        own.step()
        for seq in own.scheduler.running:
            held = [b for b in seq.window_table if b != own.blocks.window.null]
            most = max(most, len(held))
            assert len(seq.window_table) == len(seq.block_table)
            # after a step: the window and one token more, straddling one block more, and the next row's block
            assert len(held) <= -(-(window + 1) // 4) + 2, (seq.num_computed_tokens, seq.window_table)
    assert most > 0
    assert own.blocks.window.num_blocks == window_pool_blocks(window, 4, own.config.max_num_seqs, 32, 128)


def test_prefix_hit_continues_the_window(windowed_dir):
    """A repeated prompt is served from the prefix cache in both groups, with the same tokens as computed afresh;
    a second choice (n = 2) shares the first one's prompt. fp16 weights: the C++ kernels give a row the same bits
    however its prompt was chunked (a hit computes its last 2 rows alone, a cold prefill its last 6)."""
    own, whole = _pair(windowed_dir, weight_format="fp16")
    prompt = prompts_of([70], vocab=260, seed=4)[0]
    first = run_all(own, [Request(prompt=prompt, request_id="a", params=greedy(12, logprobs=1))])
    again = run_all(own, [Request(prompt=prompt, request_id="b", params=greedy(12, logprobs=1))])
    assert own.stats()["prefix_hit_tokens"] >= 64
    assert logprob_trace(again["b"]) == logprob_trace(first["a"])
    assert logprob_trace(first["a"]) == logprob_trace(
        run_all(whole, [Request(prompt=prompt, request_id="c", params=greedy(12, logprobs=1))])["c"])
    seeded = SamplingParams(temperature=0.8, max_tokens=10, n=2, seed=7, ignore_eos=True)
    two = run_all(own, [Request(prompt=prompt + prompt[:9], request_id="n", params=seeded)])
    reference = run_all(whole, [Request(prompt=prompt + prompt[:9], request_id="n", params=seeded)])
    assert [e.token_ids for e in two["n"]] == [e.token_ids for e in reference["n"]]


def test_preemption_and_speculation(windowed_dir, cpu_kernel_ops):
    """A pool too small for every request at once preempts; prompt-lookup proposals are checked and rolled back.
    fp16 weights: the C++ kernels give a row the same bits in any step."""
    spec = {"weight_format": "fp16", "speculative_method": "ngram", "num_speculative_tokens": 4}
    own, whole = _pair(windowed_dir, num_kv_blocks=48, **spec)
    phrases = prompts_of([5, 9, 3, 12], vocab=260, seed=5)
    requests = [Request(prompt=p * 6, request_id=str(i), params=greedy(30, logprobs=1)) for i, p in enumerate(phrases)]
    got, want = run_all(own, requests), run_all(whole, requests)
    assert own.stats()["spec_draft_tokens"] > 0 and own.scheduler.num_preemptions > 0
    for r in requests:
        assert logprob_trace(got[r.request_id]) == logprob_trace(want[r.request_id]), r.request_id


def test_a_mixed_load_equals_whole_context_pools(tmp_path_factory, monkeypatch):
    """Twelve requests of random lengths arriving over the first steps, some of them n = 2 sampled with a seed,
    some repeating an earlier prompt (prefix hits), in a pool small enough to preempt: each one's tokens and logprobs
    equal whole pools', and both groups' invariants hold after every step. fp16 weights: a row's bits do not depend
    on its step."""
    import random

    from inferplug.engine.llm_engine import LLMEngine

    model_dir = _save_tiny("gemma3", tmp_path_factory.mktemp("tiny-gemma3-mixed"))
    rng = random.Random(11)
    prompts = prompts_of([rng.randint(1, 100) for _ in range(8)], vocab=260, seed=12)
    prompts += [prompts[rng.randrange(8)] + prompts_of([rng.randint(1, 9)], vocab=260, seed=13 + i)[0]
                for i in range(4)]
    arrivals: dict[int, list[Request]] = {}
    for i, prompt in enumerate(prompts):
        n = 2 if i % 3 == 0 else 1
        params = SamplingParams(temperature=0.9 if n > 1 else 0.0, n=n, seed=i, max_tokens=rng.randint(1, 30),
                                ignore_eos=True, logprobs=1)
        arrivals.setdefault(rng.randrange(6), []).append(Request(prompt=prompt, request_id=str(i), params=params))
    step = LLMEngine.step

    def checked_step(self):
        out = step(self)
        self.blocks.check_invariants()
        return out

    monkeypatch.setattr(LLMEngine, "step", checked_step)
    own, whole = _pair(model_dir, num_kv_blocks=40, weight_format="fp16", max_num_seqs=6)
    got, want = run_all(own, [], arrivals), run_all(whole, [], arrivals)
    assert own.stats()["preemptions"] > 0 and own.stats()["prefix_hit_tokens"] > 0
    assert set(got) == set(want) == {str(i) for i in range(12)}
    for rid in want:
        assert [(e.index, e.token_ids, [(lp.token_id, lp.logprob) for lp in e.logprobs]) for e in got[rid]] == \
            [(e.index, e.token_ids, [(lp.token_id, lp.logprob) for lp in e.logprobs]) for e in want[rid]], rid


def _seq(tokens: int) -> Sequence:
    return Sequence("r", 0, list(range(1, tokens + 1)), SamplingParams(max_tokens=4), max_tokens=4)


def _computed(seqs: int, step_tokens: int) -> tuple[BlockManager, Sequence]:
    """Blocks of 4 tokens, a window of 8, and a sequence whose 20 tokens are computed and committed."""
    blocks = BlockManager(32, 4, window=WindowBlocks(window_pool_blocks(8, 4, seqs, step_tokens, 32), 4, 8, True))
    seq = _seq(20)
    assert blocks.allocate(seq, 20)
    seq.num_computed_tokens = 20
    blocks.commit(seq)
    return blocks, seq


def test_blocks_behind_the_window_return_and_stay_cached():
    blocks, seq = _computed(2, 16)
    # the next row is at 20: it keeps 12.. (a rewind's row 19 reads from 12), blocks 3 and 4
    assert seq.window_table[:3] == [0, 0, 0] and 0 not in seq.window_table[3:]
    assert blocks.window.num_free == blocks.window.num_blocks - 1 - 2
    blocks.check_invariants()
    other = _seq(20)
    hits = blocks.lookup_prefix(other)  # blocks 0..3 of the block table (the last token stays to compute)
    assert len(hits) == 4
    # block 0..3's window blocks are still cached (freed, not evicted): the whole hit is usable
    assert blocks.window.usable(other, hits) == hits
    assert blocks.allocate(other, 20, hits)
    # null to block 2 (its first row is 16), block 2 revived from the cache, block 3 shared with seq
    assert other.window_table[:2] == [0, 0] and other.window_table[2] != 0
    assert other.window_table[3] == seq.window_table[3] and blocks.window.ref_counts[seq.window_table[3]] == 2
    blocks.check_invariants()
    blocks.release(seq)
    blocks.release(other)
    blocks.check_invariants()
    assert blocks.window.num_free == blocks.window.num_blocks - 1


def test_a_hit_is_cut_where_the_window_is_gone():
    blocks, seq = _computed(1, 4)
    blocks.release(seq)
    for key in seq.block_hashes[1:3]:  # evict window blocks 1 and 2, as new allocations would
        blocks.window.block_keys[blocks.window.cached.pop(key)] = None
    other = _seq(20)
    hits = blocks.lookup_prefix(other)
    assert len(hits) == 4
    # a hit of 4 blocks needs window blocks 2..3 (block 2 is gone); of 1 block, block 0 (kept): 1 block usable
    assert blocks.window.usable(other, hits) == hits[:1]
    # cache-aware admission counts the hit admission would take: 4 tokens cached, 16 to compute
    assert CacheAwareOrder(blocks, None, 16, 0)._cost(other) == (16, 4)
