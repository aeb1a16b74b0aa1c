"""GGUF files we write ourselves from the tiny HF fixtures (llama.cpp's layout), read back by our loader."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from inferplug.errors import ModelSourceError
from inferplug.models.loader import load_tokenizer, load_weights, read_config

LAYER_PARTS = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}  # fmt: skip


def llama_cpp_permute(weight: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: the forward direction our loader undoes."""
    return weight.reshape(n_head, 2, weight.shape[0] // n_head // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def gguf_name(hf: str) -> str:
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}  # fmt: skip
    if hf in top:
        return top[hf]
    _, _, layer, rest = hf.split(".", 3)
    part, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{LAYER_PARTS[part]}.{kind}"


def write_gguf(hf_dir: Path, out: Path, *, arch: str | None = None, mlp_quant: str = "Q8_0", add_tokenizer=None) -> Path:
    """A GGUF of a tiny HF checkpoint as llama.cpp writes it: Mistral as "llama", Llama's Q/K rows
    permuted (Qwen2's not), MLP weights quantized, the rest F32."""
    from transformers import AutoConfig, AutoTokenizer

    from inferplug.models.loader import load_weights as load_hf

    cfg = AutoConfig.from_pretrained(hf_dir)
    arch = arch or ("qwen2" if cfg.model_type == "qwen2" else "llama")
    permute = arch == "llama"
    writer = gguf.GGUFWriter(out, arch)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_freq_base(read_config(hf_dir).rope_theta)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    (add_tokenizer or _add_tokenizer)(writer, AutoTokenizer.from_pretrained(hf_dir))
    for name, tensor in load_hf(hf_dir, torch.float32).items():
        data = tensor.numpy()
        if permute and ".q_proj.weight" in name:
            data = llama_cpp_permute(data, cfg.num_attention_heads)
        elif permute and ".k_proj.weight" in name:
            data = llama_cpp_permute(data, cfg.num_key_value_heads)
        if ".mlp." in name:
            qtype = gguf.GGMLQuantizationType[mlp_quant]
            writer.add_tensor(gguf_name(name), gguf.quants.quantize(data, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(gguf_name(name), np.ascontiguousarray(data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def _add_tokenizer(writer, tokenizer) -> None:
    vocab = tokenizer.get_vocab()
    tokens = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]
    special = set(tokenizer.all_special_tokens)
    merges = [" ".join(m) for m in json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in special else 1 for t in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_add_bos_token(False)
    writer.add_chat_template(tokenizer.chat_template)


def _add_sentencepiece_tokenizer(writer, _hf_tokenizer) -> None:
    """A Llama-2-style vocabulary: <unk>/<s>/</s>, 256 byte fallbacks, scored "▁" pieces, no merges."""
    specials = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    pieces = ["▁", "h", "e", "l", "o", "w", "r", "d", "▁h", "▁w", "ll", "he", "▁he", "▁hell", "▁hello", "or", "▁wor",
              "▁world", "ld"]  # fmt: skip
    writer.add_tokenizer_model("llama")
    writer.add_token_list(specials + pieces)
    writer.add_token_scores([0.0] * len(specials) + [-float(i) for i in range(len(pieces))])
    writer.add_token_types([2, 3, 3] + [6] * 256 + [1] * len(pieces))  # unknown, control, byte, normal
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_chat_template("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}{% endfor %}")


@pytest.fixture(scope="module")
def tiny_gguf(tiny_llama_dir, tmp_path_factory) -> Path:
    return write_gguf(tiny_llama_dir, tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def test_weights_round_trip_through_llama_cpp_layout(tiny_model_dir, tmp_path):
    original = load_weights(tiny_model_dir, torch.float32)
    loaded = load_weights(write_gguf(tiny_model_dir, tmp_path / "model.gguf"), torch.float32)
    assert set(loaded) == set(original)
    for name, tensor in original.items():
        if ".mlp." in name:  # Q8_0: within half a quantization step of each 32-value block
            torch.testing.assert_close(loaded[name], tensor, rtol=0, atol=tensor.abs().max().item() / 127)
        else:  # F32, so the Q/K unpermutation must restore the exact rows
            assert torch.equal(loaded[name], tensor), name


def test_config_matches_the_hf_checkpoint(tiny_model_dir, tmp_path):
    from_gguf = read_config(write_gguf(tiny_model_dir, tmp_path / "model.gguf"))
    from_hf = read_config(tiny_model_dir)
    # GGUF stores the epsilon as float32 (transformers keeps that rounded value too); llama.cpp
    # writes Mistral as "llama"; a GGUF's <|endoftext|> (the tiny tokenizer's BOS) ends a reply beside its
    # EOS, as in llama.cpp's end-of-generation set (tests/models/test_end_tokens.py).
    expected = dataclasses.replace(from_hf, rms_norm_eps=float(np.float32(from_hf.rms_norm_eps)),
                                   architecture="qwen2" if from_hf.architecture == "qwen2" else "llama",
                                   eos_token_ids=[*from_hf.eos_token_ids, from_hf.bos_token_id])  # fmt: skip
    assert from_gguf == expected


def test_dir_with_one_gguf_is_accepted(tiny_gguf):
    assert read_config(tiny_gguf.parent) == read_config(tiny_gguf)


def test_tokenizer_from_metadata_matches_the_hf_tokenizer(tiny_llama_dir, tiny_gguf):
    from transformers import AutoTokenizer

    ours, reference = load_tokenizer(tiny_gguf), AutoTokenizer.from_pretrained(tiny_llama_dir)
    text = "the weather in Zürich 🌧️ — 雨"
    assert ours.encode(text) == reference.encode(text)
    assert ours.decode(ours.encode(text)) == text
    messages = [{"role": "user", "content": "hi"}]
    rendered = ours.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert (ours.bos_token, ours.eos_token) == (reference.bos_token, reference.eos_token)


def test_sentencepiece_tokenizer_matches_transformers_gguf_tokenizer(tiny_llama_dir, tmp_path):
    from transformers import AutoTokenizer

    path = write_gguf(tiny_llama_dir, tmp_path / "sp.gguf", add_tokenizer=_add_sentencepiece_tokenizer)
    ours, reference = load_tokenizer(path), AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    for text in ["hello world", " hello  world", "héllo wörld 🤗", "hello\nworld"]:
        ids = ours.encode(text)
        assert ids == reference.encode(text) and ids[0] == 1  # BOS added, as llama.cpp does for this vocabulary
        assert ours.decode(ids, skip_special_tokens=True) == reference.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("mlp_quant", ["Q4_0", "Q5_1"])
def test_other_quant_types_load(tiny_llama_dir, tmp_path, mlp_quant):
    path = write_gguf(tiny_llama_dir, tmp_path / f"{mlp_quant}.gguf", mlp_quant=mlp_quant)
    weights = load_weights(path, torch.bfloat16)
    assert weights["model.layers.0.mlp.up_proj.weight"].dtype == torch.bfloat16


def test_unsupported_architecture_is_a_clear_error(tiny_llama_dir, tmp_path):
    path = write_gguf(tiny_llama_dir, tmp_path / "gpt2.gguf", arch="gpt2")
    with pytest.raises(ModelSourceError, match="'gpt2' model"):
        read_config(path)


def test_truncated_file_is_a_clear_error(tiny_gguf, tmp_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_gguf.read_bytes()[: tiny_gguf.stat().st_size // 2])
    with pytest.raises(ModelSourceError, match="truncated"):
        load_weights(cut, torch.float32)


def test_non_gguf_bytes_are_a_clear_error(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"not a model at all" * 10)
    with pytest.raises(ModelSourceError, match="not a GGUF file"):
        read_config(bad)


def test_unsupported_tensor_type_is_a_clear_error(tiny_gguf, tmp_path):
    from inferplug.models.gguf import read_gguf

    info = read_gguf(tiny_gguf).tensors["blk.0.ffn_up.weight"]
    data = bytearray(tiny_gguf.read_bytes())
    # The tensor table stores each type id right before its offset; IQ4_NL (20) is a type we do not read.
    name = info.name.encode()
    at = data.index(name) + len(name) + 4 + 8 * len(info.shape)
    data[at : at + 4] = (20).to_bytes(4, "little")
    patched = tmp_path / "iq4.gguf"
    patched.write_bytes(bytes(data))
    with pytest.raises(ModelSourceError, match="ggml type 20"):
        read_config(patched)


def test_missing_path_is_a_clear_error(tmp_path):
    with pytest.raises(ModelSourceError, match="does not exist"):
        read_config(tmp_path / "nowhere.gguf")
