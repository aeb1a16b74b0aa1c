"""Weight-only fp16/int8/int4 (quant/linear.py) in the native engine: against HF transformers in fp32 on the
float weights the quantized layers hold (decoded by gguf-py, not by our code), and against the float engine on
the real SmolLM2."""

from __future__ import annotations

import pytest
import torch

from inferplug.types import Request, SamplingParams
from tests.engine.engine_helpers import (greedy, hf_generate, hf_model, make_engine, prompts_of, run_all, spy_fused_steps,
                                         text_of, tokens_and_logprobs, tokens_of, unfuse_steps)
from tests.quant_reference import weights_reference

QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.", "List three prime numbers.",
             "Explain gravity to a child in two sentences."]


def quantized_engine(model_dir, fmt, prefill_gemm="float32", **overrides):
    # what NativeBackend builds for quantization.format = fmt, [native] prefill_gemm
    return make_engine(model_dir, weight_format=fmt, prefill_gemm=prefill_gemm, **overrides)


@pytest.mark.parametrize("fmt", ["fp16", "int8", "int4"])
def test_quantized_engine_matches_hf_on_the_weights_it_holds(cpu_kernel_ops, tiny_llama_dir, fmt):
    """Fused qkv / gate_up quantize row by row, so they equal HF's separate projections quantized alike; the
    engine then differs from the reference only in fp32 summation order. The tiny model's sharpened logits keep
    greedy tokens apart by far more than that, so they match exactly."""
    engine = quantized_engine(tiny_llama_dir, fmt, max_num_batched_tokens=48)
    reference = weights_reference(hf_model(tiny_llama_dir), fmt, int8_inputs=fmt != "fp16")
    prompts = prompts_of([5, 40, 17, 70], seed=11)
    params = greedy(12, logprobs=5)
    requests = [Request(prompt=p, params=params, request_id=str(i)) for i, p in enumerate(prompts)]
    events = run_all(engine, requests[:2], {2: requests[2:]})
    for i, prompt in enumerate(prompts):
        assert tokens_of(events[str(i)]) == hf_generate(reference, prompt, 12), f"{fmt} request {i}"
        with torch.no_grad():
            expected = torch.log_softmax(reference(torch.tensor([prompt])).logits[0, -1], -1)
        got = events[str(i)][0].logprobs[0].top
        # Only fp32 summation order differs: sums of <= 128 terms, 2^-24 each, ~1e-5 relative on logits of
        # magnitude <= 15, so 1e-4. Leaving out the int8 rounding of activations moves them ~2e-3: caught.
        torch.testing.assert_close(torch.tensor([lp for _, _, lp in got]), expected[[t for t, _, _ in got]],
                                   rtol=0, atol=1e-4)


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_decode_steps_in_one_kernel_call_equal_the_layer_by_layer_path(cpu_kernel_ops, tiny_model_dir, fmt, monkeypatch):
    """cpu_kernels' decode_layers (CpuKernelOps.run_layers) runs DecoderModel.forward's kernels in its order, without Python between them:
    tokens and logprobs come out bit for bit the same as from the Python loop, Qwen2's q/k/v bias added in the call."""

    def generate():
        engine = quantized_engine(tiny_model_dir, fmt, max_num_batched_tokens=48)
        prompts = prompts_of([5, 40, 17, 70], seed=3)
        requests = [Request(prompt=p, params=greedy(10, logprobs=3), request_id=str(i)) for i, p in enumerate(prompts)]
        return tokens_and_logprobs(run_all(engine, requests[:2], {3: requests[2:]}))

    fused_steps = spy_fused_steps(monkeypatch)
    fused = generate()
    assert any(fused_steps) and not all(fused_steps), "decode-only steps run fused, steps with prefill do not"
    unfuse_steps(monkeypatch)
    assert generate() == fused


