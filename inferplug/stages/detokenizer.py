"""Incremental detokenization with stop strings.

Text is emitted only once it is stable: a token that ends inside a multi-byte UTF-8 character
decodes to U+FFFD and is held until the character completes (a sequence that ends inside one gives
its bytes as U+FFFD then, as the tokenizer's own decode does), and the last (longest stop string
- 1) characters are held back because they may be the start of a stop string.
"""

from __future__ import annotations

from typing import Any

_PROMPT_CONTEXT = 4  # a few prompt tokens decoded alongside so leading spaces come out right


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any, prompt_ids: list[int], stop: list[str], include_stop: bool = False,
                 keep_special: bool = False):
        """`keep_special`: special tokens are text too (gpt-oss's harmony control tokens, for its parser)."""
        self.tokenizer = tokenizer
        self.skip_special = not keep_special
        self.ids = list(prompt_ids[-_PROMPT_CONTEXT:])
        # Context that is not whole characters (stray bytes of a byte-fallback vocabulary, Gemma's and Llama 2's) would
        # spoil the text after it: such a decoder turns a whole run of byte tokens into U+FFFD once one is stray.
        if "\ufffd" in tokenizer.decode(self.ids, skip_special_tokens=self.skip_special):
            self.ids = []
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.stop = stop
        self.include_stop = include_stop
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.text = ""  # all output text so far (truncated at a stop string once one matches)
        self.emitted = 0  # characters of self.text already handed out
        self.stopped = False  # a stop string matched: nothing after it is text

    def add(self, token_id: int | None) -> str | None:
        """Feed one output token (None: nothing new). Returns the stop string if one just matched."""
        if token_id is not None:
            self.ids.append(token_id)
            return self._read(complete_only=True)
        return None

    def _read(self, complete_only: bool) -> str | None:
        """Append the text of the tokens not yet read: only once their last character is complete, unless told."""
        decode = lambda ids: self.tokenizer.decode(ids, skip_special_tokens=self.skip_special)  # noqa: E731
        prefix = decode(self.ids[self.prefix_offset:self.read_offset])
        full = decode(self.ids[self.prefix_offset:])
        if len(full) > len(prefix) and not (complete_only and full.endswith("\ufffd")):
            start = len(self.text)
            self.text += full[len(prefix):]
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            return self._find_stop(start)
        return None

    def _find_stop(self, new_from: int) -> str | None:
        """Cut at the earliest stop string in the text (ties: the longest), whatever its place in the list."""
        found = [(at, -len(stop), stop) for stop in self.stop
                 if (at := self.text.find(stop, max(new_from - len(stop) + 1, 0))) >= 0]
        if not found:
            return None
        at, _, stop = min(found)
        self.stopped = True
        self.text = self.text[: at + len(stop) if self.include_stop else at]
        return stop

    def delta(self, final: bool) -> str:
        """New text safe to emit now (everything, once the sequence is finished)."""
        if final and not self.stopped and self.read_offset < len(self.ids):  # it ended inside a character
            self._read(complete_only=False)
        end = len(self.text) if final else max(len(self.text) - self.hold, self.emitted)
        out = self.text[self.emitted:end]
        self.emitted = end
        return out
