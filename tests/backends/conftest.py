"""Fixtures for backend tests: the resolver's plan for a profile built in a test."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def plan_for():
    """profile -> the real resolver's Plan for it on this machine."""
    from inferplug.hardware import probe
    from inferplug.resolver import resolve

    hardware = probe()
    return lambda profile: resolve(profile, hardware)


@pytest.fixture(scope="session")
def abort_midway():
    """backend -> the events of a long greedy request aborted after its second event."""
    from inferplug.types import Request, SamplingParams

    def run(backend, max_tokens: int = 400):
        async def stream():
            request = Request(prompt=[4, 5, 6], params=SamplingParams(temperature=0, max_tokens=max_tokens,
                                                                       ignore_eos=True))
            seen = []
            async for event in backend.generate(request):
                seen.append(event)
                if len(seen) == 2:
                    await backend.abort(request.request_id)
            return seen

        events = backend.run_sync(stream())
        assert events[-1].finish_reason == "abort" and len(events) < max_tokens
        return events

    return run


@pytest.fixture
def close_midway():
    """backend -> the id of a long greedy request that was decoding when the backend closed; checks that it ended
    with BackendUnavailable, that a request sent after close is refused, and that a cancel after close returns."""
    from inferplug.errors import BackendUnavailable
    from inferplug.types import Request, SamplingParams

    def run(backend) -> str:
        long = Request(prompt="the weather", params=SamplingParams(temperature=0, max_tokens=400, ignore_eos=True))
        stream = backend.stream_sync(long)
        next(stream)  # decoding
        backend.close()
        with pytest.raises(BackendUnavailable, match="closed"):
            list(stream)
        with pytest.raises(BackendUnavailable, match="closed"):
            backend.generate_sync(Request(prompt="hi", params=SamplingParams(max_tokens=2)))
        backend.cancel_now(long.request_id)
        return long.request_id

    return run
