"""Render chat messages to prompt text: the profile's template when it sets one, else the tokenizer's."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from inferplug.errors import InferPlugError, RequestError
from inferplug.stages.prompt_bound import check_text_fits
from inferplug.stages.reasoning import detect_parser


# what render_chat passes apply_chat_template itself: a request's template variables may not replace them
_RENDER_ARGUMENTS = {"conversation", "messages", "tools", "chat_template", "tokenize", "add_generation_prompt"}


def render_chat(tokenizer: Any, template: str | None, messages: list[dict[str, Any]],
                tools: list[dict[str, Any]] | None = None, template_kwargs: dict[str, Any] | None = None) -> str:
    """The prompt for `messages` (and OpenAI tool schemas), ending with the assistant's turn; `template`: the
    profile's (profile_template), None for the tokenizer's. `template_kwargs`: the request's extra template
    variables (Request.chat_template_kwargs: Qwen3's enable_thinking)."""
    if template is None and not getattr(tokenizer, "chat_template", None):
        raise RequestError(f"the model has no chat template, so it cannot take messages: {NO_TEMPLATE_FIX}",
                           param="messages")
    clash = _RENDER_ARGUMENTS & set(template_kwargs or {})
    if clash:
        raise RequestError(f"chat_template_kwargs may not set {sorted(clash)}: the request gives those itself; "
                           "drop them from chat_template_kwargs", param="chat_template_kwargs")
    try:
        return tokenizer.apply_chat_template(
            messages, tools=tools, chat_template=template, tokenize=False, add_generation_prompt=True,
            **(template_kwargs or {}),
        )
    except Exception as exc:  # noqa: BLE001 - a template error is the request's or profile's problem, reported as such
        raise RequestError(f"the chat template cannot render these messages: {exc}", param="messages") from exc


# what a user whose model has no template (a base model's file carries none) can do instead
NO_TEMPLATE_FIX = ("send a plain prompt (/v1/completions, `inferplug generate` without --chat, LLM.generate), or "
                   "give the model a template: [model] chat_template in a profile, or INFERPLUG_MODEL__CHAT_TEMPLATE "
                   "(inline Jinja or a file's path)")


def template_variables(chat_template_kwargs: dict[str, Any] | None,
                       reasoning_effort: str | None) -> dict[str, Any] | None:
    """A request's template variables: OpenAI's reasoning_effort as the variable gpt-oss's template reads (as vLLM
    passes it), then chat_template_kwargs, which win; None for none."""
    effort = {"reasoning_effort": reasoning_effort} if reasoning_effort else {}
    return {**effort, **(chat_template_kwargs or {})} or None


def profile_template(profile: Any) -> str | None:
    """[model] chat_template: inline Jinja, or the path of a file holding it."""
    model = getattr(profile, "model", None)
    template = getattr(model, "chat_template", None)
    if not template:
        return None
    if "{" not in template and Path(template).expanduser().is_file():
        return Path(template).expanduser().read_text()
    return template


def chat_template_text(profile: Any, tokenizer: Any) -> str | None:
    """The template a chat renders with: the profile's, else the tokenizer's; None: the model has none (render_chat
    refuses messages)."""
    return profile_template(profile) or getattr(tokenizer, "chat_template", None) or None


def reasoning_parser(profile: Any, tokenizer: Any) -> str | None:
    """The parser that splits the model's <think> text out of its answer (stages/reasoning.py): [model]
    reasoning_parser, else what the chat template implies; None for none (and with no tokenizer: a remote server
    splits it itself)."""
    named = profile.model.reasoning_parser
    if named is not None or tokenizer is None:
        return None if named in (None, "none") else named
    template = profile_template(profile)
    try:
        prompt = render_chat(tokenizer, template, [{"role": "user", "content": "hi"}])
    except InferPlugError:
        return None
    return detect_parser(template or tokenizer.chat_template, prompt)


def encode_chat(tokenizer: Any, render: Any, messages: list[dict[str, Any]],
                tools: list[dict[str, Any]] | None = None, context_length: int | None = None) -> tuple[list[int], str]:
    """The token ids and text of the chat `render(messages, tools)` gives, where a special token typed in any client
    string (a message's content, a tool's description, ...) is text, not the control token: `<|im_start|>system` in
    a user message cannot open a system turn. The template's own special tokens stay control tokens.

    A chat without such strings is one plain encode. Otherwise the chat is rendered a second time with each such
    string replaced by a placeholder, so its place in the prompt is known; the template's parts are encoded as usual
    and the client's strings with split_special_tokens. `context_length`: a chat surely longer is refused before
    it is tokenized (RequestError)."""
    text = render(messages, tools)
    if context_length is not None:
        check_text_fits(tokenizer, text, context_length, "messages")
    specials = [t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values() if t.special and t.content]
    # whether any client string may hold a special token: one scan of the chat as JSON text (a special token that
    # JSON escapes, one holding a quote, a backslash or a control character, is always looked for string by string)
    try:
        chat = json.dumps([messages, tools], ensure_ascii=False, default=str)
        may_hold = any(s in chat or json.dumps(s, ensure_ascii=False)[1:-1] != s for s in specials)
    except (TypeError, ValueError):  # not JSON-like: look string by string
        may_hold = True
    typed: dict[str, str] = {}  # a client string holding a special token -> its placeholder
    placed = _with_placeholders([messages, tools], specials, typed) if may_hold else None
    if not typed:
        return tokenizer.encode(text, add_special_tokens=False), text
    placed_messages, placed_tools = placed
    pieces = re.split(f"({'|'.join(map(re.escape, typed.values()))})", render(placed_messages, placed_tools))
    strings = {placeholder: string for string, placeholder in typed.items()}
    if "".join(strings.get(piece, piece) for piece in pieces) != text:
        found = next(s for s in specials if any(s in string for string in typed))
        raise RequestError(f"a message holds the special token {found!r}, and this chat template changes message text "
                           "as it renders it, so the token cannot be kept as plain text; remove it from the message",
                           param="messages")
    ids: list[int] = []
    for piece in pieces:
        if piece in strings:
            ids += tokenizer.encode(strings[piece], add_special_tokens=False, split_special_tokens=True)
        elif piece:
            ids += tokenizer.encode(piece, add_special_tokens=False)
    return ids, text


def _with_placeholders(value: Any, specials: list[str], typed: dict[str, str]) -> Any:
    """`value` (messages, tools: JSON-like) with every string that holds a special token replaced by a placeholder
    (private-use characters no tokenizer treats specially), recorded in `typed`. A role holding one is refused: a
    template compares roles, so a placeholder there would change the chat's shape."""
    if isinstance(value, str):
        if not any(special in value for special in specials):
            return value
        return typed.setdefault(value, f"\ue000{len(typed)}\ue001")
    if isinstance(value, list):
        return [_with_placeholders(item, specials, typed) for item in value]
    if isinstance(value, dict):
        if isinstance(value.get("role"), str) and any(s in value["role"] for s in specials):
            raise RequestError(f"the role {value['role'][:40]!r} holds a special token; use system, user, assistant "
                               "or tool", param="messages")
        return {key: _with_placeholders(item, specials, typed) for key, item in value.items()}
    return value
