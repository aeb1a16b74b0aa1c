"""Per-request bookkeeping: input checks, the request's sequences (n > 1) and their output stage."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from inferplug.engine.beam_search import BeamSearch
from inferplug.engine.sequence import Sequence
from inferplug.errors import RequestError
from inferplug.stages.output import RequestChoices, stop_ids
from inferplug.stages.prompt import check_prompt, max_new_tokens
from inferplug.types import Event, Request, SamplingParams


def validate_prompt(prompt_ids: list[int], params: SamplingParams, vocab_size: int, max_model_len: int) -> None:
    """Raise RequestError for a prompt or parameters this engine cannot serve."""
    if params.json_schema is not None and params.min_tokens:
        # the grammar alone decides where the JSON ends; banning EOS before min_tokens would leave no legal token
        raise RequestError("min_tokens cannot be combined with json_schema (the schema decides the length); "
                           "drop min_tokens", param="min_tokens")
    check_prompt(prompt_ids, params, vocab_size, max_model_len)


def validate_beam_search(params: SamplingParams, *, max_num_seqs: int, max_step_tokens: int, speculative: bool,
                         num_blocks: int, block_size: int, max_seq_len: int, recurrent_why: str = "") -> None:
    """Raise RequestError for a beam search this engine cannot run (SamplingParams checked the rest).
    `recurrent_why`: why the model's per-sequence state keeps beams from forking ("": it has none)."""
    if not params.use_beam_search:
        return
    if recurrent_why:
        raise RequestError(f"beam search does not run on this model: {recurrent_why}; drop use_beam_search "
                           "(sample n choices instead)", param="use_beam_search")
    if params.beam_width > max_num_seqs:
        raise RequestError(f"beam_width={params.beam_width} is above this engine's limit of {max_num_seqs} running "
                           "sequences (max_num_seqs): lower beam_width or raise [limits] max_num_seqs",
                           param="beam_width")
    if params.beam_width > max_step_tokens:  # the beams advance together: one step must hold a row for each
        raise RequestError(f"beam_width={params.beam_width} is above the {max_step_tokens} tokens a step computes "
                           "(max_num_batched_tokens): lower beam_width or raise [limits] max_num_batched_tokens",
                           param="beam_width")
    if speculative:
        raise RequestError("beam search does not run with speculative decoding, which this engine's profile turns on "
                           "([speculative] method): drop use_beam_search or set method = \"none\"",
                           param="use_beam_search")
    needed = params.beam_width * -(-max_seq_len // block_size)  # the beams at full length, sharing nothing
    if needed > num_blocks:
        raise RequestError(f"beam search with beam_width={params.beam_width} may need {needed} KV blocks at "
                           f"{max_seq_len} tokens a beam, but the pool holds {num_blocks}: lower beam_width or "
                           "max_tokens", param="beam_width")


def _make_guide(tokenizer: Any, schema: dict) -> Any:
    try:
        from inferplug.engine.guided import make_guide
    except ImportError as exc:
        raise RequestError(f"json_schema needs constrained decoding, which is not available here ({exc}); "
                           "install inferplug[native] with xgrammar or drop json_schema", param="json_schema") from exc
    return make_guide(tokenizer, schema)


@dataclass
class RequestState:
    request: Request
    seqs: list[Sequence]  # the choices; with beam search the beams (the live ones first), one choice
    output: RequestChoices
    beams: BeamSearch | None = None

    @classmethod
    def create(cls, request: Request, prompt_ids: list[int], max_model_len: int, tokenizer: Any,
               device: str = "cpu", eos_ids: Collection[int] = (), reasoning_parser: str | None = None) -> RequestState:
        import torch

        p = request.params
        max_tokens = max_new_tokens(p, len(prompt_ids), max_model_len)
        output = RequestChoices.create(request, tokenizer, prompt_ids, eos_ids, max_tokens, reasoning_parser)
        seqs = []
        for index in range(p.beam_width if p.use_beam_search else p.n):
            generator = None
            if p.seed is not None and not p.use_beam_search:  # beam search draws nothing
                # torch.multinomial needs the generator on the logits' device
                generator = torch.Generator(device=device).manual_seed(p.seed + index)
            guide = _make_guide(tokenizer, p.json_schema) if p.json_schema is not None else None
            seqs.append(Sequence(request.request_id, index, list(prompt_ids), p, max_tokens,
                                 cache_salt=request.cache_salt, client=request.client, generator=generator,
                                 guide=guide, output=output.choices[0 if p.use_beam_search else index]))
        beams = BeamSearch(p.beam_width, p.length_penalty, p.early_stopping, max_tokens, stop_ids(p, eos_ids)) \
            if p.use_beam_search else None
        return cls(request, seqs, output, beams)

    @property
    def live_beams(self) -> list[Sequence]:
        """The beams the search runs now, in its order (one before the first step, beam_width after)."""
        return self.seqs[: len(self.beams.outputs)]

    def group(self, seq: Sequence) -> list[Sequence]:
        """The sequences that end with seq: all the beams of a beam search, else seq alone."""
        return self.seqs if self.beams is not None else [seq]

    def close(self, event: Event) -> Event:
        """Usage and timings on the request's last event."""
        first = self.seqs[0]
        event = self.output.close(event, first.num_cached_tokens or 0, first.first_scheduled_time)
        if event.usage is not None:
            event.usage.draft_tokens = sum(s.num_draft_tokens for s in self.seqs)
            event.usage.accepted_draft_tokens = sum(s.num_accepted_tokens for s in self.seqs)
        return event
