"""Greedy output and logits of the native engine against HF transformers on the same weights (fp32)."""

from __future__ import annotations

import pytest

import torch

from inferplug.ops import TorchOps
from inferplug.types import Request, SamplingParams
from tests.engine.engine_helpers import greedy, hf_greedy, hf_model, make_engine, prompts_of, run_all, tokens_of


def test_single_request_matches_hf(tiny_model_dir):
    engine = make_engine(tiny_model_dir)
    prompt = prompts_of([23])[0]
    events = run_all(engine, [Request(prompt=prompt, params=greedy(24), request_id="a")])
    assert tokens_of(events["a"]) == hf_greedy(tiny_model_dir, prompt, 24)


def test_first_token_logprobs_match_hf(tiny_model_dir):
    engine = make_engine(tiny_model_dir)
    prompt = prompts_of([37], seed=3)[0]
    params = SamplingParams(temperature=0.0, max_tokens=1, logprobs=5)
    events = run_all(engine, [Request(prompt=prompt, params=params, request_id="a")])
    logprob = events["a"][-1].logprobs[0]
    with torch.no_grad():
        ref = torch.log_softmax(hf_model(tiny_model_dir)(torch.tensor([prompt])).logits[0, -1].float(), -1)
    values, ids = ref.topk(5)
    assert [t for t, _, _ in logprob.top] == ids.tolist()
    torch.testing.assert_close(torch.tensor([lp for _, _, lp in logprob.top]), values, atol=1e-4, rtol=1e-4)
    assert logprob.token_id == ids[0].item()


@pytest.mark.parametrize("block_size", [16, 4])  # 4: the torch path splits decode rows into groups of similar lengths
@pytest.mark.parametrize("decode_kernel", [False, True], ids=["torch-decode", "kernel-decode"])
def test_sixteen_concurrent_staggered_requests_match_hf(request, tiny_model_dir, block_size, decode_kernel):
    """Mixed lengths, arriving over several steps, with a small budget so prefills are chunked."""
    if decode_kernel:
        request.getfixturevalue("cpu_kernel_ops")  # skips without the ISA, fails if the kernels do not build
    engine = make_engine(tiny_model_dir, max_num_batched_tokens=48, max_num_seqs=12, block_size=block_size)
    ops = engine.runner.model.ops
    assert getattr(ops, "paged_kernel", False) or not decode_kernel  # head_dim 16: a multiple of 8, so the kernel takes it
    if not decode_kernel:
        ops = engine.runner.model.ops = TorchOps()
    group_counts = []
    make_groups = ops.paged_rows_of
    ops.paged_rows_of = lambda step, seqs, device: \
        group_counts.append(len(groups := make_groups(step, seqs, device))) or groups
    lengths = [3, 70, 17, 1, 40, 9, 33, 120, 5, 64, 16, 28, 2, 90, 11, 47]
    outs = [4 + (i * 5) % 11 for i in range(16)]
    prompts = prompts_of(lengths, seed=1)
    requests = [Request(prompt=p, params=greedy(m), request_id=str(i)) for i, (p, m) in enumerate(zip(prompts, outs))]
    arrivals = {step: requests[4 + 3 * step: 7 + 3 * step] for step in range(4)}
    events = run_all(engine, requests[:4], arrivals)
    for i, (prompt, n) in enumerate(zip(prompts, outs)):
        assert tokens_of(events[str(i)]) == hf_greedy(tiny_model_dir, prompt, n), f"request {i}"
    assert (max(group_counts, default=1) > 1) == (block_size == 4 and not decode_kernel)  # the kernel takes one group


def test_prefix_cache_hit_gives_the_same_output(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir)
    shared = prompts_of([50], seed=5)[0]
    first = run_all(engine, [Request(prompt=shared + [7], params=greedy(12), request_id="miss")])["miss"]
    second = run_all(engine, [Request(prompt=shared + [7], params=greedy(12), request_id="hit")])["hit"]
    assert first[-1].usage.cached_tokens == 0
    assert second[-1].usage.cached_tokens == 48  # three full 16-token blocks; the last token is recomputed
    assert tokens_of(first) == tokens_of(second)
    assert engine.stats()["prefix_hit_rate"] > 0


def test_cache_salt_isolates_prefixes(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir)
    prompt = prompts_of([40], seed=6)[0]
    run_all(engine, [Request(prompt=prompt, params=greedy(2), request_id="a", cache_salt="alice")])
    other = run_all(engine, [Request(prompt=prompt, params=greedy(2), request_id="b", cache_salt="bob")])["b"]
    same = run_all(engine, [Request(prompt=prompt, params=greedy(2), request_id="c", cache_salt="alice")])["c"]
    assert other[-1].usage.cached_tokens == 0
    assert same[-1].usage.cached_tokens == 32


def test_tiny_pool_forces_preemption_and_still_matches_hf(tiny_model_dir):
    engine = make_engine(tiny_model_dir, num_kv_blocks=10, max_num_batched_tokens=64)
    prompts = prompts_of([30, 45, 20, 38, 25, 50], seed=2)
    requests = [Request(prompt=p, params=greedy(24), request_id=str(i)) for i, p in enumerate(prompts)]
    events = run_all(engine, requests)
    assert engine.stats()["preemptions"] > 0
    for i, prompt in enumerate(prompts):
        assert tokens_of(events[str(i)]) == hf_greedy(tiny_model_dir, prompt, 24), f"request {i}"
