"""Speculative decoding with both proposers (prompt lookup, a draft model): greedy answers (tokens and logprobs,
bit for bit) equal plain greedy's on the kernel path, whatever shares the step, with preemption, stop strings and
quantized weights; both pools (the target's, the draft's) get every block back; the prompt-lookup matches."""

from __future__ import annotations

import pytest

from inferplug.backends.native import load_draft
from inferplug.engine.config import EngineConfig
from inferplug.engine.sequence import Sequence
from inferplug.engine.spec_decode import NgramProposer
from inferplug.profile import ModelSource
from inferplug.types import Request, SamplingParams
from tests.engine.engine_helpers import logprob_trace, make_engine, prompts_of, run_all, text_of, tokens_of

TEXT = ("The quick brown fox jumps over the lazy dog. The lazy dog sleeps while the quick brown fox runs. "
        "Repeat after me: the quick brown fox jumps over the lazy dog.")
METHODS = ["ngram", "draft"]


def _engine(model_dir, method: str | None = None, fmt: str | None = "fp16", draft_dir=None, **overrides):
    """method None: plain decoding; "draft" proposes with the model at draft_dir (quantized like the target)."""
    spec = {"speculative_method": method, "num_speculative_tokens": 4, "ngram_min": 1, "ngram_max": 3} if method else {}
    draft = load_draft(ModelSource(path=draft_dir), EngineConfig()) if method == "draft" else None
    engine = make_engine(model_dir, draft=draft, **{"max_num_batched_tokens": 64, "weight_format": fmt, **spec,
                                                    **overrides})
    if not getattr(engine.runner.model.ops, "paged_kernel", False):
        pytest.skip("the CPU kernels cannot run here: the torch path is not batch-invariant")
    return engine


def _repetitive(vocab: int, seed: int) -> list[list[int]]:
    """16 prompts of mixed lengths, most repeating a phrase (so prompt lookup has something to find)."""
    phrases = prompts_of([5, 9, 3, 12, 7, 4, 20, 6], vocab=vocab, seed=seed)
    prompts = [p * (1 + i % 4) for i, p in enumerate(phrases)]
    return prompts + prompts_of([2, 33, 1, 17, 48, 8, 60, 11], vocab=vocab, seed=seed + 1)


def _requests(prompts, max_tokens=24, **kw) -> list[Request]:
    return [Request(prompt=p, request_id=str(i),
                    params=SamplingParams(temperature=0.0, max_tokens=max_tokens - i % 5, ignore_eos=True, logprobs=1,
                                          **kw))
            for i, p in enumerate(prompts)]


def test_proposer_takes_the_latest_longest_match_and_respects_the_limit():
    proposer = NgramProposer(num_tokens=3, ngram_min=1, ngram_max=2)
    seq = Sequence("r", 0, [1, 2, 3, 4, 9, 2, 3, 5, 6, 7, 2, 3], SamplingParams(), max_tokens=8)
    assert proposer.lookup(seq, limit=8) == [5, 6, 7]  # "2 3" last seen with 3 tokens after it: before 5 6 7
    assert proposer.lookup(seq, limit=2) == [5, 6]
    repeating = Sequence("r", 0, [8, 4, 4, 4, 4, 4], SamplingParams(), max_tokens=8)
    assert proposer.lookup(repeating, limit=8) == [4, 4, 4]  # not the 1 token after the latest "4 4"
    assert proposer.lookup(seq, limit=0) == []
    assert proposer.lookup(Sequence("r", 0, [1, 2, 3, 4], SamplingParams(), max_tokens=8), limit=8) == []


# fp16 with a pool too small for all 16 at once, so the scheduler preempts while sequences speculate. Not the
# block formats: a preempted sequence recomputes its output tokens as prefill rows, which they round apart
# from decode rows (quant/block_linear.py), with or without speculation.
# The draft (tiny_draft_dir) is the tiny Llama's first layer: it agrees with the Llama mostly and with the other
# families rarely, so both accepted runs and rejections are checked.
# The block formats' float prefill rows also round apart where a prompt's chunks end elsewhere (plain decoding
# too: tiny Qwen2 int8 at a 40- vs 64-token budget), and speculation moves the chunk ends: their steps are long
# enough for every prompt to come in one chunk.
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(("fmt", "blocks", "budget"), [("fp16", 20, 64), ("int8", 128, 512), ("int4", 128, 512)])
def test_tiny_greedy_speculation_equals_plain_greedy_in_a_batch_of_16(tiny_model_dir, tiny_draft_dir, method, fmt,
                                                                      blocks, budget):
    prompts = _repetitive(vocab=300, seed=3)
    requests = _requests(prompts)
    plain = run_all(_engine(tiny_model_dir, None, fmt, max_num_batched_tokens=budget), requests)
    engine = _engine(tiny_model_dir, method, fmt, tiny_draft_dir, num_kv_blocks=blocks, max_num_batched_tokens=budget)
    spec = run_all(engine, requests[:6], {2: requests[6:11], 5: requests[11:]})
    assert (engine.scheduler.num_preemptions > 0) == (blocks == 20)
    stats = engine.stats()
    assert stats["spec_accepted_tokens"] > 0 and 0 < stats["spec_acceptance_rate"] <= 1
    for r in requests:
        assert logprob_trace(spec[r.request_id]) == logprob_trace(plain[r.request_id]), f"request {r.request_id}"
    assert sum(spec[r.request_id][-1].usage.accepted_draft_tokens for r in requests) == stats["spec_accepted_tokens"]


