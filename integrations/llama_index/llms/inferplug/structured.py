"""Streaming structured output: the chat stream, constrained to the class's JSON schema, as partial objects.

Each text delta yields the object parsed so far (LlamaIndex's Flexible model: every field optional, the
unfinished JSON repaired); the stream ends with the whole object, validated against the class.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

from llama_index.core.base.llms.types import ChatResponse
from llama_index.core.program.utils import process_streaming_objects
from pydantic import BaseModel


def constrained_kwargs(output_cls: type[BaseModel], llm_kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """The chat call's kwargs: the caller's, plus the class's JSON schema as the decoding constraint."""
    return {**(llm_kwargs or {}), "json_schema": output_cls.model_json_schema()}


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
        return self.output_cls.model_validate_json(self.last.message.content or "" if self.last else "")


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
