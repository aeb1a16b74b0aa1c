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
