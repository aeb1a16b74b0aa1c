"""The Backend protocol every engine implements, and the registry that finds them.

Front ends (LangChain, LlamaIndex, the server, the CLI) speak only this protocol.
A backend is async at heart. Callers on other threads or loops use `stream_sync` and
`stream_async`, both over the one bridge (backends/bridge.py): `submit` starts a request whose
events go to an EventChannel. By default (a remote backend) a pump runs `generate` on one background
event loop per backend; the local ones override `submit`, so their engine's thread feeds the channel
itself (the native step thread; CTranslate2's and ExLlamaV2's, backends/local_stream.py).
"""

from __future__ import annotations

import asyncio
import threading
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import Future
from functools import cached_property, partial
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from inferplug.backends.bridge import EventChannel, consume_async, consume_sync
from inferplug.errors import BackendUnavailable
from inferplug.types import Capabilities, Event, Request

if TYPE_CHECKING:
    from inferplug.profile import Profile
    from inferplug.plan import Plan

ENTRY_POINT_GROUP = "inferplug.backends"


class Backend(ABC):
    """A loaded model behind one protocol.

    Construct with `(profile, plan)`. `generate` yields Events; breaking out of
    it (or `abort`) cancels the request and frees what it held.
    """

    name: str = "?"

    def __init__(self, profile: Profile, plan: Plan) -> None:
        self.profile = profile
        self.plan = plan
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_lock = threading.Lock()
        self._pumps: dict[str, Future] = {}  # submitted requests running on the background loop
        self.closed = False  # set by close(): a front end holding this backend looks it up again (registry)

    # --- what a backend provides -------------------------------------------------
    @property
    @abstractmethod
    def capabilities(self) -> Capabilities: ...

    @property
    def model_name(self) -> str:
        """The name requests and responses use for this model (a remote backend reports its own)."""
        return self.profile.served_name

    @property
    def announced_name(self) -> str:
        """model_name as far as it is known without asking anyone (what `inferplug serve` prints as it starts)."""
        return self.model_name

    @property
    @abstractmethod
    def context_length(self) -> int: ...

    @property
    def tokenizer(self) -> Any:
        """A HF-style tokenizer (encode/decode/apply_chat_template), or None for remote backends."""
        return None

    def apply_chat_template(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """Render chat messages to prompt text, ending with the assistant's turn (`template_kwargs`: the template's
        extra variables, Request.chat_template_kwargs)."""
        from inferplug.chat_template import profile_template, render_chat

        return render_chat(self.tokenizer, profile_template(self.profile), messages, tools, template_kwargs)

    @cached_property
    def reasoning_parser(self) -> str | None:
        """The parser that splits this model's <think> text out of `Event.text` (chat_template.reasoning_parser)."""
        from inferplug.chat_template import reasoning_parser

        return reasoning_parser(self.profile, self.tokenizer)

    @abstractmethod
    def generate(self, request: Request) -> AsyncIterator[Event]:
        """Stream the request's events. Raises RequestError before the first event on bad input."""

    @abstractmethod
    async def abort(self, request_id: str) -> None:
        """Cancel a request; its resources come back at once. Unknown ids are ignored."""

    def stats(self) -> dict[str, Any]:
        """Engine-wide metrics: running, waiting, kv blocks used/free, prefix hit rate..."""
        return {}

    def health(self) -> str | None:
        """Why this backend cannot serve any more (its engine thread died), or None while it can."""
        return None

    def evict_documents(self, docs: list[Any] | None = None, salt: str | None = None) -> int:
        """Drop the stored KV (memory and disk) of these documents under `salt`, or of all of the salt's documents
        when docs is None; the entries dropped. A backend without a document cache holds none."""
        return 0

    def close(self) -> None:
        """Free the model. Idempotent."""
        self.closed = True
        loop, self._loop = self._loop, None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)

    # --- the bridge to callers on other threads and loops ----------------------------
    def _background_loop(self) -> asyncio.AbstractEventLoop:
        with self._loop_lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name=f"inferplug-{self.name}", daemon=True).start()
                self._loop = loop
            return self._loop

    def run_sync(self, coro: Any) -> Any:
        """Run a coroutine on this backend's background loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._background_loop()).result()

    def submit(self, request: Request, channel: EventChannel) -> None:
        """Start the request; its events, or the error that ends it, go to channel. Returns at once."""

        async def pump() -> None:
            try:
                async for event in self.generate(request):
                    channel.send([event])
            except BaseException as exc:  # re-raised in the consumer
                channel.send([exc], last=True)
            finally:
                self._pumps.pop(request.request_id, None)
                channel.send([], last=True)

        self._pumps[request.request_id] = asyncio.run_coroutine_threadsafe(pump(), self._background_loop())

    def cancel_now(self, request_id: str) -> None:
        """Stop a submitted request from a thread that may block; its resources come back before this returns."""
        future: Future | None = self._pumps.pop(request_id, None)
        if future is not None:
            future.cancel()
        self.run_sync(self.abort(request_id))

    def stream_sync(self, request: Request, *, at_end: bool = False, timeout: float | None = None) -> Iterator[Event]:
        """Iterate a request's events from sync code; leaving early aborts it. at_end: they all come at the end
        (one wake-up), for a caller that wants only the result. timeout: seconds before it is aborted and
        GenerationError raised (None: no limit)."""
        return consume_sync(partial(self.submit, request), partial(self.cancel_now, request.request_id), at_end=at_end,
                            timeout=timeout)

    def stream_async(self, request: Request, *, at_end: bool = False,
                     timeout: float | None = None) -> AsyncIterator[Event]:
        """The request's events on the caller's own loop, whatever loop or thread the backend runs on."""
        return consume_async(partial(self.submit, request), partial(self.cancel_now, request.request_id),
                             at_end=at_end, timeout=timeout)

    def generate_sync(self, request: Request) -> list[Event]:
        return list(self.stream_sync(request, at_end=True))


def backend_class(name: str) -> type[Backend]:
    """The Backend class registered under `name` in the `inferplug.backends` entry points."""
    found = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
    if name not in found:
        raise BackendUnavailable(
            f"no backend named {name!r} is registered; known: {', '.join(sorted(found)) or 'none'}. "
            "Reinstall inferplug (pip install -e .) or install the plugin that provides it."
        )
    return found[name].load()


def available_backends() -> list[str]:
    return sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))
