"""Tensor parallel (engine/parallel) on the CPU over gloo: the same greedy tokens as one process, logits close,
through chunked prefill, prefix-cache hits and preemption; bad sizes refused; no worker process outlives its engine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest
import torch

from inferplug.errors import ProfileError
from inferplug.models.loader import read_config
from inferplug.models.registry import family
from inferplug.types import Request, SamplingParams
from tests.engine.engine_helpers import greedy, make_engine, prompts_of, run_all, tokens_of


@pytest.fixture(autouse=True)
def no_worker_left():
    yield
    children = psutil.Process().children(recursive=True)
    workers = [p for p in children if "spawn_main" in " ".join(_cmdline(p))]  # not the resource tracker
    assert not workers, f"worker processes left: {workers}"


def _cmdline(process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def _requests() -> tuple[list[Request], dict[int, list[Request]]]:
    """Staggered requests; two share a 40-token prefix (the second hits the cache), one asks for logprobs."""
    prompts = prompts_of([70, 9, 33, 120], seed=5)
    shared = prompts[0][:40] + prompts_of([12], seed=6)[0]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=5)
    requests = [Request(prompt=p, params=greedy(10 + i), request_id=str(i)) for i, p in enumerate(prompts)]
    requests.append(Request(prompt=shared, params=params, request_id="prefix-hit"))
    return requests[:2], {2: requests[2:4], 6: requests[4:]}


def _run(model_dir, tp: int, **overrides):
    """Every request's events, and the engine's stats, at `tp` ranks; a small pool forces a preemption and a small
    token budget chunks the prefills."""
    engine = make_engine(model_dir, tensor_parallel_size=tp, num_kv_blocks=18, max_num_batched_tokens=32, **overrides)
    try:
        first, arrivals = _requests()
        return run_all(engine, first, arrivals), engine.stats()
    finally:
        engine.close()


def test_two_ranks_match_one(tiny_model_dir):
    one, one_stats = _run(tiny_model_dir, 1)
    two, two_stats = _run(tiny_model_dir, 2)
    assert two_stats["preemptions"] > 0 and two_stats["prefix_hit_tokens"] > 0
    for rid in one:
        assert tokens_of(two[rid]) == tokens_of(one[rid]), f"request {rid}"
    tops = [[lp for e in run["prefix-hit"] for step in e.logprobs or [] for _, _, lp in step.top] for run in (one, two)]
    assert len(tops[0]) == 60
    torch.testing.assert_close(torch.tensor(tops[1]), torch.tensor(tops[0]), atol=1e-4, rtol=1e-4)


def _family_tokens(model_dir, tp: int, prompts: list[list[int]]) -> dict[str, list[int]]:
    engine = make_engine(model_dir, tensor_parallel_size=tp, max_num_batched_tokens=32)
    try:
        events = run_all(engine, [Request(prompt=p, params=greedy(10), request_id=str(i)) for i, p in enumerate(prompts)])
        return {rid: tokens_of(e) for rid, e in events.items()}
    finally:
        engine.close()


def test_two_ranks_match_one_for_every_family(tiny_family_dir):
    """Qwen3's QK-norm weights are per head dimension, so every rank holds them whole; Qwen3-MoE splits each expert
    as a dense MLP is split (gate/up rows, down columns: every rank reads every chosen expert, a slice of each, and
    the all-reduce sums them), the router whole on every rank so all ranks choose alike; Gemma 3's sandwich norms
    run on the reduced sums. Qwen3.5 is refused, and says why; so is the tiny Gemma 4 at 2 ranks, whose full layers
    have one KV head (the test below splits one with two)."""
    prompts = prompts_of([70, 9, 33], vocab=256, seed=5)
    config = read_config(tiny_family_dir)
    if family(config.family).tensor_parallel_why:
        with pytest.raises(ProfileError, match=f"does not split a {config.family} model"):
            make_engine(tiny_family_dir, tensor_parallel_size=2)
        return
    if config.layer_kv_heads and min(config.layer_kv_heads) == 1:
        from inferplug.errors import ResolveError
        from inferplug.hardware import probe
        from inferplug.profile import load_profile
        from inferplug.resolver import resolve

        refusal = "does not divide the model's 1 KV heads in some layers"
        with pytest.raises(ProfileError, match=refusal):
            make_engine(tiny_family_dir, tensor_parallel_size=2)
        profile = load_profile(str(tiny_family_dir))
        profile.parallel.tensor_parallel_size = 2
        with pytest.raises(ResolveError, match=refusal):  # resolve says so before any load
            resolve(profile, probe())
        return
    assert _family_tokens(tiny_family_dir, 2, prompts) == _family_tokens(tiny_family_dir, 1, prompts)


def test_two_ranks_match_one_for_gemma4(tiny_gemma4_split_dir):
    """Gemma 4 split: each layer's own head size and KV heads halved per rank (V from K on the full layers), the
    shared-KV layers reading their source's slice on the same rank, the per-layer input tables and projections
    whole on every rank, the dense MLP and each expert split, the router's and the experts' scales whole."""
    prompts = prompts_of([70, 9, 33], vocab=256, seed=5)
    assert _family_tokens(tiny_gemma4_split_dir, 2, prompts) == _family_tokens(tiny_gemma4_split_dir, 1, prompts)


def test_beam_search_and_prompt_lookup_at_two_ranks_match_one(tiny_llama_dir):
    """A beam's copy on write copies the block on every rank; verification rows split like any other row."""
    prompt = prompts_of([21], seed=8)[0] * 2  # repeats: prompt lookup finds proposals
    beam = Request(prompt=prompt, request_id="beam", params=SamplingParams(
        max_tokens=10, ignore_eos=True, use_beam_search=True, beam_width=3))
    lookup = Request(prompt=prompt, request_id="lookup", params=greedy(12))
    results = []
    for tp in (1, 2):
        events = {}
        for request, spec in ((beam, {}), (lookup, dict(speculative_method="ngram", num_speculative_tokens=3))):
            engine = make_engine(tiny_llama_dir, tensor_parallel_size=tp, **spec)
            try:
                events |= run_all(engine, [request])
                assert not spec or engine.stats()["spec_accepted_tokens"] > 0
            finally:
                engine.close()
        results.append(events)
    one, two = results
    assert all(tokens_of(two[rid]) == tokens_of(one[rid]) for rid in one)
    # a block missing on rank 1 moved this score by 7e-5 (the tiny model is sure of its tokens)
    assert two["beam"][-1].beam_score == pytest.approx(one["beam"][-1].beam_score, abs=1e-6)


