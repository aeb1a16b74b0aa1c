"""Sampling options, stop conditions, n > 1, abort and bad input on the tiny checkpoints."""

from __future__ import annotations

import pytest

from inferplug.errors import RequestError
from inferplug.types import Request, SamplingParams
from tests.engine.engine_helpers import greedy, make_engine, prompts_of, run_all, text_of, tokens_of

qwen2_only = pytest.mark.parametrize("tiny_model_dir", ["qwen2"], indirect=True)  # the least peaked tiny model


@qwen2_only
def test_same_seed_same_sample_whatever_shares_the_batch(tiny_model_dir):
    engine = make_engine(tiny_model_dir)
    prompt = prompts_of([20], seed=9)[0]
    params = SamplingParams(temperature=1.0, top_k=50, top_p=0.9, seed=1234, max_tokens=16, ignore_eos=True)
    alone = run_all(engine, [Request(prompt=prompt, params=params, request_id="alone")])["alone"]
    crowd = [Request(prompt=p, params=SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True), request_id=f"o{i}")
             for i, p in enumerate(prompts_of([5, 33, 12], seed=4))]
    together = run_all(engine, crowd + [Request(prompt=prompt, params=params, request_id="seeded")])["seeded"]
    assert tokens_of(alone) == tokens_of(together)
    other_seed = SamplingParams(temperature=1.0, top_k=50, top_p=0.9, seed=99, max_tokens=16, ignore_eos=True)
    different = run_all(engine, [Request(prompt=prompt, params=other_seed, request_id="other")])["other"]
    assert tokens_of(different) != tokens_of(alone)


@qwen2_only
def test_n_choices_share_the_prompt_blocks(tiny_model_dir):
    engine = make_engine(tiny_model_dir)
    prompt = prompts_of([40], seed=8)[0]
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=8, ignore_eos=True)
    events = run_all(engine, [Request(prompt=prompt, params=params, request_id="n")])["n"]
    choices = [tokens_of(events, i) for i in range(3)]
    assert all(len(c) == 8 for c in choices)
    assert len({tuple(c) for c in choices}) > 1
    assert engine.blocks.hit_tokens == 2 * 32  # each sibling reused the two full prompt blocks
    assert events[-1].usage.completion_tokens == 24


def test_max_min_tokens_and_stop_token_ids(tiny_model_dir):
    engine = make_engine(tiny_model_dir)
    prompt = prompts_of([10], seed=3)[0]
    free_run = tokens_of(run_all(engine, [Request(prompt=prompt, params=greedy(6), request_id="a")])["a"])
    stop_at = free_run[2]
    params = SamplingParams(temperature=0.0, max_tokens=6, stop_token_ids=[stop_at])
    stopped = run_all(engine, [Request(prompt=prompt, params=params, request_id="b")])["b"]
    assert tokens_of(stopped) == free_run[: free_run.index(stop_at) + 1]
    assert stopped[-1].finish_reason == "stop" and stopped[-1].stop_reason == stop_at
    params = SamplingParams(temperature=0.0, max_tokens=6, min_tokens=6, stop_token_ids=[free_run[0]])
    held = run_all(engine, [Request(prompt=prompt, params=params, request_id="c")])["c"]
    assert len(tokens_of(held)) == 6 and free_run[0] not in tokens_of(held)
    assert held[-1].finish_reason == "length"


@qwen2_only
def test_stop_string_truncates_text(tiny_model_dir):
    engine = make_engine(tiny_model_dir)
    prompt = prompts_of([12], seed=11)[0]
    full = text_of(run_all(engine, [Request(prompt=prompt, params=greedy(12), request_id="a")])["a"])
    stop = full[3:5]
    cut = run_all(engine, [Request(prompt=prompt, params=greedy(12, stop=[stop]), request_id="b")])["b"]
    assert text_of(cut) == full[: full.index(stop)]
    assert cut[-1].stop_reason == stop


