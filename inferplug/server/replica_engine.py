"""One replica: a backend and the app `create_app` builds for it, driven through a Serve handle.

`handle` runs one HTTP request through the app in this process and yields the ASGI messages it sends; the
front (replica_front.py) relays them. When the front cancels the call (its client left), the app sees
`http.disconnect`, and the routes abort the generation as they do with one process.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from typing import Any

import ray

HEALTH_CHECK_PERIOD_S = 1.0  # Serve's health check period, and the period replicas publish their metrics at
REPLICA_HEADER = b"x-inferplug-replica"
STALE_AFTER_S = 5 * HEALTH_CHECK_PERIOD_S


@dataclass
class RoutedRequest:
    """What the front sends: the request and, for the router, `prompt` (the text a prefix is matched on)."""

    scope: dict[str, Any]
    body: bytes
    prompt: str


@ray.remote(num_cpus=0, max_restarts=-1)
class MetricsBoard:
    """The latest metrics of each replica, which they publish at every health check (restarted empty if it dies:
    the replicas fill it again within a second)."""

    def __init__(self) -> None:
        self.latest: dict[str, tuple[float, int, bytes]] = {}

    def put(self, replica: str, pid: int, text: bytes) -> None:
        self.latest[replica] = (time.monotonic(), pid, text)

    def collect(self) -> dict[str, tuple[int, bytes]]:
        """replica -> (pid, metrics text), without replicas that stopped publishing (dead ones)."""
        now = time.monotonic()
        self.latest = {r: v for r, v in self.latest.items() if now - v[0] < STALE_AFTER_S}
        return {r: (pid, text) for r, (_, pid, text) in self.latest.items()}


class EngineReplica:
    def __init__(self, profile: Any, max_body_bytes: int, board: Any) -> None:
        from ray import serve

        from inferplug.backends.registry import get_backend
        from inferplug.server.app import create_app

        self.replica_id = serve.get_replica_context().replica_id.unique_id
        self.board = board
        self.backend = get_backend(profile)
        # the key comes from this process's environment (replicas.deployment_options), never as an argument
        self.app = create_app(self.backend, api_key=None, max_body_bytes=max_body_bytes)

    async def handle(self, request: RoutedRequest):  # noqa: ANN201 - an async generator of ASGI messages
        sent: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        left = asyncio.Event()
        body_given = False

        async def receive() -> dict[str, Any]:
            nonlocal body_given
            if not body_given:
                body_given = True
                return {"type": "http.request", "body": request.body, "more_body": False}
            await left.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []),
                                                  (REPLICA_HEADER, self.replica_id.encode())]}
            await sent.put(message)

        task = asyncio.create_task(self.app(request.scope, receive, send))
        task.add_done_callback(lambda _: sent.put_nowait(None))
        try:
            while (message := await sent.get()) is not None:
                yield message
        finally:  # finished, or cancelled because the client left: either way the app sees the end
            left.set()
            await asyncio.shield(task)

    async def check_health(self) -> None:
        """Serve's liveness probe; also publishes this replica's metrics (they are this fresh)."""
        text = self.app.state.metrics.render()
        try:
            await asyncio.wait_for(self.board.put.remote(self.replica_id, os.getpid(), text),
                                   HEALTH_CHECK_PERIOD_S)
        except (asyncio.TimeoutError, ray.exceptions.RayError):
            pass  # a missed publication is not a sick replica

    def __del__(self) -> None:
        from inferplug.backends.registry import close_all

        close_all()
