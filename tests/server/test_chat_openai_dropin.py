"""ChatInferPlug, InferPlugLLM and LlamaIndex's InferPlug take `api_key` and `base_url` as ChatOpenAI does: a remote
profile sends the key to the server at that URL (here our own server on loopback, which requires the key); a local
profile needs neither, accepts both and runs as it does without them."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

KEY = "k-777-secret"
UNREACHABLE = "http://127.0.0.1:9/v1"  # the profile's own base_url: only the base_url given reaches the server


@pytest.fixture
def keyed_server(server_factory, tiny_backend):
    return server_factory(tiny_backend, api_key=KEY)


@pytest.fixture
def remote_profile():
    from inferplug.backends.registry import close_backend, loaded_backends
    from inferplug.profile import OpenAIOptions, Profile

    before = set(map(id, loaded_backends()))
    yield Profile(name="remote-dropin", backend="openai", openai=OpenAIOptions(base_url=UNREACHABLE))
    for backend in loaded_backends():  # the remote backends these tests built
        if id(backend) not in before:
            close_backend(backend.profile)


def test_a_remote_profile_sends_the_key_to_the_base_url(keyed_server, remote_profile, tiny_backend):
    from langchain_inferplug import ChatInferPlug, InferPlugLLM

    local = ChatInferPlug(profile=tiny_backend.profile, temperature=0, max_tokens=6)
    chat = ChatInferPlug(profile=remote_profile, api_key=KEY, base_url=keyed_server.url, temperature=0, max_tokens=6)
    assert isinstance(chat.api_key, SecretStr) and KEY not in repr(chat) and KEY not in chat.model_dump_json()
    assert chat.backend.base_url == keyed_server.url and chat.inferplug_profile.openai.base_url == keyed_server.url
    answer, want = chat.invoke("hello there"), local.invoke("hello there")
    assert answer.content == want.content
    assert [answer.usage_metadata[k] for k in ("input_tokens", "output_tokens")] == \
        [want.usage_metadata[k] for k in ("input_tokens", "output_tokens")]

    llm = InferPlugLLM(profile=remote_profile, api_key=SecretStr(KEY), base_url=keyed_server.url, temperature=0,
                       max_tokens=6)
    want = InferPlugLLM(profile=tiny_backend.profile, temperature=0, max_tokens=6).invoke("the weather is")
    assert llm.invoke("the weather is") == want

    from llama_index.llms.inferplug import InferPlug

    index_llm = InferPlug(profile=remote_profile, api_key=KEY, base_url=keyed_server.url, temperature=0, max_tokens=6)
    assert isinstance(index_llm.api_key, SecretStr) and KEY not in repr(index_llm)
    assert KEY not in index_llm.model_dump_json() and index_llm.backend.base_url == keyed_server.url
    want = InferPlug(profile=tiny_backend.profile, temperature=0, max_tokens=6).complete("hello there")
    answer = index_llm.complete("hello there")
    assert (answer.text, answer.raw["usage"]) == (want.text, want.raw["usage"])


def test_a_wrong_key_is_refused_and_never_shown(keyed_server, remote_profile):
    from langchain_inferplug import ChatInferPlug

    from inferplug.errors import BackendUnavailable

    chat = ChatInferPlug(profile=remote_profile, api_key="k-999-wrong", base_url=keyed_server.url)
    with pytest.raises(BackendUnavailable, match="401") as info:
        chat.invoke("hello there")
    assert "k-999" not in str(info.value) and "api_key" in str(info.value)
    right = ChatInferPlug(profile=remote_profile, api_key=KEY, base_url=keyed_server.url, max_tokens=2)
    # one backend per key: the registry never hands one key's backend to another
    assert right.inferplug_profile.identity != chat.inferplug_profile.identity
    assert right.invoke("hello there").usage_metadata["output_tokens"] == 2


def test_a_local_profile_accepts_a_key_and_a_url_and_needs_neither(tiny_backend):
    from langchain_inferplug import ChatInferPlug, InferPlugLLM

    for cls in (ChatInferPlug, InferPlugLLM):
        plain = cls(profile=tiny_backend.profile, temperature=0, max_tokens=4)
        given = cls(profile=tiny_backend.profile, temperature=0, max_tokens=4, api_key="unused",
                    base_url=UNREACHABLE)
        assert given.backend is plain.backend is tiny_backend  # the same engine: the key and URL change nothing
        assert given.inferplug_profile.openai.api_key is None
        assert text(given.invoke("hello there")) == text(plain.invoke("hello there"))
    from llama_index.llms.inferplug import InferPlug

    plain = InferPlug(profile=tiny_backend.profile, temperature=0, max_tokens=4)
    given = InferPlug(profile=tiny_backend.profile, temperature=0, max_tokens=4, api_key="unused",
                      base_url=UNREACHABLE)
    assert given.backend is plain.backend is tiny_backend and given.profile.openai.api_key is None
    assert given.complete("hello there").text == plain.complete("hello there").text


def text(answer) -> str:
    return getattr(answer, "content", answer)
