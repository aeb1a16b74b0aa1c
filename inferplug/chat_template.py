"""Render chat messages to prompt text: the profile's template when it sets one, else the tokenizer's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inferplug.errors import RequestError


def render_chat(tokenizer: Any, profile: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
    """The prompt for `messages` (and OpenAI tool schemas), ending with the assistant's turn."""
    template = profile_template(profile)
    if template is None and not getattr(tokenizer, "chat_template", None):
        raise RequestError(
            "the model has no chat template: set [model] chat_template in the profile, or send a plain prompt",
            param="messages",
        )
    try:
        return tokenizer.apply_chat_template(
            messages, tools=tools, chat_template=template, tokenize=False, add_generation_prompt=True
        )
    except Exception as exc:  # noqa: BLE001 - a template error is the request's or profile's problem, reported as such
        raise RequestError(f"the chat template cannot render these messages: {exc}", param="messages") from exc


def profile_template(profile: Any) -> str | None:
    """[model] chat_template: inline Jinja, or the path of a file holding it."""
    model = getattr(profile, "model", None)
    template = getattr(model, "chat_template", None)
    if not template:
        return None
    if "{" not in template and Path(template).expanduser().is_file():
        return Path(template).expanduser().read_text()
    return template
