"""The one sync/async bridge: events from a producer thread to a consuming thread or coroutine."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from inferplug.backends.bridge import EventChannel, consume_all_sync, consume_async, consume_sync
from inferplug.errors import RequestError


def test_everything_sent_before_a_look_comes_in_one_take_and_in_order():
    woken: list[EventChannel] = []
    channel = EventChannel(woken.append)
    for i in range(5):
        channel.send([i])
    assert woken == [channel] and channel._take() == ([0, 1, 2, 3, 4], False)  # one wake-up for five sends
    channel.send([5, 6], last=True)
    assert woken == [channel, channel] and channel._take() == ([5, 6], True)  # woken again after a take


def test_a_sync_consumer_gets_every_event_and_an_ended_stream_is_not_cancelled():
    def submit(channel: EventChannel) -> None:
        channel.send([1, 2])
        channel.send([3], last=True)

    assert list(consume_sync(submit, cancel=lambda: pytest.fail("an ended stream is not cancelled"))) == [1, 2, 3]


def test_at_end_wakes_the_consumer_only_when_the_request_ends():
    woken: list[EventChannel] = []
    channel = EventChannel(woken.append, at_end=True)
    channel.send([1])
    channel.send([2])
    assert woken == []
    channel.send([3], last=True)
    assert woken == [channel] and channel._take() == ([1, 2, 3], True)
    channel.send([4])  # after the end: dropped
    assert channel._take() == ([], True)


def test_an_exception_is_raised_in_the_consumer_and_nothing_is_cancelled():
    cancelled = []
    stream = consume_sync(lambda ch: ch.send([RequestError("bad request", param="prompt")], last=True),
                          cancel=lambda: cancelled.append(True))
    with pytest.raises(RequestError, match="bad request"):
        next(stream)
    assert cancelled == []


def test_leaving_early_cancels_once():
    cancelled = []
    stream = consume_sync(lambda ch: ch.send([1, 2]), cancel=lambda: cancelled.append(True))
    assert next(stream) == 1
    stream.close()
    assert cancelled == [True]


def test_nothing_is_submitted_before_the_first_iteration():
    submitted = []
    consume_sync(submitted.append, cancel=lambda: None)
    assert submitted == []


async def test_a_producer_thread_feeds_a_coroutine_on_its_own_loop():
    started = threading.Event()
    channel_box: list[EventChannel] = []

    def produce() -> None:
        started.wait(30)
        for i in range(50):
            channel_box[0].send([i])
        channel_box[0].send([], last=True)

    def submit(channel: EventChannel) -> None:
        channel_box.append(channel)
        started.set()

    thread = threading.Thread(target=produce)
    thread.start()
    got = [item async for item in consume_async(submit, cancel=lambda: pytest.fail("ended, not cancelled"))]
    thread.join(30)
    assert got == list(range(50))


async def test_an_async_consumer_that_leaves_early_cancels_in_a_worker_thread():
    cancelled_on = []
    stream = consume_async(lambda ch: ch.send([1, 2]), cancel=lambda: cancelled_on.append(threading.current_thread()))
    assert await stream.__anext__() == 1
    await stream.aclose()
    assert len(cancelled_on) == 1 and cancelled_on[0] is not threading.main_thread()
    await asyncio.sleep(0)


def test_consume_all_sync_submits_every_request_before_it_waits_and_raises_where_one_failed():
    channels: list[EventChannel] = []
    answers = [[0, 1], [RequestError("bad")], [20, 21]]

    def submit(channel: EventChannel) -> None:
        channels.append(channel)
        if len(channels) == len(answers):  # a producer that answers only once every request is in
            for ch, answer in zip(channels, answers):
                ch.send(answer, last=True)

    ended = consume_all_sync([submit] * 3, [lambda: pytest.fail("ended streams are not cancelled")] * 3)
    assert list(ended[0]) == [0, 1] and list(ended[2]) == [20, 21]
    with pytest.raises(RequestError, match="bad"):
        list(ended[1])


def staged_producer(tokens: list[int], stop_at: int | None, cancelled: list[bool]):
    """submit for a producer thread that sends raw tokens one send each, then ends; its stage, run by the consumer,
    tags each with the consumer's thread and ends the request at `stop_at` (a stop string, say)."""
    def stage(items: list[int]) -> tuple[list, bool]:
        return [(threading.get_ident(), item) for item in items], stop_at in items

    def submit(channel: EventChannel) -> None:
        channel.read_with(stage, early=stop_at is not None)

        def produce() -> None:
            for token in tokens:
                if cancelled:
                    return
                channel.send([token])
                time.sleep(0.001)
            channel.send([], last=True)
        threading.Thread(target=produce, daemon=True).start()
    return submit


def test_a_stage_runs_on_the_consumer_and_a_request_it_ends_first_is_cancelled():
    cancelled: list[bool] = []
    events = list(consume_sync(staged_producer(list(range(500)), 3, cancelled), lambda: cancelled.append(True),
                               at_end=True))  # early: woken for each send, at_end or not
    assert {thread for thread, _ in events} == {threading.get_ident()}
    assert [token for _, token in events][:4] == [0, 1, 2, 3] and len(events) < 500 and cancelled == [True]


def test_consume_all_sync_reads_each_staged_channel_until_it_ends():
    never = [lambda: pytest.fail("ended streams are not cancelled")] * 2
    done = consume_all_sync([staged_producer([1, 2, 3], None, []), staged_producer([7, 8], 99, [])], never)
    assert [[token for _, token in events] for events in done] == [[1, 2, 3], [7, 8]]  # the second woken for each send