def test_a_size_that_does_not_divide_the_heads_is_refused(tiny_llama_dir):
    with pytest.raises(ProfileError, match=r"tensor_parallel_size = 3 does not divide the model's 4 attention heads.*\[1, 2\]"):
        make_engine(tiny_llama_dir, tensor_parallel_size=3)


@pytest.mark.smollm2
def test_smollm2_q4_three_ranks_match_one(smollm2_gguf):
    """The default profile's Q4_1 blocks, split by whole heads: 9 heads / 3 KV heads divide by 3, not 2. The prompt's
    logprobs (float prefill rows) match closely; then the greedy tokens match up to a near-tie, if any. Decode rows
    quantize their activations to int8 (as llama.cpp does), so the all-reduce's other summation order moves a decode
    logprob by up to ~0.1 (measured against 1e-6 with float layers): a tie closer than that may break either way."""
    results = []
    for tp in (1, 3):
        engine = make_engine(smollm2_gguf, tensor_parallel_size=tp, num_kv_blocks=32, max_num_batched_tokens=64,
                             threads_per_rank=1, weight_format="int4")
        try:
            prompts = [engine.encode(Request(messages=[{"role": "user", "content": q}]))[0]
                       for q in ("What is the capital of France?", "List three prime numbers.")]
            events = run_all(engine, [Request(prompt=p, params=greedy(16, logprobs=5), request_id=str(i))
                                      for i, p in enumerate(prompts)])
            results.append([[lp for e in events[str(i)] for lp in e.logprobs] for i in range(len(prompts))])
        finally:
            engine.close()
    for one, three in zip(*results):
        assert one[0].token_id == three[0].token_id and abs(one[0].logprob - three[0].logprob) < 1e-4
        for step, (a, b) in enumerate(zip(one, three)):
            if a.token_id != b.token_id:  # each rank count's choice is a near-tie in the other's logprobs
                for chosen, other in ((a, b), (b, a)):
                    scores = {token: logprob for token, _, logprob in other.top}
                    assert chosen.token_id in scores and scores[chosen.token_id] > other.logprob - 0.25, (step, a, b)
                break
            assert abs(a.logprob - b.logprob) < 0.25, (step, a, b)


