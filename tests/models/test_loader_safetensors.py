"""HF safetensors dirs (the tiny Llama/Qwen2/Mistral fixtures): round trip against transformers."""

from __future__ import annotations

import json

import pytest
import torch

from inferplug.errors import ModelSourceError
from inferplug.models.loader import load_tokenizer, load_weights, read_config


def test_weights_equal_the_transformers_state_dict(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    reference = model.state_dict()
    ours = load_weights(tiny_model_dir, torch.float32)
    tied = model.config.tie_word_embeddings
    assert set(ours) == set(reference) - ({"lm_head.weight"} if tied else set())
    for name, tensor in ours.items():
        assert torch.equal(tensor, reference[name]), name


def test_config_equals_transformers(tiny_model_dir):
    from transformers import AutoConfig, GenerationConfig

    ours, theirs = read_config(tiny_model_dir), AutoConfig.from_pretrained(tiny_model_dir)
    assert ours.architecture == theirs.model_type
    for field in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
                  "bos_token_id"):  # fmt: skip
        assert getattr(ours, field) == getattr(theirs, field), field
    assert ours.head_dim == theirs.hidden_size // theirs.num_attention_heads
    theta = getattr(theirs, "rope_theta", None) or theirs.rope_parameters["rope_theta"]
    assert ours.rope_theta == theta
    ends = GenerationConfig.from_pretrained(tiny_model_dir).eos_token_id  # where HF lists every end token
    assert ours.eos_token_ids == list(dict.fromkeys([theirs.eos_token_id, *([ends] if isinstance(ends, int) else ends)]))
    assert ours.attention_bias == (theirs.model_type == "qwen2")


def test_sharded_checkpoint_loads_the_same_weights(tiny_llama_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(tiny_llama_dir).save_pretrained(tmp_path, max_shard_size="20KB")
    (tmp_path / "config.json").write_text((tiny_llama_dir / "config.json").read_text())
    assert (tmp_path / "model.safetensors.index.json").is_file()
    sharded, single = load_weights(tmp_path, torch.bfloat16), load_weights(tiny_llama_dir, torch.bfloat16)
    assert set(sharded) == set(single)
    assert all(torch.equal(sharded[name], single[name]) and single[name].dtype == torch.bfloat16 for name in single)


def test_tokenizer_and_chat_template(tiny_model_dir):
    from transformers import AutoTokenizer

    ours, reference = load_tokenizer(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir)
    messages = [{"role": "user", "content": "héllo 👋"}]
    rendered = ours.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert ours.decode(ours.encode("héllo 👋")) == "héllo 👋"


def test_tokenizer_override_replaces_the_bundled_one(tiny_llama_dir, tmp_path):
    (tmp_path / "config.json").write_text((tiny_llama_dir / "config.json").read_text())
    with pytest.raises(ModelSourceError, match="tokenizer"):
        load_tokenizer(tmp_path)
    assert load_tokenizer(tmp_path, override=str(tiny_llama_dir)).eos_token == "<|im_end|>"


def test_unsupported_architecture_is_a_clear_error(tiny_llama_dir, tmp_path):
    config = json.loads((tiny_llama_dir / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(dict(config, model_type="gpt2")))
    with pytest.raises(ModelSourceError, match="model_type 'gpt2' is not supported"):
        load_weights(tmp_path, torch.float32)


def test_a_config_missing_a_field_is_a_clear_error(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    with pytest.raises(ModelSourceError, match="config.json lacks 'num_attention_heads': use the checkpoint's whole"):
        read_config(tmp_path)


def test_corrupt_weights_are_a_clear_error(tiny_llama_dir, tmp_path):
    (tmp_path / "config.json").write_text((tiny_llama_dir / "config.json").read_text())
    (tmp_path / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(ModelSourceError, match="not a readable safetensors file"):
        load_weights(tmp_path, torch.float32)


def test_missing_shard_is_a_clear_error(tiny_llama_dir, tmp_path):
    (tmp_path / "config.json").write_text((tiny_llama_dir / "config.json").read_text())
    index = {"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelSourceError, match="lacks shards"):
        load_weights(tmp_path, torch.float32)


def test_dir_without_model_is_a_clear_error(tmp_path):
    with pytest.raises(ModelSourceError, match="neither config.json nor a .gguf"):
        read_config(tmp_path)


def test_a_weights_file_instead_of_its_dir_is_a_clear_error(tiny_llama_dir):
    with pytest.raises(ModelSourceError, match="point the profile at its model dir"):
        read_config(tiny_llama_dir / "model.safetensors")
