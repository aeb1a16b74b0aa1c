"""LangChain's ModelProfile (what agents read from `chat_model.profile`) for one inferplug profile.

Built from the resolver's plan and what each backend can do, without loading the model: a chat
model is cheap to construct and loads its engine on first use.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from langchain_core.language_models.model_profile import ModelProfile


def constrains_json(backend_name: str) -> bool:
    """Whether the backend decodes to a JSON schema (native: with xgrammar; a remote server: its own)."""
    if backend_name == "native":
        return importlib.util.find_spec("xgrammar") is not None
    return backend_name == "openai"


def model_profile(profile: Any, context_length: int | None = None) -> ModelProfile:
    """`context_length`: the context the chat model asks (its max_input_tokens), as ChatInferPlug's keyword."""
    from inferplug.hardware import probe
    from inferplug.profile import load_profile
    from inferplug.resolver import resolve

    # a name or path still (LangChain fills `.profile` before we load ours)
    profile = load_profile(profile, context_length=context_length)
    plan = resolve(profile, probe())
    structured = constrains_json(plan.backend)
    facts = ModelProfile(
        text_inputs=True, text_outputs=True, image_inputs=False, audio_inputs=False, video_inputs=False,
        tool_calling=True, tool_choice=True, tool_call_streaming=True,
        structured_output=structured, temperature=True,
        reasoning_output=profile.model.reasoning_parser not in (None, "none"),
    )
    if plan.max_model_len:
        facts["max_input_tokens"] = plan.max_model_len
    return facts
