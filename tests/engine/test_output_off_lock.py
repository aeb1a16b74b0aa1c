"""The output stage (detokenizing, stop strings) runs after the engine's step, off its lock, and answers as the
engine's synchronous step does; a stop string it finds still ends the request with its blocks back in the pool."""

from __future__ import annotations

import pytest

from inferplug.backends.async_engine import AsyncEngine
from inferplug.stages.detokenizer import IncrementalDetokenizer
from inferplug.types import Request
from tests.engine.engine_helpers import greedy, make_engine, prompts_of, run_all


@pytest.fixture
def async_engine(tiny_llama_dir):
    engine = AsyncEngine(make_engine(tiny_llama_dir))
    yield engine
    engine.close()


async def test_a_stop_string_found_off_the_lock_answers_as_the_sync_step_with_its_blocks_back(
        tiny_llama_dir, async_engine, monkeypatch):
    prompt = prompts_of([12], seed=5)[0]
    reference = make_engine(tiny_llama_dir)
    free = run_all(reference, [Request(prompt=prompt, params=greedy(24), request_id="free")])["free"]
    text = "".join(e.text for e in free)
    assert len(text) >= 12
    stop = text[6:9]
    expected = run_all(reference, [Request(prompt=prompt, params=greedy(24, stop=[stop]), request_id="cut")])["cut"]

    locked_while_decoding = []
    add = IncrementalDetokenizer.add

    def watched(self, token_id):
        locked_while_decoding.append(async_engine._lock.locked())
        return add(self, token_id)

    monkeypatch.setattr(IncrementalDetokenizer, "add", watched)
    events, used_at_the_end = [], None
    async for event in async_engine.generate(Request(prompt=prompt, params=greedy(24, stop=[stop]), request_id="c")):
        events.append(event)
        if event.usage is not None:
            used_at_the_end = async_engine.stats()["kv_blocks_used"]
    assert locked_while_decoding and not any(locked_while_decoding)
    last, want = events[-1], expected[-1]
    assert (last.finish_reason, last.stop_reason) == ("stop", stop) == (want.finish_reason, want.stop_reason)
    assert "".join(e.text for e in events) == "".join(e.text for e in expected)
    assert last.usage.completion_tokens == want.usage.completion_tokens < 24
    assert used_at_the_end == 0
