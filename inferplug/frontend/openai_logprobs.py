"""Logprobs in the JSON shapes OpenAI (chat and completion choices) and vLLM (prompt_logprobs) give them: the
server's responses and the LangChain integration's response metadata use the same ones."""

from __future__ import annotations

from typing import Any

from inferplug.types import TokenLogprob


def _token_bytes(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def chat_logprobs(entries: list[TokenLogprob]) -> dict[str, Any]:
    return {"content": [
        {"token": e.token, "logprob": e.logprob, "bytes": _token_bytes(e.token),
         "top_logprobs": [{"token": t, "logprob": lp, "bytes": _token_bytes(t)} for _, t, lp in e.top]}
        for e in entries
    ]}


def completion_logprobs(entries: list[TokenLogprob], text_offset: int) -> dict[str, Any]:
    offsets = []
    for e in entries:
        offsets.append(text_offset)
        text_offset += len(e.token)
    return {
        "tokens": [e.token for e in entries],
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [None if e.logprob is None else {t: lp for _, t, lp in e.top} for e in entries],
        "text_offset": offsets,
    }


def vllm_prompt_logprobs(entries: list[TokenLogprob | None]) -> list[dict[str, Any] | None]:
    """vLLM's `prompt_logprobs` of a completion choice: per prompt token, None for the first, else
    {token id: {logprob, decoded_token}} for the token and its top alternatives."""
    return [None if e is None else {str(i): {"logprob": lp, "decoded_token": t} for i, t, lp in [(e.token_id, e.token,
            e.logprob), *e.top]} for e in entries]
