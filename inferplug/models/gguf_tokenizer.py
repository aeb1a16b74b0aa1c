"""A transformers tokenizer built from a GGUF file's tokenizer.ggml.* metadata."""

from __future__ import annotations

from inferplug.errors import ModelSourceError
from inferplug.models.gguf import GGUFFile

# tokenizer.ggml.<key> -> the name transformers' GGUF tokenizer converter expects.
_CONVERTER_KEYS = {
    "model": "tokenizer_type", "pre": "pre_tokenizer_type", "tokens": "tokens", "scores": "scores",
    "token_type": "token_type", "merges": "merges", "precompiled_charsmap": "precompiled_charsmap",
    "bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id", "unknown_token_id": "unk_token_id",
    "padding_token_id": "pad_token_id", "add_space_prefix": "add_prefix_space",
}  # fmt: skip
_SPECIAL_TOKEN_KEYS = {"bos": "bos_token_id", "eos": "eos_token_id", "unk": "unknown_token_id", "pad": "padding_token_id"}


def tokenizer_from_gguf(gguf: GGUFFile):
    """A PreTrainedTokenizerFast built from tokenizer.ggml.* metadata, the way transformers builds it."""
    from transformers import PreTrainedTokenizerFast

    meta = gguf.metadata
    if "tokenizer.ggml.tokens" not in meta:
        raise ModelSourceError(f"{gguf.path} carries no tokenizer; set `tokenizer` in the profile to an HF tokenizer dir.")
    tokens = meta["tokenizer.ggml.tokens"]
    spec = {name: meta[f"tokenizer.ggml.{key}"] for key, name in _CONVERTER_KEYS.items() if f"tokenizer.ggml.{key}" in meta}
    try:
        backend = _convert_gguf_tokenizer()(gguf.architecture, spec)[0]
    except (ValueError, KeyError, NotImplementedError) as exc:
        raise ModelSourceError(f"Cannot build the tokenizer of {gguf.path}: {exc}") from exc
    specials = {
        f"{role}_token": tokens[meta[f"tokenizer.ggml.{key}"]]
        for role, key in _SPECIAL_TOKEN_KEYS.items()
        if f"tokenizer.ggml.{key}" in meta
    }
    # llama.cpp adds BOS to a sentencepiece ("llama") vocabulary unless the file says otherwise.
    add_bos = meta.get("tokenizer.ggml.add_bos_token", spec.get("tokenizer_type") == "llama")
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        chat_template=meta.get("tokenizer.chat_template"),
        add_bos_token=add_bos,
        add_eos_token=meta.get("tokenizer.ggml.add_eos_token", False),
        **specials,
    )


def _convert_gguf_tokenizer():
    """transformers' vocabulary -> `tokenizers` converter; it moved between transformers releases."""
    try:
        from transformers.integrations.gguf import convert_gguf_tokenizer
    except ImportError:
        from transformers.integrations.ggml import convert_gguf_tokenizer
    return convert_gguf_tokenizer
