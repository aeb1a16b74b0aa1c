"""The tokens that end a reply: a tiny gpt-oss whose tokenizer holds harmony's control tokens, as an HF dir (its
generation_config.json lists <|return|> and <|call|>, config.json only <|return|>) and as the GGUF llama.cpp's own
converter writes from it (one EOS id). Ours stop at both from either form, and llama.cpp's end-of-generation set,
read through llama-cpp-python, says the same of those tokens (and of <|end|>, which ends a message, not the reply).
The two real GGUFs end where llama.cpp's set says too: Gemma 3's file names <eos>, its turns end at <end_of_turn>."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inferplug.models.loader import read_config
from tests.conftest import _save_tiny
from tests.models.llama_cpp_reference import convert, need_llama_cpp

HARMONY = ["<|return|>", "<|call|>", "<|end|>", "<|start|>", "<|channel|>", "<|message|>"]


@pytest.fixture(scope="module")
def harmony_dir(tmp_path_factory) -> tuple[Path, dict[str, int]]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    out = _save_tiny("gpt_oss", tmp_path_factory.mktemp("gpt-oss-harmony"))
    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab["Ġt"] = len(vocab)  # a merge: llama.cpp's BPE vocabulary needs one
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("Ġ", "t")]))
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>", *HARMONY])  # 264 tokens: the tiny model's 265-row embedding holds them
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|return|>", pad_token="<|endoftext|>").save_pretrained(out)
    ids = {t: tok.token_to_id(t) for t in HARMONY}
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "eos_token_id": ids["<|return|>"]}))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": [ids["<|return|>"], ids["<|call|>"]]}))
    return out, ids


def test_an_hf_dir_ends_where_its_generation_config_says(harmony_dir):
    path, ids = harmony_dir
    assert read_config(path).eos_token_ids == [ids["<|return|>"], ids["<|call|>"]]


def test_a_gpt_oss_gguf_ends_at_return_and_call_as_llama_cpp_does(harmony_dir, tmp_path):
    llama_cpp = need_llama_cpp()
    path, ids = harmony_dir
    gguf = convert(path, tmp_path / "harmony.gguf")
    ours = set(read_config(gguf).eos_token_ids)
    llm = llama_cpp.Llama(model_path=str(gguf), vocab_only=True, verbose=False)
    try:
        vocab = llama_cpp.llama_model_get_vocab(llm.model)
        theirs = {t: bool(llama_cpp.llama_vocab_is_eog(vocab, i)) for t, i in ids.items()}
    finally:
        llm.close()
    assert theirs == {t: t in ("<|return|>", "<|call|>") for t in HARMONY}
    assert {t for t, i in ids.items() if i in ours} == {"<|return|>", "<|call|>"}


def llama_cpp_end_tokens(gguf: Path) -> set[int]:
    llama_cpp = need_llama_cpp()
    llm = llama_cpp.Llama(model_path=str(gguf), vocab_only=True, verbose=False)
    try:
        vocab = llama_cpp.llama_model_get_vocab(llm.model)
        return {i for i in range(llama_cpp.llama_vocab_n_tokens(vocab)) if llama_cpp.llama_vocab_is_eog(vocab, i)}
    finally:
        llm.close()


@pytest.mark.smollm2
def test_smollm2_ends_where_llama_cpp_does(smollm2_gguf):
    ours = read_config(smollm2_gguf).eos_token_ids
    assert set(ours) == llama_cpp_end_tokens(smollm2_gguf) and len(ours) == 3  # <|im_end|>, <|endoftext|>, <reponame>


@pytest.mark.gemma3_270m
def test_gemma3_ends_at_end_of_turn_as_llama_cpp_does(gemma3_270m_gguf):
    from inferplug.models.gguf import read_gguf

    ours = read_config(gemma3_270m_gguf).eos_token_ids
    tokens = read_gguf(gemma3_270m_gguf).metadata["tokenizer.ggml.tokens"]
    assert tokens.index("<end_of_turn>") in ours
    # llama.cpp's list also takes "</s>" (added there for PaddleOCR), which is text in Gemma's vocabulary (a
    # user-defined token, not a control one); llama.cpp takes it back out for Gemma 4 (its PR 21492), we never add it
    assert set(ours) == llama_cpp_end_tokens(gemma3_270m_gguf) - {tokens.index("</s>")}
