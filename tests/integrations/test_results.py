"""Folding a request's events into a Result, and telling an engine failure from bad input."""

from __future__ import annotations

import pytest

from inferplug.errors import GenerationError, RequestError
from inferplug.frontend.calls import collect
from inferplug.types import Event, Usage


def test_choice_zero_text_and_the_final_usage_are_folded():
    result = collect([
        Event("r", text="Hel", token_ids=[1]),
        Event("r", index=1, text="other choice"),
        Event("r", text="lo", token_ids=[2], finish_reason="stop", stop_reason="\n", usage=Usage(3, 2)),
    ])
    assert (result.text, result.token_ids, result.finish_reason, result.stop_reason) == ("Hello", [1, 2], "stop", "\n")
    assert result.usage == Usage(3, 2)


def test_an_engine_failure_is_a_generation_error_not_a_request_error():
    with pytest.raises(GenerationError, match="generation failed: device lost") as caught:
        collect([Event("r", text="Hi"), Event("r", finish_reason="error", error="device lost")])
    assert not isinstance(caught.value, RequestError)
