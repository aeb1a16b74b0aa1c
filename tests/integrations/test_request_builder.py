"""One request builder: the same call made through each front end (LangChain, LlamaIndex, the server, the CLI)
reaches the engine as the same Request; what a backend cannot do is dropped with a warning or refused."""

from __future__ import annotations

import dataclasses
import warnings

import pytest

from inferplug.engine.llm_engine import LLMEngine
from inferplug.errors import RequestError
from inferplug.frontend.requests import UncachedDocumentsWarning, build_request

SAMPLING = dict(temperature=0.0, max_tokens=5, stop=["zz"], seed=3)


def via_langchain(profile, chat):
    if chat:
        from langchain_core.messages import HumanMessage

        from langchain_inferplug import ChatInferPlug

        ChatInferPlug(profile=profile, **SAMPLING).invoke([HumanMessage("hi there")])
    else:
        from langchain_inferplug.llms import InferPlugLLM

        InferPlugLLM(profile=profile, **SAMPLING).invoke("hi there")


def via_llamaindex(profile, chat):  # LlamaIndex completes through the chat template: chat only
    from llama_index.core.base.llms.types import ChatMessage

    from llama_index.llms.inferplug import InferPlug

    llm = InferPlug(profile=profile, temperature=0.0, max_tokens=5, additional_kwargs={"seed": 3})
    llm.chat([ChatMessage(role="user", content="hi there")], stop=["zz"])


def via_server(profile, chat):
    from inferplug.backends.registry import get_backend
    from tests.server.conftest import start_server

    server = start_server(get_backend(profile))
    try:
        client = server.client()
        if chat:
            client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi there"}],
                                           **SAMPLING)
        else:
            client.completions.create(model="tiny", prompt="hi there", **SAMPLING)
    finally:
        server.stop()


def via_cli(profile, chat):
    from inferplug.cli import main

    flags = ["--temperature", "0", "--max-tokens", "5", "--stop", "zz", "--seed", "3"]
    assert main(["generate", profile, "hi there", *flags, *(["--chat"] if chat else [])]) == 0


FRONT_ENDS = {"langchain": via_langchain, "llamaindex": via_llamaindex, "server": via_server, "cli": via_cli}


@pytest.fixture
def seen(monkeypatch):
    """Every Request that reaches the native engine (it still runs them)."""
    requests = []
    add = LLMEngine.add_request  # every path (sync, async, server, CLI) hands its request to the engine here

    def spy(self, request, *args):  # who sent it (the server names its client) is not part of what was asked
        requests.append(dataclasses.replace(request, request_id="-", client=None))
        return add(self, request, *args)

    monkeypatch.setattr(LLMEngine, "add_request", spy)
    return requests


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "prompt"])
def test_every_front_end_builds_the_same_request(tiny_profile, seen, chat):
    reached = {}
    for name, front_end in FRONT_ENDS.items():
        if name == "llamaindex" and not chat:
            continue
        seen.clear()
        front_end(tiny_profile, chat)
        reached[name] = seen[-1]
    first = next(iter(reached.values()))
    assert first.params.stop == ["zz"] and first.params.temperature == 0.0 and first.params.max_tokens == 5
    assert all(request == first for request in reached.values()), reached


@pytest.fixture(scope="module")
def ct2(tiny_llama_dir):
    from inferplug.backends.registry import close_backend, get_backend
    from tests.server.conftest import tiny_ct2_profile

    profile = tiny_ct2_profile(tiny_llama_dir)
    yield get_backend(profile)
    close_backend(profile)


def test_a_document_hinted_chain_on_ctranslate2_runs_uncached_and_says_so_once(ct2):
    from langchain_core.documents import Document
    from langchain_core.messages import HumanMessage

    from langchain_inferplug import ChatInferPlug

    docs = [Document(page_content="The blue door is on Elm Street."), Document(page_content="Cats purr.")]
    llm = ChatInferPlug(profile=ct2.profile, max_tokens=4, temperature=0)
    question = [HumanMessage(f"{llm.format_documents(docs)}\n\nWhere is the blue door?")]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # Python's default: once per place
        answers = [llm.invoke(question, documents=docs) for _ in range(3)]
    assert all(a.usage_metadata["input_token_details"]["cache_read"] == 0 for a in answers)
    said = [w for w in caught if issubclass(w.category, UncachedDocumentsWarning)]
    assert len(said) == 1 and "ctranslate2 backend has no document cache" in str(said[0].message)


def test_documents_on_the_native_engine_with_its_cache_off_name_the_opt_in(tiny_profile):
    from inferplug.backends.registry import get_backend

    native = get_backend(tiny_profile)  # the default profile: the document cache off
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build_request(native, messages=[{"role": "user", "content": "Where is the door?"}], documents=["Elm Street."])
    [said] = [str(w.message) for w in caught if issubclass(w.category, UncachedDocumentsWarning)]
    assert "RAG document cache off (the default)" in said and "rag_document_cache = true opts in" in said


