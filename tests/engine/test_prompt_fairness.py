"""The prompt workers are shared out by client (issue 29): one client's requests with fresh big schemas, each
seconds of xgrammar compiling on SmolLM2's vocabulary, keep at most one worker, and another client's prompt is
prepared and answered while they still compile."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from inferplug.backends.async_engine import AsyncEngine
from inferplug.types import Request
from tests.engine.engine_helpers import greedy, make_engine

pytestmark = pytest.mark.smollm2

PROPERTIES = 700  # one object of optional properties: ~2 s to compile here (docs/server.md, max_schema_properties)


def big_schema() -> dict:
    tag = uuid.uuid4().hex[:8]  # fresh names: no compiled grammar to reuse
    return {"type": "object", "properties": {f"{tag}_{i}": {"type": "string"} for i in range(PROPERTIES)}}


async def test_a_client_compiling_big_schemas_leaves_a_worker_for_another(smollm2_gguf):
    engine = AsyncEngine(make_engine(smollm2_gguf))
    try:
        slow = [Request(prompt="a", params=greedy(2, json_schema=big_schema()), request_id=f"slow{i}", client="a")
                for i in range(2)]
        slow_runs = [asyncio.ensure_future(_collect(engine, r)) for r in slow]
        quick = Request(prompt="hello", params=greedy(2), request_id="quick", client="b")
        events = await asyncio.wait_for(_collect(engine, quick), timeout=60)  # a bound for a hang
        assert sum(len(e.token_ids) for e in events) == 2
        # answered while client a's requests were still being prepared: the second waits for the first's worker
        assert {r.request_id for r in slow} <= set(engine._preparing)
        for run in slow_runs:
            assert sum(len(e.token_ids) for e in await asyncio.wait_for(run, timeout=300)) == 2
    finally:
        engine.close()


async def _collect(engine: AsyncEngine, request: Request):
    return [event async for event in engine.generate(request)]