def _steps(engine, request) -> list[list[int]]:
    """The tokens each engine step gave the request."""
    engine.add_request(request)
    steps = []
    while engine.has_unfinished():
        tokens = [t for e in engine.step() for t in e.token_ids]
        if tokens:
            steps.append(tokens)
    return steps


@pytest.mark.parametrize("method", METHODS)
def test_pool_invariant_holds_through_rejections_aborts_and_preemption(tiny_llama_dir, tiny_draft_dir, method):
    engine = _engine(tiny_llama_dir, method, draft_dir=tiny_draft_dir, num_kv_blocks=24)
    prompts = _repetitive(vocab=300, seed=5)
    sampled = [Request(prompt=p, request_id=f"t{i}",
                       params=SamplingParams(temperature=1.0, seed=i, max_tokens=30, ignore_eos=True, n=1 + i % 2,
                                             repetition_penalty=1.0 + 0.1 * (i % 3)))
               for i, p in enumerate(prompts)]
    for r in sampled:
        engine.add_request(r)
    step = 0
    while engine.has_unfinished():
        engine.step()
        for pool in engine.kv_pools:
            pool.check_invariants()
        for seq in engine.scheduler.running:  # no slot past the next decode's is held between steps
            assert len(seq.block_table) <= -(-len(seq.token_ids) // engine.blocks.block_size)
        # a draft's pool holds only running sequences' KV, never a block in the prefix cache
        assert all(not pool.cached for pool in engine.kv_pools[1:])
        assert set(getattr(engine.proposer, "shadows", {})) <= set(engine.scheduler.running)
        if step in (3, 7):
            engine.abort(f"t{step}")
        step += 1
    stats = engine.stats()
    assert engine.scheduler.num_preemptions > 0 and stats["spec_draft_tokens"] > stats["spec_accepted_tokens"] > 0


def test_a_draft_keeps_to_the_step_budget_and_a_failed_draft_step_costs_only_speed(tiny_llama_dir, tiny_draft_dir,
                                                                                    monkeypatch):
    requests = _requests(_repetitive(vocab=300, seed=7)[:6])
    plain = run_all(_engine(tiny_llama_dir, None, max_num_batched_tokens=16), requests)
    engine = _engine(tiny_llama_dir, "draft", draft_dir=tiny_draft_dir, max_num_batched_tokens=16)
    forward, rows = engine.proposer.runner.forward, []

    def failing_forward(scheduled):
        rows.append(sum(n for _, n in scheduled))
        if len(rows) in (4, 5):
            raise RuntimeError("the draft model broke")
        return forward(scheduled)

    monkeypatch.setattr(engine.proposer.runner, "forward", failing_forward)
    spec = run_all(engine, requests)
    assert ({rid: logprob_trace(ev) for rid, ev in spec.items()}
            == {rid: logprob_trace(ev) for rid, ev in plain.items()})
    # the shadows catch up on prompts of up to 48 tokens at most 16 tokens a step, as the target prefills them
    assert max(rows) == 16 and engine.stats()["spec_accepted_tokens"] > 0


def test_draft_catch_up_beside_other_streams_keeps_to_the_prefill_cap(tiny_llama_dir, tiny_draft_dir, monkeypatch):
    from inferplug.engine import draft

    budgets = []
    within = draft._within
    monkeypatch.setattr(draft, "_within", lambda scheduled, budget: budgets.append(budget) or within(scheduled, budget))
    requests = _requests(_repetitive(vocab=300, seed=7)[:6])
    plain = run_all(_engine(tiny_llama_dir, None, max_num_batched_tokens=64), requests)
    engine = _engine(tiny_llama_dir, "draft", draft_dir=tiny_draft_dir, max_num_batched_tokens=64,
                     max_prefill_tokens_while_decoding=4)
    spec = run_all(engine, requests)
    assert ({rid: logprob_trace(ev) for rid, ev in spec.items()}
            == {rid: logprob_trace(ev) for rid, ev in plain.items()})
    # several streams decode: a shadow's catch-up takes at most the 4 prefill tokens a step may carry beside them
    assert budgets and set(budgets) == {4}


def test_n_choices_share_the_prompt_blocks(tiny_llama_dir):
    """n = 8 of one long prompt holds its full blocks once (the other choices wait for the first's prompt, then
    take its blocks from the prefix cache); 8 separate requests sent together hold several copies."""
    prompt = prompts_of([16 * 12 + 5], vocab=300, seed=9)[0]
    params = dict(temperature=1.0, seed=1, max_tokens=8, ignore_eos=True)

    def peak_blocks(requests) -> int:
        engine = make_engine(tiny_llama_dir, num_kv_blocks=256, max_num_batched_tokens=512,
                             enable_prefix_caching=True)
        for r in requests:
            engine.add_request(r)
        peak = 0
        while engine.has_unfinished():
            engine.step()
            peak = max(peak, engine.blocks.num_used)
        return peak

    shared = peak_blocks([Request(prompt=prompt, params=SamplingParams(n=8, **params), request_id="n8")])
    separate = peak_blocks([Request(prompt=prompt, params=SamplingParams(**params), request_id=str(i))
                            for i in range(8)])
    assert shared == 12 + 8  # the 12 full prompt blocks once, one tail block per choice
    # separate requests share only once the prefix cache holds the prompt: those admitted together (3 here,
    # in a 512-token step) each compute and hold their own copy
    assert separate >= 2 * 13 + 12 + 6


# the draft here is SmolLM2 itself, so that its proposals are accepted in runs
@pytest.mark.smollm2
@pytest.mark.parametrize("method", METHODS)
def test_smollm2_stop_string_ending_inside_an_accepted_run_ends_the_text_as_plain_decoding(smollm2_gguf, method):
    messages = [{"role": "user", "content": f"Repeat this sentence exactly: {TEXT}"}]
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    engine = _engine(smollm2_gguf, method, draft_dir=smollm2_gguf)
    steps = _steps(engine, Request(messages=messages, params=params, request_id="s"))
    before = next(i for i, s in enumerate(steps) if len(s) >= 3)  # a step that accepted 2+ proposals
    tokens = [t for s in steps[:before] for t in s] + steps[before][:2]  # stop at its 2nd token
    stop = engine.tokenizer.decode(tokens)[-4:]
    assert stop.strip(), "a stop string of visible text"
    stopped = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True, stop=[stop])
    plain = run_all(_engine(smollm2_gguf), [Request(messages=messages, params=stopped, request_id="s")])["s"]
    spec = run_all(engine, [Request(messages=messages, params=stopped, request_id="s")])["s"]
    assert plain[-1].finish_reason == spec[-1].finish_reason == "stop"
    assert text_of(spec) == text_of(plain) and not text_of(spec).endswith(stop)
    assert spec[-1].usage.completion_tokens == plain[-1].usage.completion_tokens