def test_tools_and_json_schema_on_a_backend_that_cannot_constrain_are_refused_by_name(ct2):
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    ask = [{"role": "user", "content": "hi"}]
    with pytest.raises(RequestError, match="ctranslate2 backend cannot call tools"):
        build_request(ct2, messages=ask, tools=[tool])
    with pytest.raises(RequestError, match="ctranslate2 backend cannot constrain"):
        build_request(ct2, messages=ask, options={"json_schema": {"type": "object"}})
    assert build_request(ct2, messages=ask, tools=[tool], tool_choice="none").request.tools is None


def test_beam_search_options_reach_the_engine_from_langchain_llamaindex_and_the_server(tiny_profile, seen):
    from langchain_inferplug import ChatInferPlug
    from llama_index.core.base.llms.types import ChatMessage

    from inferplug.backends.registry import get_backend
    from llama_index.llms.inferplug import InferPlug
    from tests.server.conftest import start_server

    beams = dict(use_beam_search=True, beam_width=3, length_penalty=0.5, early_stopping="never")
    ChatInferPlug(profile=tiny_profile, max_tokens=4).invoke("hi there", **beams)
    InferPlug(profile=tiny_profile, max_tokens=4, additional_kwargs=beams).chat([ChatMessage(role="user", content="hi")])
    server = start_server(get_backend(tiny_profile))
    try:
        server.client().chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=4, extra_body=beams)
    finally:
        server.stop()
    assert len(seen) == 3
    for request in seen:
        assert {k: getattr(request.params, k) for k in beams} == beams


SCHEMA = {"title": "place", "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def test_a_json_schema_gives_the_same_sampling_params_from_every_front_end(tiny_profile, seen):
    """The constrained output's repetition penalty is the request builder's, not one front end's."""
    from langchain_inferplug import ChatInferPlug
    from llama_index.core.base.llms.types import ChatMessage

    from inferplug.backends.registry import get_backend
    from llama_index.llms.inferplug import InferPlug
    from tests.server.conftest import start_server

    chat = ChatInferPlug(profile=tiny_profile, temperature=0.0, max_tokens=5)
    fmt = {"type": "json_schema", "json_schema": {"name": "place", "schema": SCHEMA}}
    chat.invoke("hi there", response_format=fmt)
    chat.with_structured_output(SCHEMA, include_raw=True).invoke("hi there")
    InferPlug(profile=tiny_profile, temperature=0.0, max_tokens=5).chat([ChatMessage(role="user", content="hi there")],
                                                                        json_schema=SCHEMA)
    server = start_server(get_backend(tiny_profile))
    try:
        server.client().chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi there"}],
                                                temperature=0.0, max_tokens=5, response_format=fmt)
    finally:
        server.stop()
    assert len(seen) == 4
    assert seen[0].params.json_schema == SCHEMA and seen[0].params.repetition_penalty == 1.2
    assert all(request.params == seen[0].params for request in seen), [r.params for r in seen]


def test_the_offline_llm_honours_the_profiles_sampling(tiny_llama_dir, tmp_path):
    from inferplug import LLM, SamplingParams

    profile = tmp_path / "tiny-sampled.toml"
    profile.write_text(f'name = "tiny-sampled"\nbackend = "native"\ndtype = "float32"\n'
                       f'[model]\npath = "{tiny_llama_dir}"\n[sampling]\ntemperature = 0.0\nmax_tokens = 3\n')
    llm = LLM(str(profile), num_kv_blocks=32)
    (by_profile,) = llm.generate("hi there")
    (given,) = llm.generate("hi there", SamplingParams(temperature=0.0, max_tokens=3))
    assert by_profile.usage.completion_tokens == 3
    assert by_profile.outputs[0].token_ids == given.outputs[0].token_ids
    assert len(llm.generate("hi there", SamplingParams(temperature=0.0, max_tokens=5))[0].outputs[0].token_ids) == 5


def test_the_offline_llm_chat_goes_through_the_request_builder(tiny_profile):
    """The builder's tool checks and shaping apply to LLM.chat: a tool history it cannot read is refused before any
    request runs, and tools the template does not render are described in the prompt (frontend/tool_calls)."""
    from inferplug import LLM, SamplingParams

    llm = LLM(tiny_profile, num_kv_blocks=32)
    weather = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                                "parameters": {"type": "object", "properties": {}}}}
    history = [{"role": "user", "content": "weather?"}, {"role": "assistant", "content": None,
                                                         "tool_calls": "get_weather"}]
    with pytest.raises(RequestError, match="tool_calls is not a list of calls") as info:
        llm.chat(history, SamplingParams(temperature=0.0, max_tokens=2), tools=[weather])
    assert info.value.param == "messages" and not llm.engine.has_unfinished()
    (out,) = llm.chat([{"role": "user", "content": "weather?"}], SamplingParams(temperature=0.0, max_tokens=2),
                      tools=[weather])
    assert "get_weather" in out.prompt and len(out.outputs[0].token_ids) == 2


