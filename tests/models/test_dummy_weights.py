"""[model] load_format = "dummy": random weights at a config.json's geometry in each format, built by the same layer
constructors as a real file, running through the engine."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from inferplug.kernels import cpu as cpu_kernels
from inferplug.quant.block_linear import Q4Linear, Q8HeadLinear, Q8Linear
from inferplug.quant.kquant_linear import Q4KLinear, Q6KHeadLinear
from inferplug.quant.checkpoint_layers import PermutedLinear, RowPartsLinear

pytestmark = pytest.mark.skipif(cpu_kernels.ops() is None, reason="the CPU kernels do not run here (no AVX2/FMA/F16C)")

# the layer each format builds for (qkv, gate_up) and the head (gguf: a Q4_K_M's Q6_K head kept; awq / gptq / int4 /
# int8 heads: quantize_model's)
EXPECTED = {"gguf": (RowPartsLinear, Q4KLinear, Q6KHeadLinear), "int4": (Q4Linear, Q4Linear, Q8HeadLinear),
            "int8": (Q8Linear, Q8Linear, Q8HeadLinear), "awq": (Q4Linear, Q4Linear, Q8HeadLinear),
            "gptq": (PermutedLinear, PermutedLinear, Q8HeadLinear), "none": (torch.Tensor, torch.Tensor, torch.Tensor)}


@pytest.fixture(scope="module")
def config_dir(tiny_llama_dir, tmp_path_factory):
    """The tiny Llama's config and tokenizer, no weights, at widths K-quant super-blocks and AWQ groups divide."""
    out = tmp_path_factory.mktemp("dummy")
    for item in tiny_llama_dir.iterdir():
        if not item.name.endswith(".safetensors"):
            shutil.copy(item, out / item.name)
    config = json.loads((out / "config.json").read_text())
    config.update(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                  tie_word_embeddings=False)
    (out / "config.json").write_text(json.dumps(config))
    return out


@pytest.mark.parametrize("fmt", sorted(EXPECTED))
def test_dummy_weights_run_in_each_format(config_dir, tmp_path, fmt):
    from inferplug.llm import LLM
    from inferplug.types import SamplingParams

    (tmp_path / "dummy.toml").write_text(
        f'backend = "native"\ndtype = "float32"\n[model]\npath = "{config_dir}"\nload_format = "dummy"\n'
        f'[quantization]\nformat = "{fmt}"\n[cache]\nmemory = "16MiB"\n')
    llm = LLM(str(tmp_path / "dummy.toml"))
    model = llm.engine.runner.model
    assert len(model.layers) == 2
    qkv, gate_up, head = EXPECTED[fmt]
    assert isinstance(model.layers[1].qkv, qkv) and isinstance(model.layers[0].gate_up, gate_up)
    assert isinstance(model.lm_head, head)
    out = llm.generate("hello world", SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))[0]
    assert len(out.outputs[0].token_ids) == 4


@pytest.mark.parametrize("fmt", ["gguf", "int8", "none"])
def test_dummy_weights_of_every_family(tiny_family_dir, tmp_path, fmt):
    """Each family's own tensors (QK-norm, sandwich norms, an MoE's router and experts) at a geometry the block
    formats divide, built and run."""
    from inferplug.llm import LLM
    from inferplug.types import SamplingParams

    out = tmp_path / "config"
    out.mkdir()
    for item in tiny_family_dir.iterdir():
        if not item.name.endswith(".safetensors"):
            shutil.copy(item, out / item.name)
    config = json.loads((out / "config.json").read_text())
    config.update(hidden_size=256, intermediate_size=512, moe_intermediate_size=256, head_dim=64)
    if config["model_type"] == "gemma4_text":  # its full layers' heads and its per-layer inputs, as widths that divide
        config.update(per_layer_config={i: {**c, "head_dim": 128} for i, c in config["per_layer_config"].items()},
                      hidden_size_per_layer_input=256)
    if config["model_type"].startswith("qwen3_5"):  # its DeltaNet's value width and its shared expert's too
        config.update(linear_value_head_dim=64, shared_expert_intermediate_size=256)
    (out / "config.json").write_text(json.dumps(config))
    (tmp_path / "dummy.toml").write_text(
        f'backend = "native"\ndtype = "float32"\n[model]\npath = "{out}"\nload_format = "dummy"\n'
        f'[quantization]\nformat = "{fmt}"\n[cache]\nmemory = "16MiB"\n')
    llm = LLM(str(tmp_path / "dummy.toml"))
    out = llm.generate("hello world", SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))[0]
    assert len(out.outputs[0].token_ids) == 4
