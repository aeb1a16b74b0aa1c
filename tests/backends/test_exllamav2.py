"""The ExLlamaV2 backend: a contract test against the fake `exllamav2` (tests/fakes, same API as
0.3.2, tokens from transformers on the CPU), the resolver's rejection without a GPU, and real
tests on a CUDA machine."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from inferplug.errors import BackendUnavailable, GenerationError, ResolveError
from inferplug.hardware import GPU, Hardware
from inferplug.profile import ModelSource, Profile
from inferplug.types import Request, SamplingParams

FAKES = Path(__file__).resolve().parent.parent / "fakes"
GB = 10**9
CUDA_BOX = Hardware(cpu_flags=frozenset({"avx2"}), cpu_count=16, ram_total=64 * GB, ram_available=60 * GB,
                    gpus=(GPU(0, "NVIDIA A100-SXM4-80GB", (8, 0), 80 * GB, 79 * GB),), cuda_version="12.4",
                    packages=frozenset({"torch", "transformers", "exllamav2", "flash_attn", "httpx"}))


def exl2_profile(model_dir: Path, **exllamav2) -> Profile:
    profile = Profile(name="exl2-test", backend="exllamav2", model=ModelSource(path=model_dir))
    profile.quantization.format = "exl2"
    for key, value in exllamav2.items():
        setattr(profile.exllamav2, key, value)
    return profile


@pytest.fixture
def fake_exllamav2(monkeypatch):
    """`import exllamav2` finds the fake for the duration of a test."""
    monkeypatch.syspath_prepend(str(FAKES))
    for name in [m for m in sys.modules if m == "exllamav2" or m.startswith("exllamav2.")]:
        monkeypatch.delitem(sys.modules, name)
    yield
    for name in [m for m in sys.modules if m == "exllamav2" or m.startswith("exllamav2.")]:
        del sys.modules[name]


@pytest.fixture
def sent(fake_exllamav2, monkeypatch):
    """What our backend hands ExLlamaV2: each job's arguments bound to the real 0.3.2 signature, and which
    jobs ended (an eos result, or our cancel). The real job and generator swallow unknown keywords into
    **kwargs; here they fail, so a misspelt option cannot vanish silently."""
    import inspect

    import exllamav2.generator as gen

    log = {"args": [], "made": [], "ended": set()}
    real_job, real_generator = gen.ExLlamaV2DynamicJob, gen.ExLlamaV2DynamicGenerator

    def bind(cls, *args, **kwargs) -> dict:
        bound = inspect.signature(cls.__init__).bind(None, *args, **kwargs).arguments
        assert not bound.get("kwargs"), f"{cls.__name__} has no arguments {sorted(bound['kwargs'])}"
        return bound

    class Job(real_job):
        def __init__(self, *args, **kwargs):
            log["args"].append(bind(real_job, *args, **kwargs))
            log["made"].append(self)
            super().__init__(*args, **kwargs)

    class Generator(real_generator):
        def __init__(self, *args, **kwargs):
            bind(real_generator, *args, **kwargs)
            super().__init__(*args, **kwargs)

        def cancel(self, job):
            log["ended"].add(job)
            super().cancel(job)

        def iterate(self):
            results = super().iterate()
            log["ended"].update(r["job"] for r in results if r.get("eos"))
            return results

    monkeypatch.setattr(gen, "ExLlamaV2DynamicJob", Job)
    monkeypatch.setattr(gen, "ExLlamaV2DynamicGenerator", Generator)
    return log


def all_jobs_released(backend, sent) -> bool:
    """Every job our backend made ended (finished or cancelled by us) and the generator holds none."""
    jobs = backend._worker.generator.active_jobs + backend._worker.generator.pending_jobs
    return not jobs and bool(sent["made"]) and all(job in sent["ended"] for job in sent["made"])


@pytest.fixture
def make_backend(sent):
    from inferplug.backends.exllamav2 import ExLlamaV2Backend
    from inferplug.resolver import resolve

    made = []

    def make(model_dir: Path, **exllamav2):
        profile = exl2_profile(model_dir, **exllamav2)
        plan = resolve(profile, CUDA_BOX)
        assert plan.backend == "exllamav2" and plan.attention == "flash"
        made.append(ExLlamaV2Backend(profile, plan))
        return made[-1]

    yield make
    for backend in made:
        backend.close()


def hf_greedy(model_dir: Path, prompt: list[int], n: int) -> list[int]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def ids_of(events, index=0) -> list[int]:
    return [t for e in events if e.index == index for t in e.token_ids]


def pages_in_use(backend) -> int:
    return backend.stats()["kv_blocks_used"]


def test_greedy_matches_transformers_with_rope_theta_from_rope_parameters(make_backend, sent, tiny_model_dir):
    # The tiny Qwen2 keeps rope_theta=1e6 in transformers 5's rope_parameters only: ExLlamaV2Config
    # alone would run it at 10000 and diverge from HF.
    backend = make_backend(tiny_model_dir)
    prompt = [5, 17, 99, 3, 250, 42, 7]
    events = backend.generate_sync(Request(prompt=prompt, params=SamplingParams(temperature=0, max_tokens=10,
                                                                                ignore_eos=True)))
    assert ids_of(events) == hf_greedy(tiny_model_dir, prompt, 10)
    assert events[-1].finish_reason == "length" and events[-1].usage.completion_tokens == 10
    assert all_jobs_released(backend, sent)


def test_n_choices_share_prompt_pages_and_free_them(make_backend, sent, tiny_llama_dir):
    backend = make_backend(tiny_llama_dir)
    prompt = [10 + i % 250 for i in range(300)]  # more than one full 256-token page
    params = SamplingParams(temperature=0.9, top_k=40, seed=3, max_tokens=6, ignore_eos=True, n=3)
    events = backend.generate_sync(Request(prompt=prompt, params=params))
    assert {e.index for e in events if e.finish_reason} == {0, 1, 2}
    assert events[-1].usage.completion_tokens == 18 and events[-1].usage.cached_tokens == 256
    again = backend.generate_sync(Request(prompt=prompt, params=SamplingParams(**{**vars(params), "n": 3})))
    assert [ids_of(again, i) for i in range(3)] == [ids_of(events, i) for i in range(3)]
    assert all_jobs_released(backend, sent) and backend.stats()["prefix_hit_rate"] > 0


def test_stop_string_and_stop_token_end_the_job_and_free_its_pages(make_backend, sent, tiny_llama_dir):
    backend = make_backend(tiny_llama_dir)
    greedy = dict(temperature=0, max_tokens=12, ignore_eos=True)
    full = backend.generate_sync(Request(prompt="the weather", params=SamplingParams(**greedy)))
    text, ids = "".join(e.text for e in full), ids_of(full)
    stop = text[3:5]
    cut = backend.generate_sync(Request(prompt="the weather", params=SamplingParams(**greedy, stop=[stop])))
    assert "".join(e.text for e in cut) == text[: text.index(stop)] and cut[-1].stop_reason == stop
    for ignore_eos in (False, True):  # ignore_eos ignores EOS, never the explicit stop ids (as native, vLLM)
        by_id = backend.generate_sync(Request(prompt="the weather", params=SamplingParams(
            temperature=0, max_tokens=12, stop_token_ids=[ids[4]], ignore_eos=ignore_eos)))
        assert ids_of(by_id) == ids[: ids.index(ids[4]) + 1]
        assert by_id[-1].finish_reason == "stop" and by_id[-1].stop_reason == ids[4]
        assert all_jobs_released(backend, sent)


def test_results_go_straight_to_the_caller_whose_thread_runs_the_output_stage(make_backend, sent, tiny_llama_dir,
                                                                                monkeypatch):
    """One hop: the generator's thread sends each step's raw tokens into the caller's EventChannel, and the
    caller's thread runs the output stage (no loop of the backend's own in between); a stop string it finds
    there still cancels the choice's job, its pages freed before the call returns."""
    import threading

    from inferplug.backends.bridge import EventChannel
    from inferplug.stages.output import ChoiceOutput

    senders, staged = set(), set()
    real_send, real_text = EventChannel.send, ChoiceOutput.text

    def send(channel, items, *, last=False):
        senders.add(threading.get_ident())
        real_send(channel, items, last=last)

    def text(choice, *args, **kwargs):
        staged.add(threading.get_ident())
        return real_text(choice, *args, **kwargs)

    backend = make_backend(tiny_llama_dir)
    greedy = dict(temperature=0, max_tokens=40, ignore_eos=True)
    alone = backend.generate_sync(Request(prompt="the weather", params=SamplingParams(**greedy)))
    full = "".join(e.text for e in alone)
    monkeypatch.setattr(EventChannel, "send", send)
    monkeypatch.setattr(ChoiceOutput, "text", text)
    stop = full[3:5]
    events = backend.generate_sync(Request(prompt="the weather", params=SamplingParams(**greedy, stop=[stop], n=2)))
    for index in (0, 1):
        assert "".join(e.text for e in events if e.index == index) == full[: full.index(stop)]
    assert staged == {threading.get_ident()} and senders == {backend._worker._thread.ident}
    assert backend._loop is None and all_jobs_released(backend, sent)