def test_abort_frees_blocks_at_once(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir)
    for i, prompt in enumerate(prompts_of([60, 30], seed=12)):
        engine.add_request(Request(prompt=prompt, params=greedy(50), request_id=str(i)))
    for _ in range(3):
        engine.step()
    assert engine.blocks.num_used > 0
    events = engine.abort("0") + engine.abort("1")
    assert [e.finish_reason for e in events] == ["abort", "abort"]
    assert engine.blocks.num_free == engine.blocks.num_blocks and not engine.has_unfinished()


def test_a_request_failing_while_being_added_leaves_nothing_behind(tiny_llama_dir):
    from inferplug.types import DocumentSpan

    engine = make_engine(tiny_llama_dir)
    broken = [DocumentSpan(start=None, end=4, key="k")]  # a malformed RAG hint: planning it raises
    with pytest.raises(TypeError):
        engine.add_request(Request(prompt="hello there world", params=greedy(3), request_id="r", documents=broken))
    assert not engine.has_unfinished() and engine.step() == []
    events = run_all(engine, [Request(prompt="hello there world", params=greedy(3), request_id="r")])
    assert len(tokens_of(events["r"])) == 3  # the id is free again


def test_a_request_the_scheduler_lost_is_failed_not_stepped_forever(tiny_llama_dir):
    from inferplug.engine.request_state import RequestState

    engine = make_engine(tiny_llama_dir)
    lost = RequestState.create(Request(prompt=[5, 6], params=greedy(3), request_id="lost"), [5, 6], 64,
                               engine.tokenizer)
    engine.requests["lost"] = lost  # registered but never scheduled: the shape of the old add_request leak
    (event,) = engine.step()
    assert event.finish_reason == "error" and "lost track" in event.error and not engine.has_unfinished()


def test_prefix_caching_off_computes_every_prompt_and_keeps_the_pool_whole(tiny_llama_dir):
    prompt = prompts_of([70], seed=13)[0]

    def one_after_another(engine):
        return {r: run_all(engine, [Request(prompt=prompt, params=greedy(4, n=2), request_id=r)])[r] for r in "ab"}

    with_cache = one_after_another(make_engine(tiny_llama_dir))
    plain = make_engine(tiny_llama_dir, enable_prefix_caching=False)
    without = one_after_another(plain)
    assert with_cache["b"][-1].usage.cached_tokens > 0
    assert [e.usage.cached_tokens for r in "ab" for e in without[r] if e.usage] == [0, 0]
    assert plain.blocks.cached == {} and plain.stats()["prefix_hit_tokens"] == 0
    for r in "ab":
        for index in (0, 1):
            assert tokens_of(without[r], index) == tokens_of(with_cache[r], index)


BAD = [  # (the request, its sampling options, the param named): a field's own check fails as the params are made
    (dict(prompt=[]), {}, "prompt"),
    (dict(prompt=list(range(3, 3 + 600))), {}, "prompt"),
    (dict(prompt=[5, 6]), dict(max_tokens=0), "max_tokens"),
    (dict(prompt=[5, 6]), dict(temperature=-1.0), "temperature"),
    (dict(prompt=[5, 6]), dict(top_p=1.5), "top_p"),
    (dict(prompt=[5, 6]), dict(stop_token_ids=[10_000]), "stop_token_ids"),
    (dict(prompt=[5, 99_999]), {}, "prompt"),
    (dict(prompt=[5, 6]), dict(json_schema={"type": "object"}, min_tokens=3), "min_tokens"),
]


@pytest.mark.parametrize("bad,options,param", BAD, ids=[p for _, _, p in BAD])
def test_bad_request_fails_alone(tiny_llama_dir, bad, options, param):
    engine = make_engine(tiny_llama_dir)  # context: the model's 512 positions
    good = [Request(prompt=p, params=greedy(5), request_id=f"ok{i}") for i, p in enumerate(prompts_of([7, 19]))]
    engine.add_request(good[0])
    engine.step()
    with pytest.raises(RequestError) as info:
        engine.add_request(Request(**bad, params=SamplingParams(**options), request_id="bad"))
    assert info.value.param == param and str(info.value)
    events = run_all(engine, good[1:])
    events["ok0"] = []
    assert len(tokens_of(events["ok1"])) == 5
