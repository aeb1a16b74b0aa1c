"""Long prompts on the C++ paged attention kernel (every prefill chunk through it): chunked, after a prefix hit
that ends mid-chunk, and at the context's edge, against HF transformers (fp32)."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferplug.errors import RequestError
from inferplug.types import Request, SamplingParams
from tests.engine.engine_helpers import greedy, hf_greedy, make_engine, prompts_of, run_all, tokens_of


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


LONG_TEXT = Path(__file__).resolve().parents[2] / "bench" / "data" / "perplexity_text.md"  # ~2,700 tokens of docs


@pytest.mark.smollm2
@pytest.mark.slow
def test_smollm2_long_prompt_chunked_and_after_a_prefix_hit_matches_hf(smollm2_gguf):
    """A ~2,800-token chat prompt in 256-token chunks through the paged attention kernel (fp32), then another
    question on the same text, its prefix from the cache: greedy tokens equal HF transformers' (fp32)."""
    import torch
    import transformers

    engine = make_engine(smollm2_gguf, max_num_batched_tokens=256, num_kv_blocks=400)
    text = LONG_TEXT.read_text()
    prompts = [engine.encode(Request(messages=[{"role": "user", "content": f"{text}\n\n{question}"}]))[0]
               for question in ("What is a profile?", "Which file holds the schema?")]
    assert len(prompts[0]) > 2500
    params = SamplingParams(temperature=0.0, max_tokens=8)  # stops at EOS, as HF generate does
    first = run_all(engine, [Request(prompt=prompts[0], params=params, request_id="cold")])["cold"]
    hit = run_all(engine, [Request(prompt=prompts[1], params=params, request_id="hit")])["hit"]
    assert hit[-1].usage.cached_tokens >= len(prompts[0]) - 32

    hf = transformers.AutoModelForCausalLM.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name,
                                                           dtype=torch.float32).eval()
    for events, prompt in ((first, prompts[0]), (hit, prompts[1])):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)
        assert tokens_of(events) == ref[0, len(prompt):].tolist()
