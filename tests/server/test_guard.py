"""What a request passes before the app reads it (server/guard.py): the API key before the body, the body under a
read deadline, the Host header on a loopback server without a key (DNS rebinding), and the key on /metrics and
/openapi.json. Raw sockets send what a client library would not."""

from __future__ import annotations

import re
import socket
import time

import httpx

from inferplug.profile_server import ServerOptions


def raw_exchange(url: str, head: str, body: bytes = b"", wait: float = 20) -> str:
    """Send a request's head (and part of a body), then read what the server answers within `wait` seconds: its head
    and the body its Content-Length names (a server may send them in two segments)."""
    host, port = url.removeprefix("http://").split("/")[0].split(":")
    deadline = time.monotonic() + wait
    answer = b""
    with socket.create_connection((host, int(port)), timeout=wait) as s:
        s.sendall(head.encode() + b"\r\n" + body)
        while not _complete(answer) and (left := deadline - time.monotonic()) > 0:
            s.settimeout(left)
            try:
                part = s.recv(65536)
            except (TimeoutError, ConnectionResetError):  # a server may reset once it has answered
                break
            if not part:
                break
            answer += part
    return answer.decode(errors="replace")


def _complete(answer: bytes) -> bool:
    head, sep, body = answer.partition(b"\r\n\r\n")
    if not sep:
        return False
    length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    return length is None or len(body) >= int(length.group(1))


def test_a_wrong_key_is_refused_before_the_body_arrives(server_factory, tiny_backend):
    server = server_factory(tiny_backend, api_key="the-key")
    head = ("POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer wrong\r\n"
            "Content-Type: application/json\r\nContent-Length: 100000\r\n")
    started = time.monotonic()
    answer = raw_exchange(server.url, head)  # no body is ever sent
    assert answer.startswith("HTTP/1.1 401") and "invalid_api_key" in answer
    assert time.monotonic() - started < 15  # a bound for a hang: the server did not wait for the body


def test_a_body_that_trickles_in_is_cut_off_with_a_408(server_factory, tiny_backend):
    server = server_factory(tiny_backend, options=ServerOptions(body_read_timeout_s=1))
    head = ("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            "Content-Length: 500\r\n")
    answer = raw_exchange(server.url, head, b'{"model": "tiny-llama", ')
    assert answer.startswith("HTTP/1.1 408") and "body_read_timeout_s" in answer
    assert server.client().completions.create(model="tiny-llama", prompt="hi", max_tokens=2).choices


def test_a_loopback_server_without_a_key_answers_only_loopback_host_names(server_factory, tiny_backend):
    server = server_factory(tiny_backend)
    models = server.url + "/models"
    rebound = httpx.get(models, headers={"Host": "attacker.example:8000"})
    assert rebound.status_code == 403 and rebound.json()["error"]["code"] == "host_not_allowed"
    assert "allowed_hosts" in rebound.json()["error"]["message"]
    for host in ("localhost:8000", "127.0.0.1", "[::1]:8000", "LOCALHOST"):
        assert httpx.get(models, headers={"Host": host}).status_code == 200, host
    allowed = server_factory(tiny_backend, options=ServerOptions(allowed_hosts=["box.lan"]))
    assert httpx.get(allowed.url + "/models", headers={"Host": "box.lan:80"}).status_code == 200
    assert httpx.get(allowed.url + "/models", headers={"Host": "other.lan"}).status_code == 403
    keyed = server_factory(tiny_backend, api_key="k")  # the key guards it: any name may reach it
    assert httpx.get(keyed.url + "/models", headers={"Host": "box.lan", "Authorization": "Bearer k"}).status_code == 200


def test_metrics_and_the_openapi_schema_need_the_key_and_health_does_not(server_factory, tiny_backend):
    server = server_factory(tiny_backend, api_key="k")
    base = server.url.removesuffix("/v1")
    for path in ("/metrics", "/openapi.json"):
        assert httpx.get(base + path).status_code == 401, path
        assert httpx.get(base + path, headers={"Authorization": "Bearer k"}).status_code == 200, path
    assert "/v1/chat/completions" in httpx.get(base + "/openapi.json", headers={"Authorization": "Bearer k"}).json()[
        "paths"]
    assert httpx.get(base + "/health").status_code == 200


def test_a_body_of_too_many_json_values_is_refused_before_it_is_parsed(server_factory, tiny_backend):
    server = server_factory(tiny_backend, options=ServerOptions(max_json_values=1000))
    many = {"model": "tiny", "max_tokens": 1, "prompt": [[1]] * 2000}
    reply = httpx.post(server.url + "/completions", json=many, timeout=30)
    assert reply.status_code == 413 and reply.json()["error"]["code"] == "max_json_values"
    assert "max_json_values" in reply.json()["error"]["message"]
    few = {**many, "prompt": [[1]] * 4}  # under the count: parsed and served
    assert httpx.post(server.url + "/completions", json=few, timeout=30).status_code == 200


def test_a_second_authorization_header_is_refused(server_factory, tiny_backend):
    """The key is checked on one Authorization header and the tenant salted by the first: two of them (a random
    one before the real key) would make every request a new client, past the per-client limits."""
    server = server_factory(tiny_backend, api_key="the-key")
    body = b'{"model": "tiny-llama", "prompt": "hi", "max_tokens": 1}'
    head = ("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer anyone-else\r\n"
            f"Authorization: Bearer the-key\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n")
    answer = raw_exchange(server.url, head, body)
    assert answer.startswith("HTTP/1.1 400") and "more than one Authorization header" in answer
    assert server.client(api_key="the-key").completions.create(model="tiny-llama", prompt="hi", max_tokens=1).choices
