"""A client that stops reading its stream (its socket full) is cut off after [server] stream_send_timeout_s and its
generation aborted, rather than holding the request open for as long as it keeps the connection."""

from __future__ import annotations

import json
import socket

import pytest

from inferplug.profile_server import ServerOptions
from tests.server.test_overload import until
from tests.server.test_server_errors import metric


@pytest.fixture(scope="module")
def roomy(tiny_llama_dir, tmp_path_factory):
    from inferplug.backends.registry import close_backend, get_backend

    path = tmp_path_factory.mktemp("roomy") / "roomy.toml"  # KV for 16 choices of 500 tokens at once
    path.write_text(f'name = "roomy"\nbackend = "native"\ndtype = "float32"\n[model]\npath = "{tiny_llama_dir}"\n'
                    'served_name = "tiny"\n[cache]\nmemory = "16MiB"\n')
    yield get_backend(str(path))
    close_backend(str(path))


def test_a_client_that_stops_reading_is_cut_off_and_its_generation_aborted(roomy, server_factory):
    server = server_factory(roomy, options=ServerOptions(stream_send_timeout_s=1))
    free = roomy.stats()["kv_blocks_free"]
    # ~8,000 chunks of 20 alternatives' logprobs each: megabytes, far more than the sockets hold
    body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True, "n": 16,
                       "max_tokens": 500, "ignore_eos": True, "logprobs": True, "top_logprobs": 20}).encode()
    host, port = server.url.removeprefix("http://").split("/")[0].split(":")
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a reader that has stopped reading
        s.connect((host, int(port)))
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        # the connection stays open and unread: the server gives up on it by itself
        until(lambda: metric(server, "/v1/chat/completions", "499") == 1, bound=60, what="the stalled stream's abort")
    until(lambda: not roomy.engine.engine.requests, what="the engine settles")
    assert roomy.stats()["kv_blocks_free"] == free
