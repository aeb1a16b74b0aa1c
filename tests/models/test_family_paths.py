"""Every path beyond plain decoding, through each family the model layer brought (Qwen3, Qwen3-MoE, Gemma 3: tiny
random HF checkpoints, fp32): speculative decoding equals plain greedy bit for bit, beam search's top beam and
score equal HF's generate(num_beams=3), guided decoding gives schema-valid JSON, and the server (through the
official openai client) and LangChain's ChatInferPlug give HF's greedy answer. These paths hold no family code; the
tests show that no family difference leaks past the model layer. The speculating, beam and guided engines keep a
sliding-window layer's KV in blocks of its own, as a profile's engine does; plain greedy keeps the whole context. A hybrid family (Qwen3.5: a DeltaNet state per
sequence) refuses speculation and beam search, and says why."""

from __future__ import annotations

import json

import pytest

from inferplug.errors import ProfileError, RequestError
from inferplug.models.loader import read_config
from inferplug.models.registry import family
from inferplug.types import Request, SamplingParams
from tests.engine.engine_helpers import (hf_greedy, hf_model, logprob_trace, make_engine, prompts_of, run_all,
                                         tokens_of)
from tests.engine.test_beam_search import beam, hf_beam, last_event
from tests.server.conftest import start_server

# bounded everywhere: a random model writes an integer's digits until max_tokens
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6}, "ok": {"type": "boolean"},
                                           "kind": {"enum": ["a", "b"]}}, "required": ["name", "ok", "kind"]}


def _engine(model_dir, **overrides):
    """As a profile makes it by default: no document cache, so the sliding-window layers of Gemma 3, gpt-oss and
    Gemma 4 keep only their window's KV, in blocks of their own (engine/window_blocks.py)."""
    return make_engine(model_dir, rag_document_cache=False, **overrides)


def test_prompt_lookup_speculation_equals_plain_greedy(cpu_kernel_ops, tiny_family_dir):
    phrases = prompts_of([5, 9, 3, 12, 7, 30], vocab=260, seed=3)
    requests = [Request(prompt=p * (1 + i % 3), request_id=str(i),
                        params=SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, logprobs=1))
                for i, p in enumerate(phrases)]
    if family(read_config(tiny_family_dir).family).recurrent_why:
        with pytest.raises(ProfileError, match="speculative decoding does not run on qwen35(moe)?: its Gated DeltaNet"):
            make_engine(tiny_family_dir, speculative_method="ngram")
        return
    # fp16 weights: the C++ kernels give a row the same bits in any step (torch's fp32 GEMMs round by row count)
    plain = run_all(make_engine(tiny_family_dir, weight_format="fp16"), requests)
    engine = _engine(tiny_family_dir, weight_format="fp16", speculative_method="ngram", num_speculative_tokens=4,
                         ngram_min=1, ngram_max=3)
    spec = run_all(engine, requests)
    assert engine.stats()["spec_draft_tokens"] > 0
    for r in requests:
        assert logprob_trace(spec[r.request_id]) == logprob_trace(plain[r.request_id]), f"request {r.request_id}"


def test_top_beam_matches_hf(tiny_family_dir):
    engine = _engine(tiny_family_dir, block_size=4)
    prompts = prompts_of([5, 14, 30], vocab=260, seed=4)  # 30 tokens: past the tiny Gemma 3's window of 24
    params = beam(3, 10, ignore_eos=True)
    if family(read_config(tiny_family_dir).family).recurrent_why:
        with pytest.raises(RequestError, match="beam search does not run on this model: its Gated DeltaNet"):
            engine.add_request(Request(prompt=prompts[0], params=params, request_id="0"))
        assert not engine.has_unfinished()
        return
    events = run_all(engine, [Request(prompt=p, params=params, request_id=str(i)) for i, p in enumerate(prompts)])
    for i, prompt in enumerate(prompts):
        tokens, score = hf_beam(hf_model(tiny_family_dir), prompt, params, [])
        assert tokens_of(events[str(i)]) == tokens, f"prompt {i}"
        assert last_event(events[str(i)]).beam_score == pytest.approx(score, abs=1e-4), f"prompt {i}"


def test_guided_json_is_valid_for_the_schema(tiny_family_dir):
    engine = _engine(tiny_family_dir)
    prompts = prompts_of([6, 20], vocab=260, seed=5)
    events = run_all(engine, [Request(prompt=p, request_id=str(i),
                                      params=SamplingParams(temperature=0.0, max_tokens=200, json_schema=SCHEMA))
                              for i, p in enumerate(prompts)])
    for i in range(len(prompts)):
        text = "".join(e.text for e in events[str(i)])
        assert events[str(i)][-1].finish_reason == "stop", text
        value = json.loads(text, strict=False)  # xgrammar lets control characters into strings
        assert set(value) == {"name", "ok", "kind"} and value["kind"] in ("a", "b"), text
        assert isinstance(value["ok"], bool) and len(value["name"]) <= 6


@pytest.fixture(scope="module")
def family_profile(tiny_family_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("profiles") / f"{tiny_family_dir.name}.toml"
    path.write_text(f'name = "family"\nbackend = "native"\ndtype = "float32"\n[model]\npath = "{tiny_family_dir}"\n'
                    'served_name = "family"\n')
    yield str(path)
    from inferplug.backends.registry import close_backend

    close_backend(str(path))


def streamed_text(tokenizer, prompt_ids: list[int], tokens: list[int]) -> str:
    """`tokens` as the engine streams them (stages/detokenizer.py). It equals tokenizer.decode(tokens) but where a
    random model's reply is not UTF-8: a SentencePiece byte-fallback decode (Gemma's) then turns a whole run of byte
    tokens into U+FFFD as soon as one byte is stray, where a stream gives each character that is whole."""
    from inferplug.stages.detokenizer import IncrementalDetokenizer

    detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids, [])
    for token in tokens:
        detokenizer.add(token)
    return detokenizer.delta(final=True)


def test_server_and_langchain_give_hf_greedy_answer(family_profile, tiny_family_dir):
    from langchain_inferplug import ChatInferPlug

    from inferplug.backends.registry import get_backend
    from inferplug.models.loader import load_tokenizer

    messages = [{"role": "user", "content": "hello there, how are you"}]
    tokenizer = load_tokenizer(tiny_family_dir)
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    expected = streamed_text(tokenizer, prompt_ids, hf_greedy(tiny_family_dir, prompt_ids, 12))
    server = start_server(get_backend(family_profile))
    try:
        reply = server.client().chat.completions.create(model="family", messages=messages, temperature=0,
                                                        max_tokens=12, extra_body={"ignore_eos": True})
    finally:
        server.stop()
    assert reply.choices[0].message.content == expected
    chat = ChatInferPlug(profile=family_profile, temperature=0, max_tokens=12)
    assert chat.invoke(messages[0]["content"], ignore_eos=True).content == expected