@pytest.mark.smollm2
@pytest.mark.parametrize("method", METHODS)
def test_smollm2_greedy_speculation_equals_plain_greedy_for_16_mixed_requests(smollm2_gguf, smollm2_layer_skip_draft,
                                                                              method):
    """The default profile's path (fp16 weights, the Q8_0 head, the kernels) on the real model; the draft is
    SmolLM2's first 4 layers, whose proposals are mostly rejected (so the draft's KV rolls back often)."""
    tokenizer = _engine(smollm2_gguf).tokenizer
    chats = [[{"role": "user", "content": TEXT[: 40 + 9 * i] + " Repeat it exactly."}] for i in range(8)]
    prompts = [tokenizer.encode(tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False),
                                add_special_tokens=False) for c in chats]
    prompts += prompts_of([3, 70, 17, 40, 9, 33, 55, 5], vocab=49152, seed=7)
    requests = _requests(prompts, max_tokens=32)
    plain = run_all(_engine(smollm2_gguf), requests)
    engine = _engine(smollm2_gguf, method, draft_dir=smollm2_layer_skip_draft, num_kv_blocks=48)
    spec = run_all(engine, requests[:8], {2: requests[8:]})
    stats = engine.stats()
    assert stats["spec_draft_tokens"] > stats["spec_accepted_tokens"] > 0
    for r in requests:
        assert tokens_of(spec[r.request_id]) == tokens_of(plain[r.request_id]), f"request {r.request_id}"
        assert logprob_trace(spec[r.request_id]) == logprob_trace(plain[r.request_id]), f"request {r.request_id}"
