"""Every precision path the resolver can pick, pinned here rather than left to this host's resolver choice, so
each runs in CI on every host: parity with HF transformers in the same precision on the tiny Llama, Qwen2 and
Mistral models, and SmolLM2's answers on the paths a profile can default to (docs/profiles.md, "dtype")."""

from __future__ import annotations

import copy

import pytest
import torch

from inferplug.ops import TorchOps
from inferplug.quant.linear import quantize_model
from inferplug.types import Request, SamplingParams
from tests.engine.engine_helpers import (greedy, hf_generate, hf_model, make_engine, prompts_of, run_all, text_of,
                                         tokens_of)


def _rounded_linears(model, dtype: torch.dtype):
    """HF's model with every linear weight (the head too, untied) rounded to `dtype` and computed in fp32:
    what fp16-stored weights mean, written independently of quant/linear.py."""
    model = copy.deepcopy(model)
    with torch.no_grad():
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.copy_(module.weight.to(dtype).float())
    return model


def _without_cpu_kernels(engine):
    engine.runner.model.ops = TorchOps()  # the torch ops: what a CPU without AVX2/FMA/F16C runs
    return engine


# path -> (engine dtype, engine setup, HF reference)
PATHS = {
    "float32": ("float32", lambda e: e, lambda m: m),
    "float32-torch-ops": ("float32", _without_cpu_kernels, lambda m: m),
    "fp16-weights": ("float32", lambda e: quantize_model(e.runner.model, "fp16") and e,
                     lambda m: _rounded_linears(m, torch.float16)),
    "bfloat16 (opt-in)": ("bfloat16", lambda e: e, lambda m: copy.deepcopy(m).to(torch.bfloat16)),
    "float16 (opt-in)": ("float16", lambda e: e, lambda m: copy.deepcopy(m).to(torch.float16)),
}


@pytest.mark.parametrize("path", PATHS)
def test_tiny_models_match_hf_in_the_same_precision(tiny_model_dir, path):
    dtype, setup, reference = PATHS[path]
    engine = setup(make_engine(tiny_model_dir, dtype=dtype, max_num_batched_tokens=48))
    ref = reference(hf_model(tiny_model_dir))
    prompts = prompts_of([5, 40, 17, 70], seed=21)
    requests = [Request(prompt=p, params=greedy(12), request_id=str(i)) for i, p in enumerate(prompts)]
    events = run_all(engine, requests[:2], {2: requests[2:]})  # staggered: prefill and decode rows share steps
    for i, prompt in enumerate(prompts):
        assert tokens_of(events[str(i)]) == hf_generate(ref, prompt, 12), f"{path}: request {i}"


# The paths a CPU profile defaults to: fp32 (pinned), fp16 weights (auto), and the int8 / int4 formats.
SMOLLM2_PATHS = {"float32": None, "fp16-weights": "fp16", "int8": "int8", "int4": "int4"}
CHINESE = "中国的首都是哪里？"
CHINESE_TOKENS = 12  # the model's Chinese is weak: a short answer, compared with fp32's token for token


@pytest.fixture(scope="module")
def smollm2_fp32_chinese(smollm2_gguf):
    return _answers(make_engine(smollm2_gguf, max_num_batched_tokens=256), CHINESE_TOKENS)["zh"]


def _answers(engine, max_tokens: int) -> dict[str, list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    requests = [Request(messages=[{"role": "user", "content": q}], params=params, request_id=rid)
                for rid, q in (("paris", "What is the capital of France?"), ("zh", CHINESE))]
    events = run_all(engine, requests)
    return {rid: (tokens_of(ev), text_of(ev)) for rid, ev in events.items()}


@pytest.mark.smollm2
@pytest.mark.parametrize("path", SMOLLM2_PATHS)
def test_smollm2_answers_paris_and_chinese_on_each_default_path(smollm2_gguf, smollm2_fp32_chinese, path):
    engine = make_engine(smollm2_gguf, max_num_batched_tokens=256)
    if SMOLLM2_PATHS[path]:
        quantize_model(engine.runner.model, SMOLLM2_PATHS[path])
    answers = _answers(engine, CHINESE_TOKENS)
    assert "Paris" in answers["paris"][1], f"{path}: {answers['paris'][1]!r}"
    tokens, text = answers["zh"]
    assert any("\u4e00" <= ch <= "\u9fff" for ch in text), f"{path}: no Chinese in {text!r}"
    assert tokens == smollm2_fp32_chinese[0], f"{path}: {text!r}, fp32: {smollm2_fp32_chinese[1]!r}"


# The paths the CPU default chooses among by timing them on the host (compute_path_plan.PREFILL_RULE: prompt rows of
# the GGUF's own blocks), each pinned, with fp16 K/V as the default pools, on every kernel set this CPU runs: the
# quality rule (docs/profiles.md, "Quality") checked on the host that may choose them, not only where a path was
# first measured. Bound: Q8_0 weights' KLD (fp32 activations and K/V) on the same chunk.
QUALITY_TOKENS = 512  # one llama.cpp chunk of the shipped text, its second half scored


@pytest.fixture(scope="module")
def smollm2_chunk_reference(smollm2_gguf):
    from inferplug.models.loader import load_tokenizer
    from inferplug.quality import chunks, measure, quality_text, text_logprobs

    ids = load_tokenizer(smollm2_gguf).encode(quality_text(), add_special_tokens=False)
    chunk_list = chunks(ids, QUALITY_TOKENS, limit=1)
    reference = list(text_logprobs(make_engine(smollm2_gguf, kv_dtype="float32"), chunk_list))
    q8 = make_engine(smollm2_gguf, weight_format="int8", prefill_gemm="float32", kv_dtype="float32")
    return chunk_list, reference, measure(q8, chunk_list, reference).mean_kld


@pytest.mark.smollm2
@pytest.mark.parametrize("isa", ["avx2", "avx512"])
@pytest.mark.parametrize("prefill_gemm", ["float32", "bfloat16", "bfloat16-onednn"])
def test_smollm2_default_candidates_pass_the_quality_rule_on_each_kernel_set(
        cpu_kernel_ops, smollm2_gguf, smollm2_fp32_chinese, smollm2_chunk_reference, isa, prefill_gemm):
    from inferplug.compute_path_plan import PREFILL_RULE
    from inferplug.kernels import cpu as cpu_kernels
    from inferplug.quality import measure

    assert prefill_gemm in PREFILL_RULE  # the list above is the resolver's
    if isa not in cpu_kernels.supported_isas():
        pytest.skip(f"this CPU cannot run the {isa} kernels")
    cpu_kernels.set_isa(isa)
    try:
        engine = make_engine(smollm2_gguf, weight_format="gguf", prefill_gemm=prefill_gemm, kv_dtype="float16")
        chunk_list, reference, q8_kld = smollm2_chunk_reference
        quality = measure(engine, chunk_list, reference)
        answers = _answers(engine, CHINESE_TOKENS)
    finally:
        cpu_kernels.set_isa(cpu_kernels.chosen_isa())
    assert quality.mean_kld <= q8_kld, f"{isa} {prefill_gemm}: KLD {quality.mean_kld:.3e} > Q8_0's {q8_kld:.3e}"
    assert "Paris" in answers["paris"][1], f"{isa} {prefill_gemm}: {answers['paris'][1]!r}"
    assert answers["zh"][0] == smollm2_fp32_chinese[0], f"{isa} {prefill_gemm}: {answers['zh'][1]!r}"
