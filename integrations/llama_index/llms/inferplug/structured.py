"""Streaming structured output: the chat stream, constrained to the class's JSON schema, as partial objects.

Each text delta yields the object parsed so far (LlamaIndex's Flexible model: every field optional, the
unfinished JSON repaired); the stream ends with the whole object, validated against the class.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

from llama_index.core.base.llms.types import ChatResponse
from llama_index.core.program.utils import process_streaming_objects
from pydantic import BaseModel, ValidationError


def constrained_kwargs(output_cls: type[BaseModel], llm_kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """The chat call's kwargs: the caller's, plus the class's JSON schema as the decoding constraint."""
    return {**(llm_kwargs or {}), "json_schema": output_cls.model_json_schema()}


def validated(output_cls: type[BaseModel], response: ChatResponse | None) -> BaseModel:
    """The response's JSON as `output_cls`. A reply that max_tokens cut before its JSON closed is an error that says
    so, where pydantic would only report broken JSON."""
    content = response.message.content or "" if response else ""
    try:
        return output_cls.model_validate_json(content)
    except ValidationError as error:
        if response is not None and (response.raw or {}).get("finish_reason") == "length":
            raise ValueError(f"the structured reply reached max_tokens before its JSON was complete ({content!r}): "
                             f"raise max_tokens for {output_cls.__name__}") from error
        raise


class PartialObjects:
    """One stream's ChatResponses in, the objects to yield out."""

    def __init__(self, output_cls: type[BaseModel]) -> None:
        self.output_cls, self.partial, self.last = output_cls, None, None

    def step(self, response: ChatResponse) -> BaseModel | None:
        self.last = response
        if not response.delta:
            return None
        self.partial = process_streaming_objects(response, self.output_cls, cur_objects=_listed(self.partial))
        return self.partial

    def final(self) -> BaseModel:
        return validated(self.output_cls, self.last)


def _listed(partial: BaseModel | None) -> list[BaseModel] | None:
    return None if partial is None else [partial]


def partial_objects(responses: Iterator[ChatResponse], output_cls: type[BaseModel]) -> Iterator[BaseModel]:
    objects = PartialObjects(output_cls)
    for response in responses:
        if (partial := objects.step(response)) is not None:
            yield partial
    yield objects.final()


async def apartial_objects(responses: AsyncIterator[ChatResponse],
                           output_cls: type[BaseModel]) -> AsyncIterator[BaseModel]:
    objects = PartialObjects(output_cls)
    async for response in responses:
        if (partial := objects.step(response)) is not None:
            yield partial
    yield objects.final()
