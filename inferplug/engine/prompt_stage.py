"""The prompt stage: a request's chat template rendered, its prompt tokenized and its JSON schema compiled, on worker
threads of its own, before the engine's step thread sees the request.

So a huge prompt, a long history or a large schema costs its own request time, not a step of every stream: the step
thread adds requests that are ready (AsyncEngine). A RequestError raised here fails that request alone.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from inferplug.types import Request

WORKERS = 2  # tokenizing and compiling are CPU work: a few threads, started once, whatever the load


@dataclass
class PromptIds:
    ids: list[int]
    text: str | None  # the prompt's text, when it had one (the RAG document cache maps its spans)


class PromptStage:
    def __init__(self, encode: Callable[[Request], tuple[list[int], str | None]], tokenizer: Any):
        """`encode`: a request -> (its prompt ids, its text), raising RequestError for bad input."""
        self._encode, self._tokenizer = encode, tokenizer
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._work, name=f"inferplug-prompt-{i}", daemon=True)
                         for i in range(WORKERS)]
        for thread in self._threads:
            thread.start()

    def put(self, request: Request, done: Callable[[Request, PromptIds | Exception], None]) -> None:
        """Prepare the request on a worker, then call done(request, its PromptIds or the error) there."""
        self._queue.put((request, done))

    def prepare(self, request: Request) -> PromptIds:
        ids, text = self._encode(request)
        if request.params.json_schema is not None:
            self._compile(request.params.json_schema)
        return PromptIds(ids, text)

    def _compile(self, schema: dict[str, Any]) -> None:
        """Compile the schema now, so that the engine's own compile is a cache hit (engine/guided.py)."""
        try:
            from inferplug.engine.guided import compile_json_schema
        except ImportError:
            return  # no xgrammar: the engine names what to install
        compile_json_schema(self._tokenizer, schema)

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            request, done = item
            try:
                result: PromptIds | Exception = self.prepare(request)
            except Exception as exc:  # noqa: BLE001 - a bad request fails alone
                result = exc
            done(request, result)

    def close(self) -> None:
        """Stop the workers once what is queued is prepared."""
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            thread.join(timeout=30)
