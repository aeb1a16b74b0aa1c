"""gpt-oss's harmony output split into content, reasoning and tool calls, as vLLM's `openai_gptoss` parser does.

A harmony reply is a run of messages, each a header then a body: `<|channel|>analysis<|message|>...<|end|>`, then
`<|start|>assistant<|channel|>final<|message|>...` up to `<|return|>` (the prompt ends at `<|start|>assistant`, so
the reply opens with a header). The header names the channel and maybe a recipient, in the role part (`assistant
to=functions.get_weather<|channel|>commentary json`) or after the channel (`<|channel|>commentary
to=functions.get_weather <|constrain|>json`). The analysis channel is reasoning; the final channel and commentary
with no recipient (a preamble the user sees) are content; a message to `functions.NAME` is a call to tool NAME whose
body streams as its arguments, ending at `<|call|>`, where the request offered NAME; a message to any other
recipient (a built-in tool we do not run, a function the request did not offer) is reasoning. A reply cut inside a
header gives nothing of it. These control tokens are special tokens, so the detokenizer keeps them in the text for
this parser (`reads_control_tokens`). Splitting runs on the stream: a control token cut across two deltas is held
back.
"""

from __future__ import annotations

import re
import uuid

from inferplug.stages.tag_splitter import TagSplitter
from inferplug.types import ToolCallDelta

START, CHANNEL, MESSAGE, CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")  # <|call|> and <|return|> end the reply too (EOS ids): seldom seen here
TAGS = (START, CHANNEL, MESSAGE, CONSTRAIN, *ENDS)
_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*([\w-]+)")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
FUNCTIONS = "functions."


class HarmonySplitter(TagSplitter):
    TAGS = TAGS

    def __init__(self, callable_names: frozenset[str] = frozenset()) -> None:
        super().__init__()
        self.callable_names = callable_names  # the functions the request offered: calls to them are tool calls
        self._header: str | None = ""  # the header read so far; None inside a message's body
        self._target = "content"  # where the body goes: "content", "reasoning" or "call"
        self._num_calls = 0
        self._opened = False  # a message has begun

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        """The (content, reasoning) this delta completes; `final` flushes what a control-token prefix held back (a
        reply that never opened a message is given as content: the model wrote plain text)."""
        out = self._split(text, final)
        if final and not self._opened and self._header and not any(tag in self._header for tag in TAGS):
            out["content"].append(self._header)  # never a message, nor a header cut short: plain text
            self._header = ""
        return "".join(out["content"]), "".join(out["reasoning"])

    def _read(self, text: str, out: dict[str, list[str]], before: str | None) -> None:
        if not text:
            return
        if self._header is not None:
            self._header += text
        elif self._target == "call":
            self._calls.append(ToolCallDelta(index=self._num_calls - 1, arguments=text))
        else:
            out[self._target].append(text)

    def _control(self, tag: str, out: dict[str, list[str]]) -> None:
        if tag == START:  # a new message's header (the role first)
            self._header = ""
        elif tag in (CHANNEL, CONSTRAIN):  # part of the header; a body does not hold them
            if self._header is None:
                self._header = ""  # a model that skips <|end|><|start|>: a new header
            self._header += tag
        elif tag == MESSAGE:
            self._open(self._header or "")
        else:  # an end: what follows is the next message's header
            self._header = ""

    def _open(self, header: str) -> None:
        """The body that follows `header` goes where its channel and recipient say."""
        self._header, self._opened = None, True
        channel = _CHANNEL.search(header)
        recipient = _RECIPIENT.search(header)
        if recipient and recipient.group(1).startswith(FUNCTIONS) and \
                recipient.group(1)[len(FUNCTIONS):] in self.callable_names:
            self._target = "call"
            self._num_calls += 1
            self._calls.append(ToolCallDelta(index=self._num_calls - 1, id=f"call_{uuid.uuid4().hex[:24]}",
                                             name=recipient.group(1)[len(FUNCTIONS):]))
        elif recipient is None and channel is not None and channel.group(1) in ("final", "commentary"):
            self._target = "content"
        else:
            self._target = "reasoning"
