"""fp16 K/V pools on the CPU kernel path, end to end (the resolver's kv_dtype = "auto" there): greedy tokens equal
to fp32 pools', and logprobs within a bound, on the tiny Llama, Qwen2 and Mistral models and on SmolLM2. (The
kernels on fp16 pools against a reference: tests/kernels/cpu/test_fp16_pools.py; batch invariance with fp16 pools:
test_batch_invariance.py.)"""

from __future__ import annotations

import pytest
import torch

from inferplug.types import Request, SamplingParams
from tests.engine.engine_helpers import make_engine, prompts_of, run_all, text_of

# fp16 keeps 11 significant bits: each stored K/V value moves by at most 2^-11 (~5e-4) of itself, and the logits
# by the same order through the layers. Measured, the sampled token's and the top 5's logprobs moved at most 4e-4
# on the tiny models and 0.012 on SmolLM2 (3 chats of 32 tokens). bf16 pools, rounded 8x coarser (2^-8), moved
# SmolLM2's by 0.067. So 0.03 passes fp16's rounding with 2.5x margin and fails an error as large as bf16's.
LOGPROB_BOUND = 0.03


def _engine(model_dir, kv_dtype: str, **overrides):
    engine = make_engine(model_dir, kv_dtype=kv_dtype, **overrides)
    if not getattr(engine.runner.model.ops, "paged_kernel", False):
        pytest.skip("the CPU kernels cannot run here (no AVX2/FMA/F16C): fp16 pools are their path")
    assert all(k.dtype == v.dtype == getattr(torch, kv_dtype) for k, v in engine.runner.kv_caches)
    return engine


def _traces(events) -> dict[str, list[tuple[int, float, list[float]]]]:
    """run_all's events per request as (token, its logprob, the top 5's logprobs) of every generated token."""
    return {rid: [(lp.token_id, lp.logprob, [t[2] for t in lp.top]) for e in ev for lp in e.logprobs]
            for rid, ev in events.items()}


def _assert_close_to_fp32(fp16: dict, fp32: dict) -> None:
    for rid, trace in fp32.items():
        assert [t for t, _, _ in fp16[rid]] == [t for t, _, _ in trace], f"request {rid}: greedy tokens differ"
        for step, ((_, a, top_a), (_, b, top_b)) in enumerate(zip(fp16[rid], trace)):
            worst = max(abs(x - y) for x, y in zip([a, *top_a], [b, *top_b]))
            assert worst < LOGPROB_BOUND, f"request {rid}, token {step}: logprobs moved by {worst:.4f}"


def test_tiny_models_greedy_with_fp16_kv_stays_with_fp32_kv(tiny_model_dir):
    prompts = prompts_of([5, 40, 17, 70, 200], seed=21)  # 200: several key tiles, prefill chunks of 48

    def requests():
        return [Request(prompt=p, request_id=str(i),
                        params=SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=5))
                for i, p in enumerate(prompts)]

    fp32 = _traces(run_all(_engine(tiny_model_dir, "float32", max_num_batched_tokens=48), requests()))
    fp16 = _traces(run_all(_engine(tiny_model_dir, "float16", max_num_batched_tokens=48), requests()))
    _assert_close_to_fp32(fp16, fp32)


@pytest.mark.smollm2
def test_smollm2_answers_stay_with_fp16_kv(smollm2_gguf):
    chats = {"paris": "What is the capital of France?", "zh": "中国的首都是哪里？",
             "poem": "Write a short poem about the sea."}

    def requests():
        return [Request(messages=[{"role": "user", "content": q}], request_id=rid,
                        params=SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True, logprobs=5))
                for rid, q in chats.items()]

    fp32 = _traces(run_all(_engine(smollm2_gguf, "float32"), requests()))
    events = run_all(_engine(smollm2_gguf, "float16"), requests())
    assert "Paris" in text_of(events["paris"])
    _assert_close_to_fp32(_traces(events), fp32)
