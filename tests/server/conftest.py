"""A live `inferplug serve` app on 127.0.0.1 (uvicorn in a thread), for the official openai client."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


@dataclass
class LiveServer:
    backend: Any
    url: str  # http://127.0.0.1:PORT/v1
    server: Any
    thread: threading.Thread

    def client(self, api_key: str = "unused", **kw):
        import openai

        return openai.OpenAI(base_url=self.url, api_key=api_key, max_retries=0, **kw)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(backend, **app_kw) -> LiveServer:
    from inferplug.server.app import create_app

    return serve_app(create_app(backend, **app_kw), backend)


def serve_app(app, backend=None) -> LiveServer:
    """Any ASGI app on a free loopback port, in a thread; returns once it accepts connections."""
    import uvicorn

    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the test server failed to start")
        time.sleep(0.02)
    return LiveServer(backend, f"http://127.0.0.1:{port}/v1", server, thread)


def tiny_ct2_profile(model_dir: Path):
    from inferplug.profile import ModelSource, Profile

    profile = Profile(name="tiny", backend="ctranslate2", model=ModelSource(path=model_dir, served_name="tiny-llama"))
    profile.ctranslate2.compute_type = "float32"
    profile.ctranslate2.device = "cpu"
    profile.sampling.max_tokens = 16
    return profile


@pytest.fixture(scope="session")
def tiny_backend(tiny_llama_dir):
    from inferplug.backends.registry import close_backend, get_backend

    profile = tiny_ct2_profile(tiny_llama_dir)
    yield get_backend(profile)
    close_backend(profile)


@pytest.fixture(scope="session")
def live_server(tiny_backend):
    server = start_server(tiny_backend, max_body_bytes=64 * 1024)
    yield server
    server.stop()


@pytest.fixture
def server_factory():
    """start(target, **create_app kwargs) -> a live server, stopped after the test. `target` is a
    Backend (served by our app) or any ASGI app."""
    from inferplug.backends.base import Backend

    started: list[LiveServer] = []

    def start(target, **app_kw) -> LiveServer:
        started.append(start_server(target, **app_kw) if isinstance(target, Backend) else serve_app(target))
        return started[-1]

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="module")
def native(tiny_profile):
    """The native backend on the tiny Llama (tests/conftest.py's tiny_profile)."""
    from inferplug.backends.registry import get_backend

    return get_backend(tiny_profile)


@pytest.fixture(scope="module")
def native_client(native):
    """The official openai client of a live server on `native`."""
    server = start_server(native)
    yield server.client()
    server.stop()
