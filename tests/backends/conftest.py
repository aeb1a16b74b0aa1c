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