def test_consume_all_sync_reads_a_later_request_as_it_comes_while_an_earlier_one_runs():
    """The batch waits for whichever channel has news: the second request's stop string is acted on when its token
    comes, not once the first request (300 tokens) has ended."""
    first_sent: list[int] = []
    found_after: list[int] = []  # how many tokens the first had sent when the second's stage found its stop

    def produce(channel: EventChannel, tokens: int, log: list[int] | None = None) -> None:
        def run() -> None:
            for token in range(tokens):
                if log is not None:
                    log.append(token)
                channel.send([token])
                time.sleep(0.002)
            channel.send([], last=True)
        threading.Thread(target=run, daemon=True).start()

    def stage(items: list[int]) -> tuple[list[int], bool]:
        if 3 in items:
            found_after.append(len(first_sent))
        return items, 3 in items

    def stopping(channel: EventChannel) -> None:
        channel.read_with(stage, early=True)
        produce(channel, 10)

    done = consume_all_sync([lambda channel: produce(channel, 300, first_sent), stopping], [lambda: None] * 2)
    assert done[0] == list(range(300)) and done[1][:4] == [0, 1, 2, 3]
    assert found_after and found_after[0] < 100


def test_a_fault_in_a_stage_fails_its_request_alone_and_cancels_it():
    def faulty(channel: EventChannel) -> None:
        channel.read_with(lambda items: 1 / 0, early=True)  # woken for the send: the producer has not ended
        channel.send([1])

    cancelled: list[str] = []
    done = consume_all_sync([faulty, staged_producer([4, 5], None, [])],
                            [lambda: cancelled.append("faulty"), lambda: pytest.fail("it ended: not cancelled")])
    with pytest.raises(ZeroDivisionError):
        list(done[0])
    assert [token for _, token in done[1]] == [4, 5] and cancelled == ["faulty"]


def test_a_batch_of_requests_runs_on_the_native_engine_over_the_bridge_as_each_alone(tiny_profile):
    """generate_all (InferPlugLLM's batch) takes the bridge's sync path, as ChatInferPlug does: same answers."""
    from inferplug.backends.registry import get_backend
    from inferplug.frontend.calls import collect, generate_all
    from inferplug.types import Request, SamplingParams

    backend = get_backend(tiny_profile)
    requests = [Request(prompt=p, params=SamplingParams(temperature=0, max_tokens=6)) for p in ("hi", "the cat", "ok")]
    alone = [collect(backend.stream_sync(Request(prompt=r.prompt, params=r.params))).token_ids for r in requests]
    assert [r.token_ids for r in generate_all(backend, requests)] == alone
    bad = Request(prompt=[10**6], params=SamplingParams(max_tokens=2))
    with pytest.raises(RequestError, match="outside the vocabulary"):
        generate_all(backend, [requests[0], bad])
    assert backend.stats()["kv_blocks_used"] == 0


def test_a_timeout_cancels_a_request_that_sends_nothing_and_raises():
    """The consumer waits no longer than its timeout, even for a producer that never sends."""
    from inferplug.errors import GenerationError

    cancelled = []
    stream = consume_sync(lambda ch: None, cancel=lambda: cancelled.append(True), at_end=True, timeout=0.05)
    with pytest.raises(GenerationError, match="timeout=0.05s"):
        next(stream)
    assert cancelled == [True]


async def test_an_async_timeout_cancels_a_request_that_sends_nothing_and_raises():
    from inferplug.errors import GenerationError

    cancelled = []
    stream = consume_async(lambda ch: ch.send([1]), cancel=lambda: cancelled.append(True), timeout=0.05)
    assert await stream.__anext__() == 1  # what came in time comes
    with pytest.raises(GenerationError, match="timeout=0.05s"):
        await stream.__anext__()
    assert cancelled == [True]


def test_a_consumer_slower_than_its_producer_still_times_out():
    """Events keep coming, but the caller's timeout passes between two of its reads: it raises there."""
    import time

    from inferplug.errors import GenerationError

    cancelled, channels = [], []

    def submit(channel: EventChannel) -> None:
        channels.append(channel)
        channel.send([0])

    stream = consume_sync(submit, cancel=lambda: cancelled.append(True), timeout=0.05)
    assert next(stream) == 0
    time.sleep(0.06)  # the slow consumer: past its timeout, with the next event already in
    channels[0].send([1])
    with pytest.raises(GenerationError, match="timeout=0.05s"):
        next(stream)
    assert cancelled == [True]


def test_a_batch_past_its_timeout_cancels_only_those_not_ended_and_raises():
    from inferplug.errors import GenerationError

    cancelled = []
    submits = [lambda ch: ch.send([1], last=True), lambda ch: None]  # the second never answers
    cancels = [lambda: pytest.fail("an ended request is not cancelled"), lambda: cancelled.append(True)]
    with pytest.raises(GenerationError, match="timeout=0.05s"):
        consume_all_sync(submits, cancels, timeout=0.05)
    assert cancelled == [True]


def test_a_chat_invoke_past_its_timeout_is_aborted_with_its_blocks_back(tiny_profile):
    """ChatInferPlug's invoke waits for its finished result (generate_all), and no longer than its timeout."""
    from langchain_inferplug import ChatInferPlug

    from inferplug.errors import GenerationError

    chat = ChatInferPlug(profile=tiny_profile, temperature=0, max_tokens=4)
    assert chat.invoke("hi").usage_metadata["output_tokens"] >= 1
    with pytest.raises(GenerationError, match="timeout=1e-09s"):
        chat.model_copy(update={"timeout": 1e-9}).invoke("hi")
    assert chat.backend.stats()["kv_blocks_used"] == 0
