"""AsyncEngine: concurrent streams, early exit aborts, bad requests fail alone."""

from __future__ import annotations

import asyncio
import threading

import pytest

from inferplug.backends.async_engine import AsyncEngine
from inferplug.errors import BackendUnavailable, RequestError
from inferplug.types import Request
from tests.engine.engine_helpers import greedy, make_engine, prompts_of


@pytest.fixture
def async_engine(tiny_llama_dir):
    engine = AsyncEngine(make_engine(tiny_llama_dir))
    yield engine
    engine.close()


async def _collect(engine: AsyncEngine, request: Request):
    return [event async for event in engine.generate(request)]


async def test_concurrent_streams_and_a_bad_one(async_engine):
    prompts = prompts_of([5, 40, 17], seed=21)
    good = [_collect(async_engine, Request(prompt=p, params=greedy(6), request_id=str(i))) for i, p in enumerate(prompts)]
    bad = _collect(async_engine, Request(prompt=[1, 2], params=greedy(6, stop_token_ids=[10**6]), request_id="bad"))
    results = await asyncio.gather(*good, bad, return_exceptions=True)
    assert isinstance(results[-1], RequestError)
    for events in results[:-1]:
        assert sum(len(e.token_ids) for e in events) == 6
        final = events[-1]
        assert final.finish_reason == "length" and final.usage.completion_tokens == 6
        assert final.timings.ttft is not None and final.timings.ttft >= final.timings.queued


async def test_leaving_a_stream_early_aborts_it(async_engine):
    stream = async_engine.generate(Request(prompt=prompts_of([30])[0], params=greedy(200), request_id="x"))
    async for _ in stream:
        break
    await stream.aclose()
    stats = async_engine.stats()
    assert stats["running"] == 0 and stats["kv_blocks_used"] == 0


async def test_cancelled_while_adding_leaves_no_orphan(async_engine, monkeypatch):
    entered, release, landed = threading.Event(), threading.Event(), []
    add_request = async_engine.engine.add_request

    def held_add(request, *args):  # the add stays in its worker thread until the caller is cancelled
        entered.set()
        release.wait(timeout=30)
        add_request(request, *args)
        landed.append(request.request_id)

    monkeypatch.setattr(async_engine.engine, "add_request", held_add)
    stream = async_engine.generate(Request(prompt=prompts_of([30])[0], params=greedy(200), request_id="c"))
    task = asyncio.ensure_future(stream.__anext__())
    assert await asyncio.to_thread(entered.wait, 30)
    task.cancel()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert landed == ["c"]  # the add did land, mid-cancel, and was aborted
    assert "c" not in async_engine.engine.requests and "c" not in async_engine._streams
    assert async_engine.stats()["kv_blocks_used"] == 0


async def test_close_ends_open_streams_with_backend_unavailable(tiny_llama_dir):
    engine = AsyncEngine(make_engine(tiny_llama_dir))
    stream = engine.generate(Request(prompt=prompts_of([30])[0], params=greedy(400), request_id="open"))
    await stream.__anext__()
    engine.close()
    with pytest.raises(BackendUnavailable, match="closed"):
        async for _ in stream:  # events queued before close may come first
            pass
    with pytest.raises(BackendUnavailable, match="closed"):
        await _collect(engine, Request(prompt=[5, 6], params=greedy(2), request_id="late"))
    assert not engine.engine.has_unfinished() and engine.stats()["kv_blocks_used"] == 0


def test_a_thread_reads_a_stream_without_an_event_loop(async_engine):
    from functools import partial

    from inferplug.backends.bridge import consume_sync

    def stream(request: Request, at_end: bool):
        return consume_sync(partial(async_engine.submit, request), partial(async_engine.abort_now, request.request_id),
                            at_end=at_end)

    prompt = prompts_of([12], seed=4)[0]
    streamed = list(stream(Request(prompt=prompt, params=greedy(8), request_id="s"), at_end=False))
    whole = list(stream(Request(prompt=prompt, params=greedy(8), request_id="w"), at_end=True))
    assert [e.token_ids for e in streamed] == [e.token_ids for e in whole]
    assert whole[-1].usage.completion_tokens == 8
    early = stream(Request(prompt=prompt, params=greedy(300), request_id="e"), at_end=False)
    next(early)
    early.close()  # aborted before close returns: its blocks are back
    assert "e" not in async_engine.engine.requests and async_engine.stats()["kv_blocks_used"] == 0


def test_an_abort_while_a_thread_runs_its_own_prompt_stage_drops_the_request(async_engine, monkeypatch):
    """A caller with no event loop runs the prompt stage itself (AsyncEngine.submit); an abort from another thread
    meanwhile ends its stream "abort", and the request is never added to the engine."""
    from functools import partial

    from inferplug.backends.bridge import consume_sync

    preparing, release = threading.Event(), threading.Event()
    real_prepare = async_engine._prepare

    def slow_prepare(request):
        preparing.set()
        release.wait(10)
        return real_prepare(request)

    monkeypatch.setattr(async_engine, "_prepare", slow_prepare)
    request = Request(prompt=prompts_of([12], seed=5)[0], params=greedy(8), request_id="held")
    events = []
    reader = threading.Thread(target=lambda: events.extend(consume_sync(
        partial(async_engine.submit, request), partial(async_engine.abort_now, request.request_id), at_end=True)))
    reader.start()
    assert preparing.wait(10)
    async_engine.abort_now("held")
    release.set()
    reader.join(10)
    assert [e.finish_reason for e in events] == ["abort"] and not events[-1].usage.completion_tokens
    assert "held" not in async_engine.engine.requests and not async_engine._inbox and not async_engine._open


def test_a_thread_submitting_to_a_closed_engine_gets_backend_unavailable(tiny_llama_dir):
    from functools import partial

    from inferplug.backends.bridge import consume_sync

    engine = AsyncEngine(make_engine(tiny_llama_dir))
    engine.close()
    request = Request(prompt="word " * 10**5, params=greedy(2))  # too long as well: the closed engine is what it is told
    with pytest.raises(BackendUnavailable, match="closed"):
        list(consume_sync(partial(engine.submit, request), partial(engine.abort_now, request.request_id)))
