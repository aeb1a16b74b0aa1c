"""Beam search against transformers' generate(num_beams=k): the top beam and its score, on the tiny Llama (fp32)."""

from __future__ import annotations

import pytest
import torch

from inferplug.types import Request, SamplingParams
from tests.engine.engine_helpers import greedy, hf_model, make_engine, prompts_of, run_all, tokens_of


def beam(width: int, max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(use_beam_search=True, beam_width=width, max_tokens=max_tokens, **kw)


def hf_beam(model, prompt: list[int], params: SamplingParams, stop_ids: list[int]) -> tuple[list[int], float]:
    """HF's best beam (its generated tokens) and its score (sequences_scores)."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), num_beams=params.beam_width, do_sample=False,
                             max_new_tokens=params.max_tokens, length_penalty=params.length_penalty,
                             early_stopping=params.early_stopping, eos_token_id=stop_ids or None, pad_token_id=0,
                             return_dict_in_generate=True, output_scores=True)
    return out.sequences[0, len(prompt):].tolist(), float(out.sequences_scores[0])


def last_event(events):
    return [e for e in events if e.finish_reason is not None][-1]


@pytest.mark.parametrize(("width", "length_penalty", "early_stopping"),
                         [(2, 1.0, True), (3, 1.0, False), (4, 0.0, True), (4, 2.0, "never"), (5, -0.5, False)])
def test_top_beam_matches_hf(tiny_llama_dir, width, length_penalty, early_stopping):
    engine = make_engine(tiny_llama_dir, block_size=4)
    prompts = prompts_of([5, 9, 14], seed=3)
    # two frequent tokens of greedy's answers end beams (HF: extra EOS ids), so hypotheses finish at many lengths
    plain = run_all(engine, [Request(prompt=p, params=greedy(12), request_id=str(i)) for i, p in enumerate(prompts)])
    stops = sorted({tokens_of(plain[str(i)])[j] for i in range(3) for j in (3, 7)})[:2]
    params = beam(width, 12, length_penalty=length_penalty, early_stopping=early_stopping, ignore_eos=True,
                  stop_token_ids=stops)
    events = run_all(engine, [Request(prompt=p, params=params, request_id=str(i)) for i, p in enumerate(prompts)])
    for i, prompt in enumerate(prompts):
        tokens, score = hf_beam(hf_model(tiny_llama_dir), prompt, params, stops)
        assert tokens_of(events[str(i)]) == tokens, f"prompt {i}"
        assert last_event(events[str(i)]).beam_score == pytest.approx(score, abs=1e-4), f"prompt {i}"


def blocks_held(engine, requests: list[Request], steps: int) -> int:
    """The blocks the requests hold after some steps (then they are aborted)."""
    for request in requests:
        engine.add_request(request)
    for _ in range(steps):
        engine.step()
    held = engine.blocks.num_used
    for request in requests:
        engine.abort(request.request_id)
    return held


def test_beams_share_blocks(tiny_llama_dir):
    """k beams hold their prompt's full blocks once and copy only its last, partial one: 11 shared blocks + 4
    copies of the 12th for a 90-token prompt in blocks of 8, against 4 * 12 for 4 separate requests."""
    prompt = prompts_of([90], seed=5)[0]
    engine = make_engine(tiny_llama_dir, block_size=8, enable_prefix_caching=False)  # no sharing by the cache
    beams = blocks_held(engine, [Request(prompt=prompt, params=beam(4, 6, ignore_eos=True))], steps=3)
    separate = blocks_held(engine, [Request(prompt=prompt, params=greedy(6)) for _ in range(4)], steps=3)
    assert (beams, separate) == (11 + 4, 4 * 12)


def test_beam_search_beside_other_requests_and_preemption(tiny_llama_dir):
    """A pool too small for everything at once preempts beams mid-search; the answers stay HF's, and the beams
    count against max_num_seqs from their admission."""
    prompts = prompts_of([21, 30, 11], seed=7)
    params = beam(3, 10, ignore_eos=True)
    engine = make_engine(tiny_llama_dir, block_size=4, num_kv_blocks=30, max_num_batched_tokens=16, max_num_seqs=10)
    requests = [Request(prompt=p, params=params, request_id=str(i)) for i, p in enumerate(prompts)]
    requests.append(Request(prompt=prompts[0], params=greedy(10), request_id="greedy"))
    running = []
    engine.step = lambda step=engine.step: running.append(len(engine.scheduler.running)) or step()
    events = run_all(engine, requests)
    assert engine.scheduler.num_preemptions > 0 and max(running) == 10
    for i, prompt in enumerate(prompts):
        assert tokens_of(events[str(i)]) == hf_beam(hf_model(tiny_llama_dir), prompt, params, [])[0], f"prompt {i}"


@pytest.mark.smollm2
def test_smollm2_top_beam_matches_hf(smollm2_gguf, hf_smollm2):
    engine = make_engine(smollm2_gguf, max_num_batched_tokens=64)
    questions = ["Translate to French: the cat sleeps.", "Name the largest planet."]
    prompts = [engine.encode(Request(messages=[{"role": "user", "content": q}]))[0] for q in questions]
    params = beam(4, 24, length_penalty=1.0, early_stopping=False)  # ends at EOS, as HF's generation config
    events = run_all(engine, [Request(prompt=p, params=params, request_id=str(i)) for i, p in enumerate(prompts)])
    for i, prompt in enumerate(prompts):
        tokens, score = hf_beam(hf_smollm2, prompt, params, sorted(engine.eos_token_ids))
        assert tokens_of(events[str(i)]) == tokens, f"prompt {i}"
        assert last_event(events[str(i)]).beam_score == pytest.approx(score, abs=1e-4), f"prompt {i}"


@pytest.mark.parametrize(("options", "engine_options", "param"), [
    (dict(beam_width=9), dict(max_num_seqs=8), "beam_width"),
    # a step of 8 tokens cannot hold 12 beams' rows: they would wait for each other forever
    (dict(beam_width=12), dict(max_num_seqs=32, max_num_batched_tokens=8, block_size=8), "beam_width"),
    (dict(beam_width=4, max_tokens=200), dict(num_kv_blocks=40, block_size=16), "beam_width"),  # 4 * 13 > 40
    (dict(), dict(speculative_method="ngram"), "use_beam_search"),
    (dict(n=2), dict(), "n"),
    (dict(logprobs=1), dict(), "logprobs"),
    (dict(beam_width=0), dict(), "beam_width"),
    (dict(early_stopping="sometimes"), dict(), "early_stopping"),
])
def test_bad_beam_requests_fail_alone(tiny_llama_dir, options, engine_options, param):
    from inferplug.errors import RequestError

    engine = make_engine(tiny_llama_dir, **engine_options)
    with pytest.raises(RequestError) as error:
        engine.add_request(Request(prompt=[5, 6, 7], params=SamplingParams(use_beam_search=True, **options)))
    assert error.value.param == param and not engine.has_unfinished()
    events = run_all(engine, [Request(prompt=[5, 6, 7], params=greedy(3), request_id="after")])
    assert len(tokens_of(events["after"])) == 3


def test_the_offline_llm_returns_the_beam_score(tiny_profile, tiny_llama_dir):
    """LLM.generate with use_beam_search: the choice's tokens and beam_score are HF transformers' best beam and
    its sequences_scores on the same tiny model."""
    from inferplug import LLM

    llm = LLM(tiny_profile, num_kv_blocks=32)
    prompt = llm.engine.tokenizer.encode("the weather is")
    params = beam(3, 8, length_penalty=1.0, early_stopping=False)
    ((out,),) = [o.outputs for o in llm.generate([prompt], params)]
    tokens, score = hf_beam(hf_model(tiny_llama_dir), prompt, params, sorted(llm.engine.eos_token_ids))
    assert out.token_ids == tokens and out.beam_score == pytest.approx(score, abs=1e-4)
