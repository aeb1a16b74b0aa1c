"""Batch invariance (the hidden-prompt test): a greedy request's tokens, and its logprobs bit for bit, do not
depend on what else shares its steps, on how much of its prompt came from the prefix cache or how it was
chunked, nor on the thread count. It holds on the CPU kernel path (ops/cpu_ops._kernel_rows: every attention
row reads its own length in one fixed order; fbgemm's fp16 GEMM and the block kernels are row-invariant; each
[native] prefill_gemm path of the block layers sums a row in one order whatever the row count). Streamed against
not streamed, through the server: tests/server/test_default_profile.py."""

from __future__ import annotations

import pytest
import torch

from inferplug.quant.block_linear import PREFILL_GEMMS
from inferplug.types import Request, SamplingParams
from tests.engine.engine_helpers import logprob_trace, make_engine, prompts_of, run_all


def _engine(model_dir, fmt, prefill_gemm="float32", **overrides):
    engine = make_engine(model_dir, **{"max_num_batched_tokens": 40, "weight_format": fmt, "prefill_gemm": prefill_gemm,
                                       **overrides})
    if not getattr(engine.runner.model.ops, "paged_kernel", False):
        pytest.skip("the CPU kernels cannot run here (no AVX2/FMA/F16C): the torch path is not batch-invariant")
    return engine


def _target(prompt, rid="target") -> Request:
    return Request(prompt=prompt, params=SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=2),
                   request_id=rid)


def _others(vocab: int) -> list[Request]:
    """15 requests of mixed lengths, greedy and sampled, arriving over the target's steps."""
    prompts = prompts_of([3, 70, 17, 1, 40, 9, 33, 55, 5, 64, 16, 28, 2, 45, 11], vocab=vocab, seed=7)
    return [Request(prompt=p, request_id=f"other{i}",
                    params=SamplingParams(temperature=0.0 if i % 2 else 0.9, seed=i, max_tokens=4 + i % 9,
                                          ignore_eos=True))
            for i, p in enumerate(prompts)]


# Not fp32-stored weights (a pinned dtype = "float32"): oneDNN's fp32 GEMM rounds 1-, 2-, 3-, 5-, 7- and 9-row
# calls differently from larger ones, and padding every call to 16 rows cost 3.2x at one row (docs/profiles.md).
# Each block format under each prefill path (fp16 has none), and fp16 K/V pools (the resolver's kv_dtype on the kernel
# path): the store rounds each row alone, attention widens it.
FORMAT_PATHS = [("fp16", "float32", "float32"), ("fp16", "float32", "float16"), ("int4", "float32", "float16"),
                *((fmt, path, "float32") for fmt in ("int8", "int4") for path in PREFILL_GEMMS)]


@pytest.mark.parametrize("fmt,prefill_gemm,kv_dtype", FORMAT_PATHS)
def test_tiny_greedy_request_is_the_same_alone_in_a_batch_and_after_a_prefix_hit(tiny_model_dir, fmt, prefill_gemm,
                                                                                 kv_dtype):
    vocab = 300
    prompt = prompts_of([53], vocab=vocab, seed=4)[0]
    alone = logprob_trace(run_all(_engine(tiny_model_dir, fmt, prefill_gemm, kv_dtype=kv_dtype),
                                  [_target(prompt)])["target"])

    engine = _engine(tiny_model_dir, fmt, prefill_gemm, kv_dtype=kv_dtype)
    others = _others(vocab)
    batched = run_all(engine, others[:5] + [_target(prompt)], {1: others[5:10], 3: others[10:]})
    assert logprob_trace(batched["target"]) == alone, "inside a batch of 16"

    engine = _engine(tiny_model_dir, fmt, prefill_gemm, kv_dtype=kv_dtype, max_num_batched_tokens=256)  # the prompt in one step
    run_all(engine, [_target(prompt[:40] + [5], "warm")])
    hit = run_all(engine, [_target(prompt)])["target"]
    assert hit[-1].usage.cached_tokens == 32
    assert logprob_trace(hit) == alone, "after a prefix-cache hit"


@pytest.mark.smollm2
def test_smollm2_default_path_answer_is_the_same_alone_batched_cached_and_on_one_thread(smollm2_gguf):
    """The default profile's path (fp16 weights, the Q8_0 head, fp16 K/V pools, the kernels) on the real model."""
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    target = Request(messages=messages, request_id="target",
                     params=SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=1))
    engine = _engine(smollm2_gguf, "fp16", kv_dtype="float16", max_num_batched_tokens=32)
    alone = logprob_trace(run_all(engine, [target])["target"])
    assert run_all(engine, [target])["target"][-1].usage.cached_tokens > 0
    assert logprob_trace(run_all(engine, [target])["target"]) == alone, "after a prefix-cache hit"

    others = _others(vocab=49152)
    batched = run_all(_engine(smollm2_gguf, "fp16", kv_dtype="float16", max_num_batched_tokens=32), others[:5] + [target],
                      {1: others[5:10], 2: others[10:]})
    assert logprob_trace(batched["target"]) == alone, "inside a batch of 16"

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        single = logprob_trace(run_all(_engine(smollm2_gguf, "fp16", kv_dtype="float16", max_num_batched_tokens=32),
                                [target])["target"])
    finally:
        torch.set_num_threads(threads)
    assert single == alone, f"one thread against {threads}"


@pytest.mark.parametrize("prefill_gemm", ["float32", "bfloat16"])
def test_tiny_prompt_last_token_computed_alone_takes_prefill_arithmetic(tiny_model_dir, prefill_gemm):
    """A prompt's last token computed alone (a 1-token final chunk, or the rest from the prefix cache) is a prefill
    row: under int4 layers, where decode rows round activations to int8, its logprobs match one-chunk prefill."""
    vocab = 300
    prompt = prompts_of([41], vocab=vocab, seed=5)[0]

    def engine_of(**overrides):
        return _engine(tiny_model_dir, "int4", prefill_gemm, **overrides)

    whole = logprob_trace(run_all(engine_of(max_num_batched_tokens=256), [_target(prompt)])["target"])
    assert logprob_trace(run_all(engine_of(), [_target(prompt)])["target"]) == whole, "chunks 40 + 1"

    engine = engine_of(max_num_batched_tokens=256)
    run_all(engine, [_target(prompt[:32] + [7], "warm")])
    cached = run_all(engine, [_target(prompt[:33])])["target"]
    assert cached[-1].usage.cached_tokens == 32
    alone = logprob_trace(run_all(engine_of(max_num_batched_tokens=256), [_target(prompt[:33])])["target"])
    assert logprob_trace(cached) == alone, "32 tokens from the prefix cache + 1"
