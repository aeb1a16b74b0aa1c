"""A transformers tokenizer built from a GGUF file's tokenizer.ggml.* metadata, and kept in the conversion cache as
tokenizers' JSON: building a 262k-token vocabulary took 3.0 s of a load, reading the JSON back 0.7 s."""

from __future__ import annotations

import logging

from inferplug.errors import ModelSourceError
from inferplug.models.gguf import GGUFFile

log = logging.getLogger(__name__)
TOKENIZER_VERSION = 1  # bump when the built tokenizer changes: old cache entries then age out

# tokenizer.ggml.<key> -> the name transformers' GGUF tokenizer converter expects.
_CONVERTER_KEYS = {
    "model": "tokenizer_type", "pre": "pre_tokenizer_type", "tokens": "tokens", "scores": "scores",
    "token_type": "token_type", "merges": "merges", "precompiled_charsmap": "precompiled_charsmap",
    "bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id", "unknown_token_id": "unk_token_id",
    "padding_token_id": "pad_token_id", "add_space_prefix": "add_prefix_space",
}  # fmt: skip
_SPECIAL_TOKEN_KEYS = {"bos": "bos_token_id", "eos": "eos_token_id", "unk": "unknown_token_id", "pad": "padding_token_id"}


def tokenizer_from_gguf(gguf: GGUFFile):
    """A PreTrainedTokenizerFast built from tokenizer.ggml.* metadata, the way transformers builds it; its backend
    from the conversion cache where it was built before."""
    import tokenizers
    import transformers
    from transformers import PreTrainedTokenizerFast

    from inferplug.models.conversion_cache import cached_text, file_identity

    meta = gguf.metadata
    if "tokenizer.ggml.tokens" not in meta:
        raise ModelSourceError(f"{gguf.path} carries no tokenizer; set `tokenizer` in the profile to an HF tokenizer dir.")
    tokens = meta["tokenizer.ggml.tokens"]
    specials = {
        f"{role}_token": tokens[meta[f"tokenizer.ggml.{key}"]]
        for role, key in _SPECIAL_TOKEN_KEYS.items()
        if f"tokenizer.ggml.{key}" in meta
    }
    # llama.cpp adds BOS to a sentencepiece ("llama") vocabulary unless the file says otherwise.
    add_bos = meta.get("tokenizer.ggml.add_bos_token", meta.get("tokenizer.ggml.model") == "llama")
    settings = {"chat_template": meta.get("tokenizer.chat_template"), "add_bos_token": add_bos,
                "add_eos_token": meta.get("tokenizer.ggml.add_eos_token", False), **specials}
    key = ["gguf-tokenizer", TOKENIZER_VERSION, file_identity(gguf.path), transformers.__version__,
           tokenizers.__version__]
    for _ in range(2):  # a damaged entry is deleted, then written again
        path = cached_text(key, ".tokenizer.json", lambda: _backend(gguf).to_str())
        if path is None:
            break
        try:  # from the file: a backend object passed in is deep-copied, which costs what reading the file does
            return PreTrainedTokenizerFast(tokenizer_file=str(path), **settings)
        except Exception as exc:  # noqa: BLE001 - tokenizers raises a bare Exception for a file it cannot parse
            log.warning("conversion cache: %s does not parse (%s); building the tokenizer again", path, exc)
            path.unlink(missing_ok=True)
    return PreTrainedTokenizerFast(tokenizer_object=_backend(gguf), **settings)


def _backend(gguf: GGUFFile):
    """The `tokenizers` Tokenizer transformers' converter builds from the file's vocabulary."""
    meta = gguf.metadata
    spec = {name: meta[f"tokenizer.ggml.{key}"] for key, name in _CONVERTER_KEYS.items() if f"tokenizer.ggml.{key}" in meta}
    try:
        return _convert_gguf_tokenizer()(gguf.architecture, spec)[0]
    except (ValueError, KeyError, NotImplementedError) as exc:
        raise ModelSourceError(f"Cannot build the tokenizer of {gguf.path}: {exc}") from exc


def _convert_gguf_tokenizer():
    """transformers' vocabulary -> `tokenizers` converter; it moved between transformers releases."""
    try:
        from transformers.integrations.gguf import convert_gguf_tokenizer
    except ImportError:
        from transformers.integrations.ggml import convert_gguf_tokenizer
    return convert_gguf_tokenizer
