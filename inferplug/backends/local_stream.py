"""What local third-party backends (CTranslate2, ExLlamaV2) share around their token loop:
turning a Request into prompt ids and choices (LocalRequest).

These engines hand back raw token ids; their detokenizing, stop strings, stop ids, usage and
timings go through the output stage our own engine uses (stages/output.py), their prompts through
the prompt stage (stages/prompt.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from inferplug.errors import RequestError
from inferplug.stages.output import ChoiceOutput, RequestChoices, stop_ids
from inferplug.stages.prompt import max_new_tokens, prompt_token_ids
from inferplug.types import Event, Request, SamplingParams

if TYPE_CHECKING:
    from inferplug.backends.base import Backend


def reject_unsupported(backend_name: str, params: SamplingParams, request: Request, **supported: bool) -> None:
    """RequestError for options this backend cannot honour, rather than silently ignoring them."""
    checks = {
        "min_p": params.min_p != 0.0,
        "presence_penalty": params.presence_penalty != 0.0,
        "frequency_penalty": params.frequency_penalty != 0.0,
        "json_schema": params.json_schema is not None,
        "top_logprobs": bool(params.logprobs),
        "documents": request.documents is not None,
    }
    for param, used in checks.items():
        if used and not supported.get(param, False):
            raise RequestError(
                f"{param} is not supported by the {backend_name} backend; drop it or use the native backend",
                param=param,
            )


@dataclass
class LocalRequest:
    """One request on a local backend: its prompt ids, token limit, end ids and its output stage."""

    ids: list[int]
    limit: int
    end_ids: set[int]  # what its engine is told to stop on (stages/output.stop_ids)
    output: RequestChoices

    @classmethod
    def start(cls, backend: Backend, request: Request, eos_ids: Iterable[int | None], **supported: bool) -> LocalRequest:
        """Check the request (RequestError before any event) and set up its choices; `supported` as in
        reject_unsupported."""
        params = request.params
        reject_unsupported(backend.name, params, request, **supported)
        ids = prompt_token_ids(backend, request)
        limit = max_new_tokens(params, len(ids), backend.context_length)
        eos = {t for t in eos_ids if t is not None}
        output = RequestChoices.create(request.request_id, backend.tokenizer, ids, params, eos, limit,
                                       backend.reasoning_parser)
        return cls(ids, limit, stop_ids(params, eos), output)

    @property
    def choices(self) -> list[ChoiceOutput]:
        return self.output.choices

    @property
    def done(self) -> bool:
        return self.output.done

    def close(self, event: Event, cached_tokens: int) -> Event:
        """The request's last event gets its usage and timings."""
        return self.output.close(event, cached_tokens)
