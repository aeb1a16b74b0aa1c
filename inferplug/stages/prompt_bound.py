"""A lower bound on a text's token count without tokenizing it: no token stands for more bytes than the
vocabulary's longest entry (its UTF-8 length, itself at least the bytes it stands for), so a text of B bytes has at
least B / longest tokens. A prompt megabytes over the context is refused at once, instead of being tokenized for
seconds while it holds a core (issue 29: an 8 MiB prompt)."""

from __future__ import annotations

import functools
from typing import Any

from inferplug.errors import RequestError

# the fix for a prompt over the context, in each front end's words
LONGER_CONTEXT = ("shorten the prompt, or give the model a longer context, up to its own maximum: [limits] "
                  "max_model_len in the profile (-c/--ctx-size of `inferplug generate`, `chat` and `serve`; "
                  "context_length= in the LangChain and LlamaIndex classes)")


@functools.lru_cache(maxsize=16)
def longest_token_bytes(tokenizer: Any) -> int:
    return max((len(token.encode()) for token in tokenizer.get_vocab()), default=1) or 1


def check_text_fits(tokenizer: Any, text: str | list[str], context_length: int, param: str) -> None:
    """RequestError when `text` (or the texts of one prompt together, a chat's contents) surely has more tokens than
    the context holds (a text that may fit passes)."""
    texts = [text] if isinstance(text, str) else text
    chars = sum(map(len, texts))
    if chars < context_length:  # fewer characters than the context: it fits whatever the tokenizer
        return
    least = sum(len(t.encode()) for t in texts) // longest_token_bytes(tokenizer)
    if least >= context_length:
        raise RequestError(f"the prompt's {chars} characters make at least {least} tokens, but the context holds "
                           f"{context_length}: {LONGER_CONTEXT}", param=param)
