"""Tenants never share cached prompts: the prefix cache is salted by the API key a request presents and by the
tenant header the operator names ([server] tenant_header), so tenant B sending tenant A's system prompt reports no
cached tokens (nor gets them faster), while A's own repeat still hits its cache."""

from __future__ import annotations

import httpx

from inferplug.profile_server import ServerOptions

SYSTEM = "You are the assistant of tenant A. Its secret plan: ship the blue widget in March. " * 3


def cached(server, headers: dict, question: str) -> int:
    body = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "system", "content": SYSTEM},
                                                           {"role": "user", "content": question}]}
    reply = httpx.post(server.url + "/chat/completions", json=body, headers=headers, timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_a_tenant_header_keeps_tenants_caches_apart(native, server_factory):
    server = server_factory(native, options=ServerOptions(tenant_header="X-Tenant"))
    cached(server, {"X-Tenant": "a"}, "first?")
    assert cached(server, {"X-Tenant": "a"}, "second?") >= 64  # A's own system prompt, from its cache
    assert cached(server, {"X-Tenant": "b"}, "first?") == 0  # B: the same prompt, nothing from A's cache
    assert cached(server, {"X-Tenant": "b"}, "third?") >= 64  # and B's own repeat hits B's entries


def test_requests_with_different_api_keys_share_no_cache(native, server_factory):
    server = server_factory(native, api_key="key-a,key-b")  # one key per tenant
    assert httpx.get(server.url + "/models", headers={"Authorization": "Bearer key-c"}).status_code == 401
    cached(server, {"Authorization": "Bearer key-a"}, "one?")
    assert cached(server, {"Authorization": "Bearer key-a"}, "two?") >= 64
    assert cached(server, {"Authorization": "Bearer key-b"}, "one?") == 0
