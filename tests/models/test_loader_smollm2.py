"""Our GGUF loader on the real SmolLM2 Q4_1 file, against transformers' own GGUF loader."""

from __future__ import annotations

import pytest
import torch

from inferplug.models.loader import load_tokenizer, load_weights, read_config

pytestmark = pytest.mark.smollm2

TEXT = "Hello wörld! 你好，世界 🤗🚀 Привет, мир. مرحبا بالعالم — naïve café, 日本語テキスト 👩‍👩‍👧‍👦"


@pytest.fixture(scope="module")
def reference_model(smollm2_gguf):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name, dtype=torch.float32)


@pytest.fixture(scope="module")
def reference_tokenizer(smollm2_gguf):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name)


def test_every_tensor_equals_transformers(smollm2_gguf, reference_model):
    ours = load_weights(smollm2_gguf, torch.float32)
    reference = reference_model.state_dict()
    assert reference_model.config.tie_word_embeddings and "lm_head.weight" not in ours
    assert set(ours) == set(reference) - {"lm_head.weight"}
    for name, tensor in ours.items():
        assert torch.equal(tensor, reference[name]), name


def test_bf16_weights_are_the_rounded_fp32_ones(smollm2_gguf):
    name = "model.layers.3.self_attn.k_proj.weight"
    assert torch.equal(load_weights(smollm2_gguf, torch.bfloat16)[name], load_weights(smollm2_gguf, torch.float32)[name].bfloat16())


def test_config_equals_transformers(smollm2_gguf, reference_model):
    ours, theirs = read_config(smollm2_gguf), reference_model.config
    assert ours.architecture == theirs.model_type == "llama"
    for field in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps",
                  "tie_word_embeddings", "attention_bias", "bos_token_id"):  # fmt: skip
        assert getattr(ours, field) == getattr(theirs, field), field
    theta = getattr(theirs, "rope_theta", None) or theirs.rope_parameters["rope_theta"]
    assert ours.rope_theta == theta
    assert ours.eos_token_ids[0] == theirs.eos_token_id  # then the turn ends llama.cpp also stops at (test_end_tokens)
    assert ours.rope_scaling is None and ours.num_parameters() == reference_model.num_parameters()


def test_tokenizer_encodes_and_decodes_like_transformers(smollm2_gguf, reference_tokenizer):
    ours = load_tokenizer(smollm2_gguf)
    ids = ours.encode(TEXT)
    assert ids == reference_tokenizer.encode(TEXT)
    assert ours.decode(ids) == reference_tokenizer.decode(ids) == TEXT
    assert ours("<|im_start|>user\nhi<|im_end|>")["input_ids"] == reference_tokenizer("<|im_start|>user\nhi<|im_end|>")["input_ids"]
    for attr in ("bos_token", "eos_token", "unk_token", "pad_token", "bos_token_id", "eos_token_id"):
        assert getattr(ours, attr) == getattr(reference_tokenizer, attr), attr
    assert len(ours) == len(reference_tokenizer)


def test_chat_template_renders_like_transformers(smollm2_gguf, reference_tokenizer):
    ours = load_tokenizer(smollm2_gguf)
    conversations = [
        [{"role": "user", "content": TEXT}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
         {"role": "assistant", "content": "4"}, {"role": "user", "content": "and 3+3?"}],
    ]  # fmt: skip
    for messages in conversations:
        for generation_prompt in (True, False):
            kwargs = dict(add_generation_prompt=generation_prompt)
            text = ours.apply_chat_template(messages, tokenize=False, **kwargs)
            assert text == reference_tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
            assert ours.encode(text) == reference_tokenizer.encode(text)


