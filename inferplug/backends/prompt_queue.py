"""The prompt workers' queue: requests taken round-robin by client (Request.client: the server's tenant or remote
address), and each client's one at a time. A client sending schemas that take seconds to compile keeps one worker
busy, never all of them, and another client's prompt is taken by the next free worker, not after that queue."""

from __future__ import annotations

import threading
from collections import deque

from inferplug.types import Request


class PromptQueue:
    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._waiting: dict[str | None, deque[Request]] = {}  # by client, in turn order: the next served first
        self._busy: set[str | None] = set()  # the clients a worker prepares a request of
        self._closed = False

    def put(self, request: Request) -> None:
        with self._changed:
            self._waiting.setdefault(request.client, deque()).append(request)
            self._changed.notify()

    def take(self) -> Request | None:
        """The next request of the first client in turn with no request being prepared; None once closed and empty
        (closing, what is queued is still handed out, whoever is busy: its stream ends with BackendUnavailable)."""
        with self._changed:
            while True:
                ready = [c for c in self._waiting if self._closed or c not in self._busy][:1]  # a client may be None
                if ready:
                    queued = self._waiting.pop(ready[0])
                    request = queued.popleft()
                    if queued:  # its turn comes again after every other client's
                        self._waiting[ready[0]] = queued
                    self._busy.add(ready[0])
                    return request
                if self._closed:
                    return None
                self._changed.wait()

    def done(self, request: Request) -> None:
        """The worker that took `request` is done with it: its client's next request may be taken."""
        with self._changed:
            self._busy.discard(request.client)
            self._changed.notify()

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()
