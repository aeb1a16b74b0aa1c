"""The stream loop of a reply format driven by control tags (gpt-oss's harmony, Gemma 4's channels): the text is cut
at each tag, the pieces between go to the format's `_read` and each tag to its `_control`, and a tag cut across two
deltas is held back until the next."""

from __future__ import annotations

from inferplug.stages.reasoning import partial_tag_suffix
from inferplug.types import ToolCallDelta


class TagSplitter:
    """One choice's text deltas, control tokens included, in; (content, reasoning) deltas out, and the tool calls'
    pieces by `take_calls`. A format sets TAGS and gives `_read(text, out, before)` (`before`: the tag that follows
    the text, None at a delta's end) and `_control(tag, out)`; `out` maps "content" and "reasoning" to their pieces."""

    TAGS: tuple[str, ...] = ()
    reads_control_tokens = True  # the detokenizer keeps special tokens in the text for these formats

    def __init__(self) -> None:
        self._held = ""
        self._calls: list[ToolCallDelta] = []

    def take_calls(self) -> list[ToolCallDelta]:
        """The tool-call pieces the deltas fed since the last take completed."""
        calls, self._calls = self._calls, []
        return calls

    def _split(self, text: str, final: bool) -> dict[str, list[str]]:
        """Run the delta through _read and _control; `final` holds nothing back."""
        buf, self._held = self._held + text, ""
        out: dict[str, list[str]] = {"content": [], "reasoning": []}
        while buf:
            found = [(at, tag) for tag in self.TAGS if (at := buf.find(tag)) >= 0]
            if not found:
                keep = 0 if final else self._hold(buf)
                self._read(buf[: len(buf) - keep], out, None)
                self._held = buf[len(buf) - keep:]
                break
            at, tag = min(found)
            self._read(buf[:at], out, tag)
            self._control(tag, out)
            buf = buf[at + len(tag):]
        return out

    def _hold(self, text: str) -> int:
        """How much of the end of `text` to hold back: what could begin a tag."""
        return partial_tag_suffix(text, self.TAGS)

    def _read(self, text: str, out: dict[str, list[str]], before: str | None) -> None:
        raise NotImplementedError

    def _control(self, tag: str, out: dict[str, list[str]]) -> None:
        raise NotImplementedError