def test_abort_cancels_the_job(make_backend, sent, tiny_llama_dir, abort_midway):
    backend = make_backend(tiny_llama_dir)
    abort_midway(backend, max_tokens=200)
    assert all_jobs_released(backend, sent) and backend.stats()["running"] == 0


def test_a_job_the_generator_refuses_fails_its_request_alone(make_backend, sent, tiny_llama_dir, monkeypatch):
    """enqueue raising (ExLlamaV2 asserts that a job's pages fit its cache) fails that request with the reason: its
    choices already queued are cancelled, their pages freed, and the worker goes on."""
    backend = make_backend(tiny_llama_dir)
    generator = backend._worker.generator
    real_enqueue, full = generator.enqueue, generator.max_pages

    def enqueue(job):  # the second choice's job finds no page in the cache
        generator.max_pages = full if job.identifier == 0 else 0
        try:
            return real_enqueue(job)
        finally:
            generator.max_pages = full

    monkeypatch.setattr(generator, "enqueue", enqueue)
    params = SamplingParams(temperature=0.9, seed=1, max_tokens=4, ignore_eos=True, n=2)
    with pytest.raises(GenerationError, match=r"ExLlamaV2 refused the request \(AssertionError: Job requires 1 pages"):
        backend.generate_sync(Request(prompt="the weather", params=params))
    assert sent["made"][0] in sent["ended"] and not generator.active_jobs + generator.pending_jobs
    assert pages_in_use(backend) == 0 and not backend._worker.open
    after = backend.generate_sync(Request(prompt="the weather", params=SamplingParams(temperature=0, max_tokens=3,
                                                                                      ignore_eos=True)))
    assert after[-1].usage.completion_tokens == 3


