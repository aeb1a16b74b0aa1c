"""The CTranslate2 backend, for real on the CPU: greedy output equals HF transformers in float32."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from inferplug.backends.ctranslate2 import CTranslate2Backend  # noqa: E402
from inferplug.stages.output import stop_ids  # noqa: E402
from inferplug.errors import BackendUnavailable, RequestError  # noqa: E402
from inferplug.profile import ModelSource, Profile  # noqa: E402
from inferplug.types import Request, SamplingParams  # noqa: E402


def make_backend(plan_for, model: Path, compute_type: str = "float32") -> CTranslate2Backend:
    profile = Profile(name="ct2-test", backend="ctranslate2", model=ModelSource(path=model))
    profile.ctranslate2.compute_type = compute_type
    profile.ctranslate2.device = "cpu"
    return CTranslate2Backend(profile, plan_for(profile))


def hf_greedy(model_dir: Path, prompt_ids: list[int], max_new_tokens: int, **load_kw) -> list[int]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, **load_kw)
    out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens, do_sample=False,
                         eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt_ids):].tolist()


def collect(backend, request: Request):
    return backend.generate_sync(request)


def ids_of(events, index: int = 0) -> list[int]:
    return [t for e in events if e.index == index for t in e.token_ids]


class Backends(dict):
    """One float32 backend per tiny model, shared by the tests of this module."""

    def __init__(self, plan_for):
        super().__init__()
        self.plan_for = plan_for

    def of(self, model_dir: Path) -> CTranslate2Backend:
        if model_dir not in self:
            self[model_dir] = make_backend(self.plan_for, model_dir)
        return self[model_dir]


@pytest.fixture(scope="module")
def tiny_backends(plan_for):
    made = Backends(plan_for)
    yield made
    for backend in made.values():
        backend.close()


def test_greedy_matches_transformers_float32(tiny_model_dir, tiny_backends):
    backend = tiny_backends.of(tiny_model_dir)
    prompt = [5, 17, 99, 3, 250, 42, 7]
    events = collect(backend, Request(prompt=prompt, params=SamplingParams(temperature=0, max_tokens=12,
                                                                           ignore_eos=True)))
    assert ids_of(events) == hf_greedy(tiny_model_dir, prompt, 12)
    last = events[-1]
    assert last.finish_reason == "length"
    assert last.usage.prompt_tokens == len(prompt) and last.usage.completion_tokens == 12


async def run_queued(backend, blocker: Request, requests: list[Request]):
    """Run `requests` together while a long `blocker` holds the backend's one worker, so they queue up and are
    taken together whatever the timing of their submissions (without it the worker may take each as it comes).
    Returns their events and how many generate_batch calls they took."""
    held = backend.generate(blocker)
    await anext(held)
    before = backend.stats()["batches"]

    async def one(request):
        return [e async for e in backend.generate(request)]
    results = await asyncio.gather(*(one(r) for r in requests))
    async for _ in held:  # let it finish
        pass
    return results, backend.stats()["batches"] - before


def test_concurrent_requests_batch_and_match_single_runs(tiny_llama_dir, tiny_backends):
    backend = tiny_backends.of(tiny_llama_dir)
    prompts = [[3 + i, 40 + 2 * i, 7] * (i + 1) for i in range(6)]
    params = dict(temperature=0, max_tokens=6, ignore_eos=True)
    alone = [ids_of(collect(backend, Request(prompt=p, params=SamplingParams(**params)))) for p in prompts]

    blocker = Request(prompt=[5, 60, 7, 9], params=SamplingParams(temperature=0, max_tokens=400, ignore_eos=True))
    queued = [Request(prompt=p, params=SamplingParams(**params)) for p in prompts]
    results, batches = backend.run_sync(run_queued(backend, blocker, queued))
    assert [ids_of(r) for r in results] == alone
    assert batches == 1  # the six ran in one generate_batch


def test_static_system_prompt_is_cached_and_output_unchanged(tiny_llama_dir, tiny_backends):
    backend = tiny_backends.of(tiny_llama_dir)
    messages = [{"role": "system", "content": "You answer in one short sentence."},
                {"role": "user", "content": "hello there"}]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    first = collect(backend, Request(messages=messages, params=params))
    second = collect(backend, Request(messages=messages, params=SamplingParams(**vars(params))))
    text = backend.apply_chat_template(messages)
    prompt = backend.tokenizer.encode(text, add_special_tokens=False)
    expected = hf_greedy(tiny_llama_dir, prompt, 8)
    assert ids_of(first) == ids_of(second) == expected  # no leftover prompt tokens in the output
    assert first[-1].usage.cached_tokens == 0
    assert 0 < second[-1].usage.cached_tokens < len(prompt)


def test_static_system_prompt_follows_the_profile_chat_template(tiny_llama_dir, plan_for):
    profile = Profile(name="ct2-template", backend="ctranslate2", model=ModelSource(
        path=tiny_llama_dir, chat_template="{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
                                           "{% if add_generation_prompt %}[assistant] {% endif %}"))
    profile.ctranslate2.compute_type = "float32"
    profile.ctranslate2.device = "cpu"
    backend = CTranslate2Backend(profile, plan_for(profile))
    try:
        messages = [{"role": "system", "content": "You answer in one short sentence."},
                    {"role": "user", "content": "hello there"}]
        params = dict(temperature=0, max_tokens=8, ignore_eos=True)
        first = collect(backend, Request(messages=messages, params=SamplingParams(**params)))
        second = collect(backend, Request(messages=messages, params=SamplingParams(**params)))
        text = backend.apply_chat_template(messages)
        assert text.startswith("[system] You answer")  # the profile's template, not the tokenizer's
        prompt = backend.tokenizer.encode(text, add_special_tokens=False)
        assert ids_of(first) == ids_of(second) == hf_greedy(tiny_llama_dir, prompt, 8)
        system_len = len(backend.tokenizer.encode("[system] You answer in one short sentence.\n",
                                                  add_special_tokens=False))
        assert first[-1].usage.cached_tokens == 0 and system_len <= second[-1].usage.cached_tokens < len(prompt)
    finally:
        backend.close()


def test_requests_with_different_max_tokens_share_a_batch(tiny_llama_dir, tiny_backends):
    backend = tiny_backends.of(tiny_llama_dir)
    limits = [2, 3, 5, 8]

    def request(limit):
        return Request(prompt=[5, 60, 7, 9], params=SamplingParams(temperature=0, max_tokens=limit, ignore_eos=True))

    longest = ids_of(collect(backend, request(max(limits))))

    results, batches = backend.run_sync(run_queued(backend, request(400), [request(limit) for limit in limits]))
    for limit, events in zip(limits, results):
        assert ids_of(events) == longest[:limit]  # each stops at its own limit
        assert events[-1].finish_reason == "length" and events[-1].usage.completion_tokens == limit
    assert batches == 1  # the four ran in one generate_batch


def test_n_choices_stop_strings_and_logprobs(tiny_llama_dir, tiny_backends):
    backend = tiny_backends.of(tiny_llama_dir)
    greedy = collect(backend, Request(prompt="the weather", params=SamplingParams(temperature=0, max_tokens=10,
                                                                                  ignore_eos=True)))
    text = "".join(e.text for e in greedy)
    stop = text[3:5]
    events = collect(backend, Request(prompt="the weather", params=SamplingParams(
        temperature=0, max_tokens=10, ignore_eos=True, n=2, stop=[stop], logprobs=0)))
    for index in (0, 1):
        mine = [e for e in events if e.index == index]
        assert "".join(e.text for e in mine) == text[: text.index(stop)]
        assert mine[-1].finish_reason == "stop" and mine[-1].stop_reason == stop
        assert all(lp.logprob <= 0 for e in mine for lp in e.logprobs or [])
    assert events[-1].usage is not None


@pytest.mark.parametrize("ignore_eos", [False, True])
def test_stop_token_ids_end_the_choice_even_with_ignore_eos(tiny_llama_dir, tiny_backends, ignore_eos):
    """ignore_eos ignores EOS only, never the explicit stop ids (as in vLLM and the native engine)."""
    backend = tiny_backends.of(tiny_llama_dir)
    full = collect(backend, Request(prompt="the weather", params=SamplingParams(temperature=0, max_tokens=12,
                                                                                ignore_eos=True)))
    ids = ids_of(full)
    stop_id = ids[4]
    cut = collect(backend, Request(prompt="the weather", params=SamplingParams(
        temperature=0, max_tokens=12, stop_token_ids=[stop_id], ignore_eos=ignore_eos, n=2)))
    for index in (0, 1):
        mine = [e for e in cut if e.index == index]
        assert ids_of(mine, index) == ids[: ids.index(stop_id) + 1]
        assert mine[-1].finish_reason == "stop" and mine[-1].stop_reason == stop_id
    assert stop_ids(SamplingParams(ignore_eos=ignore_eos, stop_token_ids=[stop_id]), {2}) == (
        {stop_id} if ignore_eos else {stop_id, 2})  # what CTranslate2 is told to stop on


def test_bad_requests_fail_alone(tiny_llama_dir, tiny_backends):
    backend = tiny_backends.of(tiny_llama_dir)
    with pytest.raises(RequestError, match="context"):
        collect(backend, Request(prompt=[1] * backend.context_length))
    with pytest.raises(RequestError, match="min_p"):
        collect(backend, Request(prompt="hi", params=SamplingParams(min_p=0.1)))
    with pytest.raises(RequestError, match="vocabulary"):
        collect(backend, Request(prompt=[10**6]))
    ok = collect(backend, Request(prompt="hi", params=SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)))
    assert ok[-1].finish_reason == "length"


def test_abort_ends_the_stream(tiny_llama_dir, tiny_backends, abort_midway):
    abort_midway(tiny_backends.of(tiny_llama_dir))


def test_conversion_is_cached(tiny_llama_dir):
    from inferplug.backends.ct2_convert import converted_model_dir

    first = converted_model_dir(tiny_llama_dir, "float32")
    marker_mtime = (first / "inferplug-converted.json").stat().st_mtime_ns
    assert converted_model_dir(tiny_llama_dir, "float32") == first
    assert (first / "inferplug-converted.json").stat().st_mtime_ns == marker_mtime
    assert converted_model_dir(tiny_llama_dir, "int8") != first


def test_int8_runs_and_unsupported_compute_types_are_named(tiny_llama_dir, plan_for):
    import ctranslate2

    backend = make_backend(plan_for, tiny_llama_dir, compute_type="int8")
    try:
        events = collect(backend, Request(prompt=[1, 2, 3], params=SamplingParams(temperature=0, max_tokens=4,
                                                                                  ignore_eos=True)))
        assert len(ids_of(events)) == 4 and backend.compute_type == "int8"
    finally:
        backend.close()
    missing = sorted({"bfloat16", "float16", "int8_float16"} - ctranslate2.get_supported_compute_types("cpu"))
    if missing:
        with pytest.raises(BackendUnavailable, match=f"cannot compute in {missing[0]}.*compute_type"):
            make_backend(plan_for, tiny_llama_dir, compute_type=missing[0])


@pytest.mark.smollm2
@pytest.mark.slow
def test_smollm2_gguf_greedy_matches_transformers(smollm2_gguf, plan_for):
    backend = make_backend(plan_for, smollm2_gguf)
    try:
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        events = collect(backend, Request(messages=messages, params=SamplingParams(temperature=0, max_tokens=16)))
        prompt = backend.tokenizer.encode(backend.apply_chat_template(messages), add_special_tokens=False)
        expected = hf_greedy(smollm2_gguf.parent, prompt, 16, gguf_file=smollm2_gguf.name)
        # HF ran past any end token; the backend stops at the first one and, as vLLM, returns its id last.
        ends = {*backend.config.eos_token_ids, backend.tokenizer.eos_token_id}
        stop = next((i + 1 for i, token in enumerate(expected) if token in ends), None)
        assert ids_of(events) == expected[:stop]
        assert events[-1].finish_reason == ("length" if stop is None else "stop")
    finally:
        backend.close()


def test_tokens_go_straight_to_the_caller_whose_thread_runs_the_output_stage(tiny_llama_dir, plan_for, monkeypatch):
    """One hop: CTranslate2's decoding thread sends raw tokens into the caller's EventChannel, and the caller's
    thread runs the output stage (detokenizing, the stop string), not the per-token callback; no loop of the
    backend's own carries them. A caller that reads them all at the end (one wake-up) still gets the timings of
    when they were made. A stop string found on the caller's side still stops the example's row."""
    from inferplug.backends.bridge import EventChannel
    from inferplug.stages.output import ChoiceOutput

    sent, staged = [], []  # (thread, perf_counter time, item) of each raw item sent; (thread, time) of each text made
    real_send, real_text = EventChannel.send, ChoiceOutput.text

    def send(channel, items, *, last=False):
        sent.extend((threading.get_ident(), time.perf_counter(), item) for item in items)
        real_send(channel, items, last=last)

    def text(choice, *args, **kwargs):
        staged.append((threading.get_ident(), time.perf_counter()))
        return real_text(choice, *args, **kwargs)

    monkeypatch.setattr(EventChannel, "send", send)
    monkeypatch.setattr(ChoiceOutput, "text", text)
    backend = make_backend(plan_for, tiny_llama_dir)
    params = dict(temperature=0, max_tokens=300, ignore_eos=True)
    try:
        alone = collect(backend, Request(prompt="the weather", params=SamplingParams(**params)))
        made = [item[-1] for _, _, item in sent if item[0] == "token"]  # when CTranslate2 made each token
        assert min(at for _, at in staged) >= made[-1]  # read once, after the last token was made
        timings = alone[-1].timings  # yet its decode time is the tokens' own, not the reading's
        assert timings.e2e - timings.ttft == pytest.approx(made[-1] - made[0], abs=1e-6)
        full = "".join(e.text for e in alone)
        stop = full[3:5]
        sent.clear(), staged.clear()
        events = collect(backend, Request(prompt="the weather", params=SamplingParams(**params, stop=[stop])))
        assert "".join(e.text for e in events) == full[: full.index(stop)] and events[-1].stop_reason == stop
        assert backend._loop is None  # the backend never made its background loop
    finally:
        backend.close()
    caller = threading.get_ident()
    tokens = [thread for thread, _, item in sent if item[0] == "token"]
    assert staged and {thread for thread, _ in staged} == {caller}  # every token's text made on the caller's thread
    assert tokens and caller not in tokens  # and sent to it from CTranslate2's own
    assert len(tokens) < 100  # the stop string ended its row long before max_tokens


def test_close_ends_open_requests_and_refuses_later_ones(tiny_llama_dir, plan_for, close_midway):
    """A stream open when the backend closes ends with BackendUnavailable at once (its row stops), and so does one
    sent after close, instead of waiting forever; a cancel after close returns."""
    backend = make_backend(plan_for, tiny_llama_dir)
    close_midway(backend)
    deadline = time.monotonic() + 10  # its batch ends: the stopped row is not decoded to its 400 tokens
    while backend._batcher.running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not backend._batcher.running and not backend._batcher._jobs
