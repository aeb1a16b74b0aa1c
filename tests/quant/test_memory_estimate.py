"""The resolver's weight estimate for native fp16/int8/int4 against the bytes quantize_model really leaves."""

from __future__ import annotations

import pytest
import torch

from inferplug.memory_plan import ModelFacts, weight_bits
from inferplug.models.decoder import DecoderModel
from inferplug.models.loader import load_weights, read_config
from inferplug.profile import Profile
from inferplug.quant.linear import quantize_model


def loaded_bytes(model: DecoderModel) -> int:
    """Every tensor the model holds, a tensor shared by two names counted once."""
    tensors = [model.embed, model.norm, model.lm_head, *(t for layer in model.layers for t in vars(layer).values())]
    seen: dict[int, int] = {}
    for item in tensors:
        if isinstance(item, torch.nn.Module):
            seen[id(item)] = item.nbytes()
        elif isinstance(item, torch.Tensor):  # not None, nor a layer's window size
            seen[item.data_ptr()] = item.nbytes
    return sum(seen.values())


@pytest.mark.parametrize("fmt", ["fp16", "int8", "int4"])
def test_estimate_matches_the_quantized_model(tiny_model_dir, fmt):
    """Tied (llama) and untied (qwen2, with qkv bias) heads; norms and scales are the small remainder."""
    config = read_config(tiny_model_dir)
    model = quantize_model(DecoderModel(config, load_weights(tiny_model_dir, torch.float32), dtype=torch.float32), fmt)
    profile = Profile(backend="native", model={"path": str(tiny_model_dir)}, quantization={"format": fmt.replace("fp16", "none")})
    bits, why = weight_bits(profile, "native", "float32", ModelFacts.from_config(config, "test"), fmt, "cpu")
    estimate = config.num_parameters() * bits / 8
    assert estimate == pytest.approx(loaded_bytes(model), rel=0.03), why
