"""prompt_logprobs (vLLM's) against HF transformers' logits on the tiny models: each prompt token's logprob given
its prefix and the top-k alternatives, through chunked prefill, beside other requests, and never from the
prefix cache; LLMEngine.prompt_logprob_rows' whole rows (what inferplug/quality.py compares)."""

from __future__ import annotations

import pytest
import torch

from inferplug.errors import RequestError
from inferplug.types import Request, SamplingParams
from tests.engine.engine_helpers import hf_model, make_engine, prompts_of, run_all

TOP = 3


def hf_logprobs(model_dir, prompt: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(hf_model(model_dir)(torch.tensor([prompt])).logits[0].float(), dim=-1)


def check_against_hf(entries, reference: torch.Tensor, prompt: list[int]) -> None:
    assert len(entries) == len(prompt) and entries[0] is None
    for p, entry in enumerate(entries[1:]):
        row = reference[p]
        assert entry.token_id == prompt[p + 1]
        assert entry.logprob == pytest.approx(float(row[prompt[p + 1]]), abs=1e-4)
        values, ids = row.topk(TOP)
        assert [t for t, _, _ in entry.top] == ids.tolist(), f"position {p}"
        assert [lp for _, _, lp in entry.top] == pytest.approx(values.tolist(), abs=1e-4)


def test_prompt_logprobs_match_hf_through_chunked_prefill(tiny_model_dir):
    engine = make_engine(tiny_model_dir, max_num_batched_tokens=16)  # every prompt prefills over several steps
    prompts = prompts_of([37, 5, 60], seed=4)
    params = SamplingParams(temperature=0.0, max_tokens=3, prompt_logprobs=TOP)
    requests = [Request(prompt=prompts[0], params=params, request_id="scored"),
                Request(prompt=prompts[1], params=SamplingParams(temperature=0.0, max_tokens=8), request_id="plain"),
                Request(prompt=prompts[2], params=SamplingParams(temperature=0.0, max_tokens=3, n=2,
                                                                 prompt_logprobs=TOP), request_id="n2")]
    events = run_all(engine, requests[:2], {2: requests[2:]})  # the last arrives while the others decode
    for rid, prompt in (("scored", prompts[0]), ("n2", prompts[2])):
        firsts = [e for e in events[rid] if e.prompt_logprobs is not None]
        assert len(firsts) == 1 and firsts[0].index == 0 and firsts[0].token_ids, rid  # once, on choice 0's first
        check_against_hf(firsts[0].prompt_logprobs, hf_logprobs(tiny_model_dir, prompt), prompt)
    assert all(e.prompt_logprobs is None for e in events["plain"])


def test_a_cached_prompt_is_computed_again_for_its_logprobs(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir, max_num_batched_tokens=64)
    prompt = prompts_of([50], seed=8)[0]
    run_all(engine, [Request(prompt=prompt, params=SamplingParams(temperature=0.0, max_tokens=2), request_id="warm")])
    events = run_all(engine, [Request(prompt=prompt, params=SamplingParams(temperature=0.0, max_tokens=2,
                                                                           prompt_logprobs=TOP), request_id="again")])
    assert events["again"][-1].usage.cached_tokens == 0  # its blocks were cached: it took none of them
    check_against_hf(events["again"][0].prompt_logprobs, hf_logprobs(tiny_llama_dir, prompt), prompt)


def test_prompt_logprob_rows_are_hf_log_softmax(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir, max_num_batched_tokens=32)
    prompt = prompts_of([90], seed=9)[0]
    rows = engine.prompt_logprob_rows(prompt)
    torch.testing.assert_close(rows, hf_logprobs(tiny_llama_dir, prompt)[:-1], atol=1e-4, rtol=0)
    engine.add_request(Request(prompt=prompt, params=SamplingParams(max_tokens=2), request_id="busy"))
    with pytest.raises(RequestError, match="finish or abort"):
        engine.prompt_logprob_rows(prompt)
    engine.abort("busy")


@pytest.mark.parametrize("value", [-1, 21, 1.5])
def test_prompt_logprobs_out_of_range_is_a_request_error(value):
    with pytest.raises(RequestError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=value)