@pytest.mark.parametrize("fmt", ["gguf", "int4"])
def test_layers_loaded_in_the_files_bits_equal_the_dequantize_then_quantize_path(smollm2_gguf, fmt):
    """The file's Q4_1 linears and Q8_0 embedding as blocks straight from its bytes: the same blocks, bit for bit, as
    the float load re-quantized (Q4_1 and Q8_0 re-quantize losslessly), and the embedding rows the float table's."""
    from inferplug.kernels import cpu as cpu_kernels
    from inferplug.quant.block_linear import BlockLinear, Q4Linear, Q8HeadLinear
    from inferplug.quant.linear import head_layer

    if cpu_kernels.ops() is None:
        pytest.skip("the CPU kernels do not run here (no AVX2/FMA/F16C)")
    floats = load_weights(smollm2_gguf, torch.float32)
    for gate in [name for name in floats if name.endswith(".gate_proj.weight")]:  # the layers come with gate/up fused
        up = gate.replace(".gate_proj.", ".up_proj.")
        floats[gate.replace(".gate_proj.", ".gate_up_proj.")] = torch.cat([floats.pop(gate), floats.pop(up)])
    layers = load_weights(smollm2_gguf, torch.float32, gguf_layers=fmt)
    assert set(layers) == set(floats)
    for name, value in layers.items():
        if not isinstance(value, BlockLinear):
            assert value.dim() == 1 and torch.equal(value, floats[name]), name  # the norms
        elif name == "model.embed_tokens.weight":  # tied: the head, Q8_0 against x in two int8 parts
            assert isinstance(value, Q8HeadLinear) and torch.equal(value.blocks, head_layer(floats[name], "int8").blocks)
            ids = torch.tensor([0, 5, 49151, 5])
            assert torch.equal(value.rows(ids), floats[name][ids])
        else:
            assert isinstance(value, Q4Linear) and torch.equal(value.blocks, Q4Linear.from_float(floats[name]).blocks), name


def test_a_second_layer_load_maps_the_conversion_cache(smollm2_gguf, tmp_path, monkeypatch):
    """The converted layers are saved once (models/conversion_cache.py) and mapped, not converted, the next time."""
    from inferplug.kernels import cpu as cpu_kernels

    if cpu_kernels.ops() is None:
        pytest.skip("the CPU kernels do not run here (no AVX2/FMA/F16C)")
    monkeypatch.setenv("INFERPLUG_HOME", str(tmp_path))
    first = load_weights(smollm2_gguf, torch.float32, gguf_layers="gguf")
    [entry] = (tmp_path / "conversions").glob("*.entry")
    second = load_weights(smollm2_gguf, torch.float32, gguf_layers="gguf")
    assert str(entry) in open("/proc/self/maps").read()
    for name, value in first.items():
        assert torch.equal(getattr(value, "blocks", value), getattr(second[name], "blocks", second[name])), name


def test_a_tokenizer_from_the_cache_is_the_one_built(smollm2_gguf, reference_tokenizer, tmp_path, monkeypatch):
    """The GGUF's tokenizer is built once and read back from the conversion cache as tokenizers' JSON: the same ids,
    specials and template as transformers' own; a damaged entry is built again, and the cache off still loads."""
    monkeypatch.setenv("INFERPLUG_HOME", str(tmp_path))
    text = "<|im_start|>user\nHello, wörld!<|im_end|>"

    def same(tokenizer) -> None:
        assert tokenizer.encode(text) == reference_tokenizer.encode(text) and len(tokenizer) == len(reference_tokenizer)
        assert tokenizer.eos_token == reference_tokenizer.eos_token
        assert tokenizer.chat_template == reference_tokenizer.chat_template

    same(load_tokenizer(smollm2_gguf))  # built, and saved
    [entry] = (tmp_path / "conversions").glob("*.tokenizer.json")
    same(load_tokenizer(smollm2_gguf))  # read back
    entry.write_text("{not json")
    same(load_tokenizer(smollm2_gguf))  # damaged: rebuilt, and saved again
    assert entry.read_text().startswith("{\"version\"")
    monkeypatch.setenv("INFERPLUG_CONVERSION_CACHE_GIB", "0")
    same(load_tokenizer(smollm2_gguf))
