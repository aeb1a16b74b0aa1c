"""Beam search through the server (vLLM's use_beam_search), with the official client: the same beam as the
engine's own, on completions (best_of as the width, as vLLM reads it) and chat; refused where it cannot run."""

from __future__ import annotations

import openai
import pytest

from inferplug.types import Request, SamplingParams

BEAMS = dict(use_beam_search=True, length_penalty=0.5, ignore_eos=True)


def engine_beam(native, prompt: list[int], width: int, max_tokens: int) -> list[int]:
    params = SamplingParams(beam_width=width, max_tokens=max_tokens, **BEAMS)
    events = native.run_sync(_collect(native, Request(prompt=prompt, params=params)))
    return [t for e in events for t in e.token_ids]


async def _collect(native, request):
    return [e async for e in native.generate(request)]


def test_completions_and_chat_run_beam_search(native, server_factory):
    client = server_factory(native).client()
    prompt = native.tokenizer.encode("The beams")
    done = client.completions.create(model="tiny", prompt=prompt, max_tokens=8, best_of=3, extra_body=BEAMS)
    assert done.choices[0].text == native.tokenizer.decode(engine_beam(native, prompt, 3, 8))
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=6,
                                          extra_body=BEAMS | {"beam_width": 2})
    assert chat.choices[0].finish_reason == "length" and chat.usage.completion_tokens == 6


def test_beam_search_is_a_400_where_it_cannot_run(native, server_factory, live_server):
    with pytest.raises(openai.BadRequestError, match="ctranslate2 backend does not run beam search"):
        live_server.client().completions.create(model="tiny-llama", prompt="x", extra_body=BEAMS)
    client = server_factory(native).client()
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="tiny", prompt="x", n=2, extra_body=BEAMS)
    assert caught.value.body["param"] == "n"