@pytest.mark.smollm2
# fp16: test_smollm2.py checks it against HF. Prompt rows by the [native] prefill_gemm paths that keep the
# answers (int8 prompt rows answer "L'Étoile, la Cité, ..." to the capital question)
@pytest.mark.parametrize("fmt,prefill_gemm", [("int8", "float32"), ("int4", "float32"), ("int4", "bfloat16")])
def test_quantized_smollm2_answers_like_the_float_engine(smollm2_gguf, fmt, prefill_gemm):
    float_engine = make_engine(smollm2_gguf, max_num_batched_tokens=256)
    engine = quantized_engine(smollm2_gguf, fmt, prefill_gemm, max_num_batched_tokens=256)
    prompts = [float_engine.encode(Request(messages=[{"role": "user", "content": q}]))[0] for q in QUESTIONS]
    params = SamplingParams(temperature=0.0, max_tokens=24, logprobs=5)

    def answers(eng):
        events = run_all(eng, [Request(prompt=p, params=params, request_id=str(i)) for i, p in enumerate(prompts)])
        firsts = [events[str(i)][0].logprobs[0].top for i in range(len(prompts))]
        return [tokens_of(events[str(i)]) for i in range(len(prompts))], text_of(events["0"]), firsts

    reference, float_capital, float_firsts = answers(float_engine)
    quantized, capital, _ = answers(engine)
    # Greedy paths may part after a near-tie, so compare how far each answer follows the float one.
    for ref, got, top in zip(reference, quantized, float_firsts):
        # The first token is the float one, or one the float model scores within 0.25 of it (a near-tie:
        # "List three prime numbers." opens with "1" or "The" 0.1 apart).
        near_ties = [token for token, _, logprob in top if logprob >= top[0][2] - 0.25]
        assert got[0] in near_ties, f"{fmt}: first token {got[0]}, float's near-ties {near_ties} (answer {ref[:3]})"
    common = [next((k for k, (a, b) in enumerate(zip(r, g)) if a != b), min(len(r), len(g))) for r, g in zip(reference, quantized)]
    assert sum(common) >= 0.5 * sum(len(r) for r in reference), f"{fmt}: common prefixes {common}"
    assert "capital of France" in capital, f"{fmt}: {capital!r} (float: {float_capital!r})"


@pytest.mark.parametrize("setting,path", [("auto", None), ("bfloat16", "bfloat16"), ("int8", "int8")])
def test_the_profiles_prefill_gemm_reaches_every_block_layer(cpu_kernel_ops, tiny_llama_dir, tmp_path, setting, path):
    """[native] prefill_gemm -> the plan (auto: a path the quality rule admits, timed on this host: the
    timings in the reason) -> build_engine -> each int4 layer's prompt rows."""
    from inferplug.backends.native import build_engine
    from inferplug.hardware import probe
    from inferplug.profile import load_profile
    from inferplug.quant.block_linear import BlockLinear
    from inferplug.resolver import resolve

    toml = tmp_path / "prefill.toml"
    toml.write_text(f'backend = "native"\ndtype = "float32"\n[model]\npath = "{tiny_llama_dir}"\n'
                    f'[quantization]\nformat = "int4"\n[native]\nprefill_gemm = "{setting}"\n')
    profile = load_profile(str(toml))
    plan = resolve(profile, probe())
    if path is None:  # auto
        from inferplug.compute_path_plan import PREFILL_RULE

        path = plan.prefill_gemm
        assert path in PREFILL_RULE and "timed once on this host" in plan.reasons[-1]
    assert plan.prefill_gemm == path and f"prefill: the block layers multiply prompt rows in {path}" in plan.reasons[-1]
    engine = build_engine(profile, plan)
    layers = [getattr(layer, name) for layer in engine.runner.model.layers for name in ("qkv", "o", "gate_up", "down")]
    assert all(isinstance(layer, BlockLinear) and layer.prefill_gemm == path for layer in layers)
    events = run_all(engine, [Request(prompt=prompts_of([30])[0], params=greedy(4), request_id="a")])
    assert len(tokens_of(events["a"])) == 4
