"""Requests waiting for their first token: how many may wait ([server] max_waiting, and max_waiting_per_client for
one client; more get 429 with Retry-After), how long each may wait (queue_timeout_s; then 503), and a client that leaves while it waits is aborted at once,
its blocks back in the pool, rather than prefilled for nobody."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from inferplug.errors import LimitExceeded
from inferplug.profile_server import ServerOptions

if TYPE_CHECKING:
    from starlette.requests import Request

    from inferplug.server.generation import Generation

RETRY_AFTER_S = 1


async def until_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _check_room(count: int, limit: int, key: str, what: str) -> None:
    if count >= limit:
        flag = key.replace("_", "-")
        raise LimitExceeded(f"{count} {what}, this server's limit ([server] {key}, inferplug serve --{flag}): retry "
                            f"after {RETRY_AFTER_S} s", limit=key, status=429, retry_after=RETRY_AFTER_S)


class Admission:
    def __init__(self, options: ServerOptions):
        self.options = options
        self.waiting = 0  # the event loop's own counts: no lock
        self.by_client: dict[str, int] = {}
        self.in_flight: dict[str, int] = {}  # a client's requests from admission until their generation closes

    @contextlib.contextmanager
    def slot(self, client: str) -> Iterator[None]:
        """A place in the waiting line, held until the first token (or the failure) arrives."""
        _check_room(self.waiting, self.options.max_waiting, "max_waiting",
                    "requests are already waiting for their first token")
        _check_room(self.by_client.get(client, 0), self.options.max_waiting_per_client, "max_waiting_per_client",
                    "requests of this client are already waiting for their first token")
        self.waiting += 1
        self.by_client[client] = self.by_client.get(client, 0) + 1
        try:
            yield
        finally:
            self.waiting -= 1
            self.by_client[client] -= 1
            if not self.by_client[client]:
                del self.by_client[client]

    def _hold(self, generation: Generation, client: str) -> None:
        """A place among the client's requests in flight, given back when its generation closes (however it ends)."""
        _check_room(self.in_flight.get(client, 0), self.options.max_in_flight_per_client,
                    "max_in_flight_per_client", "requests of this client are in flight")
        self.in_flight[client] = self.in_flight.get(client, 0) + 1

        def release() -> None:
            self.in_flight[client] -= 1
            if not self.in_flight[client]:
                del self.in_flight[client]

        generation.on_close(release)

    async def start(self, generation: Generation, request: Request, client: str) -> bool:
        """Start the generation (its first events in); False when the client left first (then it is aborted).
        A RequestError of the backend's is raised; past queue_timeout_s, a 503 LimitExceeded."""
        timeout = self.options.queue_timeout_s
        if await request.is_disconnected():  # it left while its body was read and checked: queue nothing for it
            await generation.aclose()
            return False
        self._hold(generation, client)
        with self.slot(client):
            starting = asyncio.create_task(generation.start())
            leaving = asyncio.create_task(until_disconnect(request))
            try:
                await asyncio.wait({starting, leaving}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                leaving.cancel()
                if not starting.done():
                    starting.cancel()
                await asyncio.gather(starting, leaving, return_exceptions=True)
            if starting.cancelled():
                await generation.aclose()
                if leaving.done() and not leaving.cancelled():
                    return False
                raise LimitExceeded(f"the request waited {timeout:g} s without its first token ([server] "
                                    "queue_timeout_s): the server is busy; retry later", limit="queue_timeout_s",
                                    status=503, retry_after=RETRY_AFTER_S)
            starting.result()  # the backend's RequestError, if it refused the request
            return True
