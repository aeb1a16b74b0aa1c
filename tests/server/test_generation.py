"""Generation's fan-out for backends without native n: n single-choice requests, merged."""

from __future__ import annotations

import dataclasses

from inferplug.server.generation import Generation
from inferplug.types import Request, SamplingParams


class SingleChoice:
    """The tiny backend as a backend that cannot sample n choices in one request would present it."""

    def __init__(self, backend):
        self.backend = backend
        self.requests = []

    @property
    def capabilities(self):
        return dataclasses.replace(self.backend.capabilities, n=False)

    def generate(self, request):
        assert request.params.n == 1
        self.requests.append(request)
        return self.backend.generate(request)

    async def abort(self, request_id):
        await self.backend.abort(request_id)


def test_n_fans_out_to_single_choice_requests(tiny_backend):
    backend = SingleChoice(tiny_backend)
    params = SamplingParams(n=3, temperature=1.0, seed=11, max_tokens=5, ignore_eos=True)

    async def run():
        generation = Generation(backend, [Request(prompt="one", params=params), Request(prompt="two", params=params)])
        await generation.start()
        events = [e async for e in generation.events()]
        await generation.aclose()
        return generation, events

    generation, events = tiny_backend.run_sync(run())
    assert len(backend.requests) == 6
    assert [r.params.seed for r in backend.requests] == [11, 12, 13, 11, 12, 13]
    assert sorted(e.index for e in events if e.finish_reason) == list(range(6))
    prompt_tokens = [len(tiny_backend.tokenizer.encode(p)) for p in ("one", "two")]
    assert generation.usage.prompt_tokens == sum(prompt_tokens)  # each prompt counted once, not n times
    assert generation.usage.completion_tokens == 30
