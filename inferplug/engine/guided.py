"""Constrained decoding to a JSON schema, with xgrammar.

The sampler asks a Guide for each step's allowed tokens (`fill_mask` puts -inf on
the rest, in place), then tells it the sampled token (`accept`). When the JSON
value is complete the grammar only allows EOS; after EOS `is_terminated()` is true.

Whitespace inside the JSON is fixed (compact separators): with free whitespace a
small model can emit newlines forever and never close the object.
"""

from __future__ import annotations

import json
import threading
import weakref
from typing import Any

from inferplug.errors import RequestError

_compilers: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()  # tokenizer -> GrammarCompiler
_compilers_lock = threading.Lock()
# Compiled grammars a compiler keeps, least recently used evicted past this (xgrammar's default keeps them all, so
# a client sending a new schema per request would grow the server without bound)
GRAMMAR_CACHE_BYTES = 64 * 1024 * 1024


def _compiler_for(tokenizer: Any) -> Any:
    """One GrammarCompiler per tokenizer: building its token table takes ~0.5 s, compiled grammars are cached in it."""
    import xgrammar as xgr

    with _compilers_lock:
        compiler = _compilers.get(tokenizer)
        if compiler is None:
            info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer))
            compiler = xgr.GrammarCompiler(info, max_threads=2, cache_limit_bytes=GRAMMAR_CACHE_BYTES)
            _compilers[tokenizer] = compiler
        return compiler


def compile_json_schema(tokenizer: Any, json_schema: dict[str, Any] | str) -> Any:
    """Compile a schema, or raise RequestError naming why it cannot become a grammar."""
    try:
        text = json_schema if isinstance(json_schema, str) else json.dumps(json_schema)
        return _compiler_for(tokenizer).compile_json_schema(text, any_whitespace=False)
    except (RuntimeError, ValueError, TypeError) as exc:
        raise RequestError(
            f"json_schema cannot be compiled to a grammar for constrained decoding: {exc}. "
            "Use a plain JSON schema (object/array/string/number/boolean/enum/anyOf, local $refs).",
            param="json_schema",
        ) from exc


class Guide:
    """The per-request grammar state; not thread-safe (one sequence, one engine thread)."""

    def __init__(self, compiled_grammar: Any) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        self._matcher = xgr.GrammarMatcher(compiled_grammar)
        self._vocab_size = compiled_grammar.tokenizer_info.vocab_size
        self._bitmask = xgr.allocate_token_bitmask(1, self._vocab_size)

    def fill_mask(self, logits_row: Any) -> None:
        """Set disallowed tokens of one row of logits (shape [vocab]) to -inf, in place."""
        import torch

        self._matcher.fill_next_token_bitmask(self._bitmask)
        if logits_row.dtype == torch.float32:
            self._xgr.apply_token_bitmask_inplace(logits_row, self._bitmask, vocab_size=self._vocab_size)
            logits_row[self._vocab_size :] = float("-inf")  # ids past the tokenizer (padded lm_head)
            return
        # The CPU kernel takes float32 only; other dtypes go through a bool mask.
        allowed = self.allowed_mask(logits_row.shape[-1])
        logits_row.masked_fill_(~allowed.to(logits_row.device), float("-inf"))

    def allowed_mask(self, width: int) -> Any:
        """The current bitmask unpacked to a bool tensor of `width` (padding columns disallowed)."""
        import torch

        bits = self._bitmask[0]
        shifts = torch.arange(32, dtype=torch.int32)
        unpacked = ((bits.unsqueeze(1) >> shifts) & 1).bool().flatten()[: self._vocab_size]
        mask = torch.zeros(width, dtype=torch.bool)
        mask[: min(width, self._vocab_size)] = unpacked[:width]
        return mask

    def accept(self, token_id: int) -> bool:
        """Advance by the sampled token. False means the grammar rejected it (the sampler skipped fill_mask)."""
        return bool(self._matcher.accept_token(int(token_id)))

    def is_terminated(self) -> bool:
        return bool(self._matcher.is_terminated())


def make_guide(tokenizer: Any, json_schema: dict[str, Any] | str) -> Guide:
    """A fresh Guide for one request, constraining its output to `json_schema`."""
    return Guide(compile_json_schema(tokenizer, json_schema))