def test_a_dying_worker_ends_every_open_stream_and_refuses_later_requests(make_backend, sent, tiny_llama_dir,
                                                                         monkeypatch):
    """A fault outside a step stops the worker thread; here the generator's cancel breaks (a CUDA fault, say). The
    cancel that broke it still returns, the open stream ends with BackendUnavailable and the reason, a later request
    is refused and a later cancel returns at once."""
    backend = make_backend(tiny_llama_dir)
    long = Request(prompt="the weather", params=SamplingParams(temperature=0, max_tokens=400, ignore_eos=True))
    stream = backend.stream_sync(long)
    next(stream)  # decoding

    def broken(job):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(backend._worker.generator, "cancel", broken)
    backend.cancel_now(long.request_id)  # returns, though the worker dies on it
    with pytest.raises(BackendUnavailable, match="worker stopped .*illegal memory access"):
        list(stream)
    with pytest.raises(BackendUnavailable):
        backend.generate_sync(Request(prompt="hi", params=SamplingParams(max_tokens=2)))
    backend.cancel_now(long.request_id)
    backend._worker._thread.join(timeout=10)  # the stream ended before the worker finished draining
    assert not backend._worker._thread.is_alive() and not backend._worker.open and not backend._worker.requests


def test_a_cancel_its_caller_gave_up_on_leaves_the_worker_serving(make_backend, sent, tiny_llama_dir):
    """A cancel's future cancelled before the worker takes the command (the server's abort awaits it through
    wrap_future, which cancels it with its task): the worker still cancels the request and goes on serving."""
    from concurrent.futures import Future

    backend = make_backend(tiny_llama_dir)
    long = Request(prompt="the weather", params=SamplingParams(temperature=0, max_tokens=400, ignore_eos=True))
    stream = backend.stream_sync(long)
    next(stream)
    given_up: Future = Future()
    given_up.cancel()
    backend._worker.commands.put(("cancel", long.request_id, None, given_up))
    assert {e.finish_reason for e in stream} >= {"abort"}
    after = backend.generate_sync(Request(prompt="hi", params=SamplingParams(temperature=0, max_tokens=3,
                                                                             ignore_eos=True)))
    assert after[-1].usage.completion_tokens == 3 and backend._worker._thread.is_alive()
    assert all_jobs_released(backend, sent)


SAMPLED = dict(temperature=0.7, top_k=20, top_p=0.9, min_p=0.05, repetition_penalty=1.1, presence_penalty=0.3,
               frequency_penalty=0.2)
PENALTIES = dict(token_repetition_penalty=1.1, token_presence_penalty=0.3, token_frequency_penalty=0.2)


