"""LLM() is the native engine's API: a profile resolved to another backend is refused with the way to reach it."""

from __future__ import annotations

import pytest

from inferplug import LLM
from inferplug.errors import ProfileError


def test_llm_refuses_a_profile_that_resolves_to_another_backend():
    pytest.importorskip("httpx")
    with pytest.raises(ProfileError, match="resolves to the 'openai' backend here; use .*get_backend"):
        LLM("openai-remote")
