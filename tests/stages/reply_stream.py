"""A model's reply fed back token by token through the output stage (stages/output.py), as the engine streams it."""

from __future__ import annotations

from inferplug.stages.output import ChoiceOutput
from inferplug.types import SamplingParams


def stream_reply(tokenizer, prompt: str, reply: str, ends: tuple[str, ...], parser: str,
                 max_tokens: int = 1000, offered: tuple[str, ...] = ()) -> tuple[str, str, list, str]:
    """(content, reasoning, tool-call pieces, finish reason) of `reply`'s tokens after `prompt`, `ends` the tokens
    that end it, `parser` the reasoning parser and `offered` the functions the request offered."""
    eos = [tokenizer.convert_tokens_to_ids(t) for t in ends]
    choice = ChoiceOutput("r", 0, tokenizer, tokenizer.encode(prompt), SamplingParams(), eos, max_tokens,
                          reasoning_parser=parser, callable_names=frozenset(offered))
    content, reasoning, calls, finish = "", "", [], None
    for token in tokenizer.encode(reply, add_special_tokens=False):
        event = choice.on_token(token)
        content, reasoning, calls = content + event.text, reasoning + event.reasoning, calls + event.tool_calls
        finish = event.finish_reason
        if choice.done:
            break
    return content, reasoning, calls, finish


def split_at(splitter, text: str, cut: int) -> tuple[str, str]:
    """(content, reasoning) of `text` fed to `splitter` as two deltas, cut at `cut`."""
    parts = [splitter.feed(text[:cut]), splitter.feed(text[cut:], final=True)]
    return "".join(p[0] for p in parts), "".join(p[1] for p in parts)