def counted_renders(monkeypatch, tokenizer) -> list:
    """The calls of the model's real chat template from now on (it still renders)."""
    renders, render = [], tokenizer.apply_chat_template

    def counted(*args, **kwargs):
        renders.append(args)
        return render(*args, **kwargs)

    monkeypatch.setattr(tokenizer, "apply_chat_template", counted)
    return renders


@pytest.fixture(scope="module")
def rag_profile(tiny_llama_dir, tmp_path_factory):
    """The tiny model's profile with the RAG document cache on (an opt-in)."""
    from inferplug.backends.registry import close_backend

    path = tmp_path_factory.mktemp("rag") / "tiny-rag.toml"
    path.write_text(f'name = "tiny-rag"\nbackend = "native"\ndtype = "float32"\n[model]\npath = "{tiny_llama_dir}"\n'
                    'served_name = "tiny"\n[cache]\nrag_document_cache = true\n')
    yield str(path)
    close_backend(str(path))


def test_a_request_with_documents_renders_its_chat_once(rag_profile, monkeypatch):
    """The front end hands the documents down; the prompt stage finds them in the one text it renders
    (stages/prompt.document_hints), and the engine stores each document's KV where that text places it."""
    from inferplug.backends.registry import get_backend
    from inferplug.frontend.calls import generate_all
    from inferplug.rag import rag_messages

    backend = get_backend(rag_profile)
    renders = counted_renders(monkeypatch, backend.tokenizer)
    docs = ["The blue door is on Elm Street, next to the old bakery.", "Cats purr when they are warm and content."]
    stored = backend.engine.engine.doc_cache.stored_segments
    prepared = build_request(backend, messages=rag_messages("Where is the blue door?", docs), documents=docs,
                             options={"temperature": 0.0, "max_tokens": 2})
    generate_all(backend, [prepared.request])
    assert len(renders) == 1
    assert backend.engine.engine.doc_cache.stored_segments == stored + len(docs)


@pytest.mark.parametrize("caller", ["llm", "backend"])
def test_a_precompute_request_stores_each_document_and_counts_what_it_stored(rag_profile, monkeypatch, caller):
    """A precompute request (rag/precompute.py) carries its document, and the prompt stage finds its span. The
    offline LLM keeps the prompt stage's result, so it renders each document once; over the Backend protocol that
    result does not come back, so frontend/precompute renders once more to leave out a document the template does
    not keep verbatim (indexing time only)."""
    from inferplug import LLM
    from inferplug.backends.registry import get_backend
    from inferplug.frontend.precompute import precompute_documents

    target = LLM(rag_profile, num_kv_blocks=32) if caller == "llm" else get_backend(rag_profile)
    engine = target.engine if caller == "llm" else target.engine.engine
    renders = counted_renders(monkeypatch, target.tokenizer)
    docs = ["The green gate is on Oak Lane, past the mill.", "Owls hunt at dusk over the wet meadows."]
    stored = engine.doc_cache.stored_segments
    computed = target.precompute_documents(docs) if caller == "llm" else precompute_documents(target, docs)
    assert computed == len(docs) and len(renders) == len(docs) * (1 if caller == "llm" else 2)
    assert engine.doc_cache.stored_segments == stored + len(docs)


@pytest.mark.parametrize("caller", ["llm", "backend"])
def test_a_document_the_template_does_not_keep_verbatim_is_not_precomputed(tiny_llama_dir, tmp_path, caller):
    """A template that changes a message's text (here: upper case) leaves no span of the document to store: it is not
    run and not counted, on both paths (0, not the number of documents sent)."""
    from inferplug import LLM
    from inferplug.backends.registry import close_backend, get_backend
    from inferplug.frontend.precompute import precompute_documents

    path = tmp_path / "upper.toml"
    template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] | upper }} {% endfor %}assistant:"
    path.write_text(f'name = "upper"\nbackend = "native"\ndtype = "float32"\n[model]\npath = "{tiny_llama_dir}"\n'
                    f'served_name = "upper"\nchat_template = "{template}"\n[cache]\nrag_document_cache = true\n')
    target = LLM(str(path), num_kv_blocks=32) if caller == "llm" else get_backend(str(path))
    try:
        engine = target.engine if caller == "llm" else target.engine.engine
        stored = engine.doc_cache.stored_segments
        docs = ["The green gate is on Oak Lane, past the mill."]
        computed = target.precompute_documents(docs) if caller == "llm" else precompute_documents(target, docs)
        assert computed == 0 and engine.doc_cache.stored_segments == stored
    finally:
        if caller == "backend":
            close_backend(str(path))
