"""The wiring of the Triton ops end to end, in CI without a GPU: on CPU tensors in Triton's interpreter, the
engine with attention = "triton" (Triton decode and prefill attention, KV store, RoPE, RMSNorm) gives the same
greedy tokens as the torch ops and HF, through chunked prefill, preemption and a prefix-cache hit."""

from __future__ import annotations

import pytest
import torch

from inferplug.types import Request
from tests.engine.engine_helpers import greedy, hf_greedy, make_engine, prompts_of, run_all, tokens_of


def _generate(model_dir, attention: str):
    # A 32-token budget chunks the 34-token prompt. Then that prompt again, one token longer (its first two blocks
    # come from the cache), with three more: 8 blocks of 16 tokens cannot hold all four, so some are preempted.
    engine = make_engine(model_dir, attention=attention, num_kv_blocks=8, max_num_batched_tokens=32, max_num_seqs=4)
    assert engine.runner.model.ops.name == attention
    prompts = prompts_of([34, 45, 20, 38], seed=2)
    first = run_all(engine, [Request(prompt=prompts[0], params=greedy(8), request_id="0")])
    requests = [Request(prompt=p, params=greedy(8), request_id=str(i)) for i, p in enumerate(prompts[1:], 1)]
    events = run_all(engine, [Request(prompt=prompts[0] + [7], params=greedy(8), request_id="hit"), *requests])
    assert events["hit"][-1].usage.cached_tokens == 32
    assert engine.stats()["preemptions"] > 0
    return prompts, {rid: tokens_of(ev) for rid, ev in {**first, **events}.items()}


def test_triton_engine_matches_the_torch_path_and_hf(tiny_llama_dir):
    prompts, triton_tokens = _generate(tiny_llama_dir, "triton")
    _, torch_tokens = _generate(tiny_llama_dir, "torch")
    assert triton_tokens == torch_tokens
    assert triton_tokens["0"] == hf_greedy(tiny_llama_dir, prompts[0], 8)
    assert triton_tokens["hit"] == hf_greedy(tiny_llama_dir, prompts[0] + [7], 8)


def test_triton_on_the_cpu_needs_the_interpreter(tiny_llama_dir, monkeypatch):
    from inferplug.errors import ProfileError

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ProfileError, match="needs a CUDA GPU"):
        make_engine(tiny_llama_dir, attention="triton")


@pytest.mark.parametrize("kv_dtype", ["float16", "bfloat16"])
def test_pools_take_the_plans_kv_dtype(tiny_llama_dir, kv_dtype):
    engine = make_engine(tiny_llama_dir, kv_dtype=kv_dtype)
    assert all(k.dtype == v.dtype == getattr(torch, kv_dtype) for k, v in engine.runner.kv_caches)
    from inferplug.kernels import cpu as cpu_kernels

    kernels = cpu_kernels.ops() is not None and kv_dtype in cpu_kernels.KV_DTYPES  # they read fp32 and fp16 pools
    assert engine.runner.model.ops.name == ("cpu-kernels" if kernels else "torch")
    prompt = prompts_of([20], seed=3)[0]
    out = run_all(engine, [Request(prompt=prompt, params=greedy(4), request_id="a")])["a"]
    assert len(tokens_of(out)) == 4


def test_fp8_pools_need_cuda(tiny_llama_dir):
    with pytest.raises(ValueError, match="needs a CUDA device"):
        make_engine(tiny_llama_dir, kv_dtype="float8_e4m3")