def test_a_dead_worker_fails_the_step_not_the_process(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir, tensor_parallel_size=2)
    try:
        worker = engine.runner.workers[0]
        os.kill(worker.pid, signal.SIGKILL)
        worker.join(10)
        events = run_all(engine, [Request(prompt=prompts_of([20])[0], params=greedy(4), request_id="a")])
        assert events["a"][-1].finish_reason == "error" and "rank 1 has exited" in events["a"][-1].error
    finally:
        engine.close()


SCRIPT = """
import os, signal, sys
sys.path[:0] = {paths!r}
from tests.engine.engine_helpers import make_engine
if __name__ == "__main__":
    # Ctrl-C as a server started from a terminal has it: a test runner started in the background (`cmd &` without
    # job control) passes SIGINT on ignored, and Python then keeps ignoring it
    signal.signal(signal.SIGINT, signal.default_int_handler)
    engine = make_engine({model!r}, tensor_parallel_size=2)
    print(" ".join(str(w.pid) for w in engine.runner.workers), flush=True)
    import time
    while True:
        time.sleep(1)
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "kill"])
def test_stopping_rank_zero_leaves_no_worker(tiny_llama_dir, tmp_path, sig):
    script = tmp_path / "serve.py"
    paths = [str(Path(__file__).resolve().parents[2]), *sys.path]  # the repo root, for tests.engine.engine_helpers
    script.write_text(textwrap.dedent(SCRIPT.format(paths=paths, model=str(tiny_llama_dir))))
    rank0 = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        workers = [psutil.Process(int(pid)) for pid in rank0.stdout.readline().split()]
        assert workers
        os.killpg(rank0.pid, sig)  # Ctrl-C reaches the whole process group
        rank0.wait(30)
        gone, alive = psutil.wait_procs(workers, timeout=30)
        assert not alive, f"workers outlived rank 0: {alive}"
    finally:
        if rank0.poll() is None:
            rank0.kill()


def test_the_native_backend_runs_a_profile_at_two_ranks(tiny_llama_dir, tmp_path):
    """profile [parallel] -> resolver plan (threads per rank) -> engine config -> int8 layers on both ranks."""
    from inferplug.backends.native import NativeBackend
    from inferplug.hardware import probe
    from inferplug.profile import load_profile
    from inferplug.resolver import resolve

    path = tmp_path / "tp.toml"
    path.write_text(f'backend = "native"\ndtype = "float32"\n[model]\npath = "{tiny_llama_dir}"\n'
                    '[quantization]\nformat = "int8"\n[parallel]\ntensor_parallel_size = 2\n')
    profile = load_profile(str(path))
    plan = resolve(profile, probe())
    assert plan.tensor_parallel_size == 2 and plan.weight_format == "int8"
    backend = NativeBackend(profile, plan)
    try:
        engine = backend.engine.engine
        assert len(engine.runner.workers) == 1 and engine.runner.model.num_kv_heads == 1
        events = run_all(engine, [Request(prompt=prompts_of([30])[0], params=greedy(6), request_id="a")])
        assert len(tokens_of(events["a"])) == 6 and events["a"][-1].finish_reason == "length"
        assert engine.blocks.num_free == engine.blocks.num_blocks
    finally:
        backend.close()
