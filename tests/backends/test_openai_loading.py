"""The openai backend sends nothing at load and only a key the user named for the purpose (issue 29), checked
against a real loopback HTTP server that records every request it gets."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from inferplug.errors import ProfileError
from inferplug.profile import OpenAIOptions, Profile, load_profile
from inferplug.types import Request, SamplingParams

KEY = "sk-loopback-secret"
CHUNKS = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": "hello"}, "finish_reason": None}]},
          {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
          {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}]


class Recorder(BaseHTTPRequestHandler):
    """Answers GET /v1/models and a streamed POST /v1/chat/completions; records (method, path, Authorization)."""

    seen: list[tuple[str, str, str | None]] = []

    def do_GET(self):  # noqa: N802 - http.server's name
        self.seen.append(("GET", self.path, self.headers.get("authorization")))
        self._send(json.dumps({"data": [{"id": "remote-model", "max_model_len": 4096}]}).encode(), "application/json")

    def do_POST(self):  # noqa: N802
        self.seen.append(("POST", self.path, self.headers.get("authorization")))
        self.rfile.read(int(self.headers["content-length"]))
        body = "".join(f"data: {json.dumps(c)}\n\n" for c in CHUNKS) + "data: [DONE]\n\n"
        self._send(body.encode(), "text/event-stream")

    def _send(self, body: bytes, kind: str) -> None:
        self.send_response(200)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server():
    Recorder.seen = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


def test_loading_sends_nothing_and_the_first_request_lists_the_models(server, monkeypatch):
    from inferplug.backends.openai import OpenAIBackend
    from inferplug.hardware import probe
    from inferplug.resolver import resolve

    monkeypatch.setenv("LOOPBACK_API_KEY", KEY)
    profile = Profile(name="remote", backend="openai", openai=OpenAIOptions(base_url=server,
                                                                            api_key_env="LOOPBACK_API_KEY"))
    backend = OpenAIBackend(profile, resolve(profile, probe()))
    assert Recorder.seen == []  # no request, no key sent, at load
    events = backend.generate_sync(Request(messages=[{"role": "user", "content": "hi"}], params=SamplingParams()))
    assert "".join(e.text for e in events) == "hello" and events[-1].usage.completion_tokens == 1
    assert Recorder.seen == [("GET", "/v1/models", f"Bearer {KEY}"), ("POST", "/v1/chat/completions", f"Bearer {KEY}")]
    assert (backend.model_name, backend.context_length) == ("remote-model", 4096)
    backend.generate_sync(Request(prompt="hi"))
    assert [s[:2] for s in Recorder.seen[2:]] == [("POST", "/v1/completions")]  # listed once
    backend.close()


def test_the_first_look_at_the_model_name_lists_the_models_once(server):
    from inferplug.backends.openai import OpenAIBackend
    from inferplug.hardware import probe
    from inferplug.resolver import resolve

    profile = Profile(name="remote", backend="openai", openai=OpenAIOptions(base_url=server))
    backend = OpenAIBackend(profile, resolve(profile, probe()))
    assert Recorder.seen == []
    assert (backend.model_name, backend.context_length, backend.model_name) == ("remote-model", 4096, "remote-model")
    assert Recorder.seen == [("GET", "/v1/models", None)]  # no key set: no Authorization header


@pytest.mark.parametrize("name", ["AWS_SECRET_ACCESS_KEY", "HOME", "GITHUB_TOKEN", "MY_API_KEY_X", "_API_KEY "])
def test_api_key_env_names_only_a_variable_ending_in_api_key(tmp_path, name):
    with pytest.raises(ValueError, match="must name an environment variable ending in _API_KEY"):
        OpenAIOptions(api_key_env=name)
    path = tmp_path / "p.toml"
    path.write_text(f'backend = "openai"\n[openai]\napi_key_env = "{name}"\n')
    with pytest.raises(ProfileError, match="ending in _API_KEY"):
        load_profile(path)
    assert OpenAIOptions(api_key_env="OPENAI_API_KEY").api_key_env == "OPENAI_API_KEY"


def test_serve_sends_nothing_to_the_remote_until_a_client_asks(server, tmp_path):
    """`inferplug serve` on an [openai] profile: up and answering /health with no request to the remote (the key
    goes out with the first client request, not at startup)."""
    import os

    import httpx

    from inferplug.server.launch import start_serve

    path = tmp_path / "remote.toml"
    path.write_text(f'backend = "openai"\n[openai]\nbase_url = "{server}"\napi_key_env = "LOOPBACK_API_KEY"\n')
    proc, base = start_serve(str(path), env={**os.environ, "LOOPBACK_API_KEY": KEY})
    try:
        assert Recorder.seen == []
        reply = httpx.post(base + "/v1/chat/completions", timeout=60,
                           json={"model": "remote", "messages": [{"role": "user", "content": "hi"}]})
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["message"]["content"] == "hello"
        assert [s[:2] for s in Recorder.seen] == [("GET", "/v1/models"), ("POST", "/v1/chat/completions")]
    finally:
        proc.terminate()
        output = proc.communicate(timeout=60)[0]
    assert KEY not in output and "serving remote" in output
