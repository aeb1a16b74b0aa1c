"""Gemma 4's reply split into content, reasoning and tool calls, as vLLM's `gemma4` parsers do.

Thinking is a channel: `<|channel>thought\n...\n<channel|>` (the template opens and closes an empty one in the
prompt when thinking is off); the newlines around the thought are the format's, not the thought's. A tool call is
`<|tool_call>call:NAME{key:value,...}<tool_call|>`, its arguments in Gemma's own notation: bare keys, strings between
`<|"|>` marks, numbers, booleans, lists and objects as in JSON; the model then writes `<|tool_response>` and stops (an
end token) for the caller to answer. The control tokens are special
tokens, so the detokenizer keeps them in the text for this parser (`reads_control_tokens`). A call is sent whole
once it closes (its arguments are JSON only then); a tag cut across two deltas is held back.
"""

from __future__ import annotations

import json
import re
import uuid

from inferplug.stages.tag_splitter import TagSplitter
from inferplug.types import ToolCallDelta

CHANNEL, CHANNEL_END = "<|channel>", "<channel|>"
CALL, CALL_END = "<|tool_call>", "<tool_call|>"
QUOTE = '<|"|>'  # Gemma's string mark in a call's arguments
TAGS = (CHANNEL, CHANNEL_END, CALL, CALL_END)
_CALL = re.compile(r"\s*call:([\w.-]+)\s*(\{.*\})\s*", re.S)
_WORD = re.compile(r"[A-Za-z_][\w.-]*")


class Gemma4Splitter(TagSplitter):
    TAGS = TAGS

    def __init__(self, callable_names: frozenset[str] = frozenset()) -> None:
        super().__init__()
        self.callable_names = callable_names  # the functions the request offered: calls to them are tool calls
        self._target = "content"  # "content", "header" (a channel's name), "reasoning" or "call"
        self._text = ""  # the channel name or the call read so far
        self._num_calls = 0

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        """The (content, reasoning) this delta completes; `final` flushes what a tag prefix held back, and a call or
        channel left open (a reply cut short) as the text it was."""
        out = self._split(text, final)
        if final and self._target in ("header", "call") and self._text:
            out["reasoning" if self._target == "header" else "content"].append(self._text)
            self._text = ""
        return "".join(out["content"]), "".join(out["reasoning"])

    def _hold(self, text: str) -> int:
        keep = super()._hold(text)
        thinking = self._target in ("header", "reasoning") and text[: len(text) - keep].endswith("\n")
        return keep + thinking  # maybe the newline before <channel|>

    def _read(self, text: str, out: dict[str, list[str]], before: str | None) -> None:
        closing = before == CHANNEL_END
        if self._target == "header":  # the channel's name, up to its newline
            self._text += text
            if "\n" not in self._text:
                return
            _, text = self._text.split("\n", 1)
            self._target, self._text = "reasoning", ""
        if self._target == "call":
            self._text += text
        elif text:
            out[self._target].append(text.removesuffix("\n") if closing and self._target == "reasoning" else text)

    def _control(self, tag: str, out: dict[str, list[str]]) -> None:
        if tag == CHANNEL:
            self._target, self._text = "header", ""
        elif tag == CHANNEL_END:
            self._target, self._text = "content", ""
        elif tag == CALL:
            self._target, self._text = "call", ""
        else:  # a call's end: sent whole, or as the text it was where it does not read as one of an offered function
            call = as_call(self._text)
            if call is None or call[0] not in self.callable_names:
                out["content"].append(CALL + self._text + CALL_END)
            else:
                self._calls.append(ToolCallDelta(index=self._num_calls, id=f"call_{uuid.uuid4().hex[:24]}",
                                                 name=call[0], arguments=json.dumps(call[1], ensure_ascii=False)))
                self._num_calls += 1
            self._target, self._text = "content", ""


def as_call(text: str) -> tuple[str, dict] | None:
    """(name, arguments) of a call's text `call:NAME{...}`, or None where it is not one."""
    match = _CALL.fullmatch(text)
    if match is None:
        return None
    try:
        arguments = json.loads(arguments_json(match.group(2)))
    except ValueError:
        return None
    return (match.group(1), arguments) if isinstance(arguments, dict) else None


def arguments_json(text: str) -> str:
    """Gemma's argument notation as JSON: each `<|"|>...<|"|>` a JSON string, each bare word before a `:` a quoted
    key; numbers, true, false, null and the brackets are JSON's already. A ValueError for an unclosed string."""
    out, at = [], 0
    while at < len(text):
        if text.startswith(QUOTE, at):
            end = text.find(QUOTE, at + len(QUOTE))
            if end < 0:
                raise ValueError("an unclosed string")
            out.append(json.dumps(text[at + len(QUOTE):end], ensure_ascii=False))
            at = end + len(QUOTE)
        elif word := _WORD.match(text, at):
            at = word.end()
            out.append(json.dumps(word.group()) if text[at:at + 1] == ":" else word.group())
        else:
            out.append(text[at])
            at += 1
    return "".join(out)
