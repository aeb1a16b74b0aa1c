"""Long prompts on the C++ paged attention kernel (every prefill chunk through it): chunked, after a prefix hit
that ends mid-chunk, and at the context's edge, against HF transformers (fp32)."""

from __future__ import annotations

import pytest
from engine_helpers import greedy, hf_greedy, make_engine, prompts_of, run_all, tokens_of

from inferplug.errors import RequestError
from inferplug.types import Request


def test_long_prompt_in_odd_chunks_and_after_a_prefix_hit_matches_hf(tiny_model_dir):
    prompt = prompts_of([470], seed=11)[0]
    expected = hf_greedy(tiny_model_dir, prompt, 12)
    engine = make_engine(tiny_model_dir, max_num_batched_tokens=37)  # chunks of 37: ending mid-block
    assert tokens_of(run_all(engine, [Request(prompt=prompt, params=greedy(12), request_id="cold")])["cold"]) == expected
    engine = make_engine(tiny_model_dir, max_num_batched_tokens=37)
    run_all(engine, [Request(prompt=prompt[:203] + [9], params=greedy(1), request_id="warm")])  # caches 12 blocks
    hit = run_all(engine, [Request(prompt=prompt, params=greedy(12), request_id="hit")])["hit"]
    assert hit[-1].usage.cached_tokens == 192
    assert tokens_of(hit) == expected


def test_a_prompt_filling_the_context_runs_and_one_over_is_refused(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir, num_kv_blocks=40)  # context: the model's 512 positions
    prompt = prompts_of([512], seed=12)[0]
    full = run_all(engine, [Request(prompt=prompt[:511], params=greedy(1), request_id="full")])["full"]
    assert tokens_of(full) == hf_greedy(tiny_llama_dir, prompt[:511], 1)
    with pytest.raises(RequestError, match="shorten the prompt"):
        engine.add_request(Request(prompt=prompt, params=greedy(1), request_id="over"))