@pytest.mark.parametrize("options, settings", [
    (SAMPLED, dict(temperature=0.7, top_k=20, top_p=0.9, min_p=0.05, **PENALTIES)),
    # greedy: ExLlamaV2's greedy settings (top_k 1), the penalties kept (they move the argmax)
    ({**SAMPLED, "temperature": 0.0}, dict(top_k=1, top_p=0.0, **PENALTIES)),
    ({"temperature": 1.0, "top_k": -1}, dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
                                             token_repetition_penalty=1.0)),  # top_k -1 and 0 both disable it
])
def test_request_options_reach_the_job_and_its_settings(make_backend, sent, tiny_llama_dir, options, settings):
    backend = make_backend(tiny_llama_dir)
    params = SamplingParams(**options, seed=5, n=2, min_tokens=2, max_tokens=5, stop_token_ids=[9], stop=["zq"],
                            logprobs=2)
    events = backend.generate_sync(Request(prompt=[4, 5, 6], params=params))
    assert {e.index for e in events if e.finish_reason} == {0, 1}
    eos = backend._eos_ids()
    for index, job in enumerate(sent["args"]):
        assert job["input_ids"].tolist() == [[4, 5, 6]] and job["identifier"] == index
        assert job["max_new_tokens"] == 5 and job["min_new_tokens"] == 2 and job["seed"] == 5 + index
        # stop strings stay with our output stage (ChoiceOutput), which cancels the job on one
        assert sorted(job["stop_conditions"]) == sorted({9, *eos})
        assert job["return_probs"] is True and job["return_top_tokens"] == 2
        assert {k: getattr(job["gen_settings"], k) for k in settings} == settings
    assert len(sent["args"]) == 2 and all_jobs_released(backend, sent)


def test_settings_and_job_take_only_the_real_arguments(fake_exllamav2):
    """The fake's Settings is the real dataclass's field list: an unknown one is a TypeError there too."""
    import exllamav2.generator as gen

    with pytest.raises(TypeError):
        gen.ExLlamaV2Sampler.Settings(repetition_penalty=1.1)  # the real name is token_repetition_penalty
    with pytest.raises(TypeError):
        gen.ExLlamaV2Sampler.Settings.greedy(presence_penalty=0.5)


def test_logprobs_with_top_tokens(make_backend, tiny_llama_dir):
    backend = make_backend(tiny_llama_dir)
    events = backend.generate_sync(Request(prompt=[1, 2, 3], params=SamplingParams(
        temperature=0.7, top_k=0, seed=1, max_tokens=4, ignore_eos=True, logprobs=3)))
    entries = [lp for e in events for lp in e.logprobs or []]
    assert len(entries) == 4
    for entry in entries:
        assert len(entry.top) == 3 and entry.logprob <= 0
        assert entry.logprob <= entry.top[0][2] + 1e-6


def test_ngram_draft_still_returns_max_tokens(make_backend, tiny_llama_dir):
    backend = make_backend(tiny_llama_dir, max_draft=4)
    events = backend.generate_sync(Request(prompt=[7, 8, 9], params=SamplingParams(temperature=0, max_tokens=9,
                                                                                   ignore_eos=True)))
    assert len(ids_of(events)) == 9 and events[-1].finish_reason == "length"
    assert ids_of(events) == hf_greedy(tiny_llama_dir, [7, 8, 9], 9)


def test_without_a_gpu_the_resolver_rejects_it_with_a_reason(tiny_llama_dir):
    from inferplug.hardware import probe
    from inferplug.resolver import resolve

    hardware = dataclasses.replace(probe(), gpus=())  # this machine's facts, as if it had no GPU
    with pytest.raises(ResolveError, match="CUDA GPU"):
        resolve(exl2_profile(tiny_llama_dir), hardware)
    assert "exllamav2" not in sys.modules  # importing inferplug never builds its CUDA extension


def test_missing_package_is_a_clear_error(monkeypatch):
    from inferplug.backends.exllamav2 import import_exllamav2
    from inferplug.errors import BackendUnavailable

    monkeypatch.setitem(sys.modules, "exllamav2", None)  # import fails as when it is not installed
    with pytest.raises(BackendUnavailable, match="CUDA GPU"):
        import_exllamav2()


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


@pytest.mark.cuda
@pytest.mark.skipif(not _has_cuda(), reason="needs a CUDA GPU")
def test_real_exllamav2_matches_transformers_on_gpu(tiny_llama_dir):
    pytest.importorskip("exllamav2")
    from inferplug.backends.exllamav2 import ExLlamaV2Backend
    from inferplug.hardware import probe
    from inferplug.resolver import resolve

    profile = exl2_profile(tiny_llama_dir)
    backend = ExLlamaV2Backend(profile, resolve(profile, probe()))
    try:
        prompt = [5, 17, 99, 3, 250, 42, 7]
        events = backend.generate_sync(Request(prompt=prompt, params=SamplingParams(
            temperature=0, max_tokens=8, ignore_eos=True)))
        assert ids_of(events)[:4] == hf_greedy(tiny_llama_dir, prompt, 4)  # fp16 vs fp32: the first tokens
        assert pages_in_use(backend) == 0
    finally:
        backend.close()


def test_close_ends_open_requests_frees_their_pages_and_refuses_later_ones(make_backend, sent, tiny_llama_dir,
                                                                           close_midway):
    """A stream open when the backend closes ends with BackendUnavailable, its job cancelled by us (pages freed)
    before the model unloads; one sent after close is refused at once, and a cancel after close returns."""
    backend = make_backend(tiny_llama_dir)
    close_midway(backend)
    assert all_jobs_released(backend, sent)
