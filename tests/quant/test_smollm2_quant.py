"""Weight-only int8/int4 on the real SmolLM2 weights: how far the logits move from the float model."""

from __future__ import annotations

import pytest
import torch

from inferplug.models.loader import load_tokenizer, load_weights, read_config
from inferplug.quant.linear import quantize_model

pytestmark = pytest.mark.smollm2


@pytest.fixture(scope="module")
def smollm2_and_ids(smollm2_gguf):
    """transformers' Llama built from our config and loaded with our (transformers-identical) weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = read_config(smollm2_gguf)
    hf_config = LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads, max_position_embeddings=cfg.max_position_embeddings,
        rms_norm_eps=cfg.rms_norm_eps, rope_theta=cfg.rope_theta, tie_word_embeddings=cfg.tie_word_embeddings,
    )  # fmt: skip
    model = LlamaForCausalLM(hf_config).eval()
    model.load_state_dict(load_weights(smollm2_gguf, torch.float32), strict=False)
    model.tie_weights()
    tokenizer = load_tokenizer(smollm2_gguf)
    messages = [{"role": "user", "content": "Explain in two sentences why the sky is blue, then list three colours."}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    return model, ids["input_ids"]


# On an AVX2 CPU both run int8 activations (llama.cpp's Q8 blocks): int4 keeps the file's Q4_1 weights
# exactly, int8 re-rounds them to Q8_0, and its one low-confidence outlier position reaches cosine 0.946.
@pytest.mark.parametrize("fmt,min_agreement,min_cosine", [("int8", 0.95, 0.94), ("int4", 0.9, 0.97)])
def test_quantized_logits_stay_close(smollm2_and_ids, fmt, min_agreement, min_cosine):
    import copy

    model, ids = smollm2_and_ids
    with torch.no_grad():
        reference = model(ids).logits[0]
        quantized = quantize_model(copy.deepcopy(model), fmt)(ids).logits[0]
    # Top-1 is compared where the float model is confident; near-ties flip even between fp32 and bf16.
    confident = reference.softmax(-1).max(-1).values > 0.5
    agreement = (reference.argmax(-1) == quantized.argmax(-1))[confident].float().mean().item()
    assert agreement >= min_agreement, f"{fmt}: top-1 agrees on {agreement:.0%} of confident positions"
    assert torch.nn.functional.cosine_similarity(reference, quantized, dim=-1).min().item() > min_cosine

