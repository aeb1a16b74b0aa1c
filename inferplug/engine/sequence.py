"""One generated choice of a request: its tokens, KV blocks and progress.

The scheduler is the one writer of token_ids, spec_token_ids, recompute, num_computed_tokens, num_cached_tokens, the
block table and the block keys (through its BlockManager); everything else here is read by the runner and sampler.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from inferplug.types import SamplingParams


class SequenceStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    request_id: str
    index: int  # the choice, for n > 1
    prompt_ids: list[int]
    params: SamplingParams
    max_tokens: int  # resolved against the context length
    cache_salt: str | None = None
    client: str | None = None  # the request's client: the scheduler shares admission out between clients
    generator: Any = None  # torch.Generator when the request has a seed
    guide: Any = None  # constrained decoding (engine.guided); fill_mask / accept / is_terminated
    logit_bias_rows: Any = None  # params.logit_bias as (ids, values) tensors, made once, at its first sampled row
    output: Any = None  # stages.output.ChoiceOutput: text, stop checks, timings
    token_ids: list[int] = field(default_factory=list)  # prompt + output
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    num_cached_tokens: int | None = None  # prompt tokens found in the prefix cache at first admission
    block_table: list[int] = field(default_factory=list)
    window_table: list[int] = field(default_factory=list)  # the sliding-window layers' own blocks (window_blocks.py)
    state_slot: int = -1  # a hybrid model's: its slot in the DeltaNet layers' state pools while running (-1: none)
    block_hashes: list[bytes] = field(default_factory=list)  # keys of the full blocks of token_ids so far
    num_committed_blocks: int = 0  # leading blocks already offered to the prefix cache
    spec_token_ids: list[int] = field(default_factory=list)  # this step's proposed tokens, not yet accepted
    recompute: list[Any] = field(default_factory=list)  # engine/rag_recompute.Recompute: reused rows the next step redoes
    spec_probs: Any = None  # their draft distributions q ([k, vocab] tensor), None for point masses
    num_draft_tokens: int = 0  # speculative decoding: tokens proposed and accepted over the sequence's life
    num_accepted_tokens: int = 0
    num_spec_steps: int = 0  # steps that verified proposals
    siblings_waiting: list[Sequence] = field(default_factory=list)  # n > 1: admitted once our prompt is cached
    first_scheduled_time: float | None = None
    score_from: int = 0  # prompt_logprobs: the first prompt row scored (LLMEngine.prompt_logprob_rows' continuation)

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_ids):]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - len(self.prompt_ids)

    @property
    def seats(self) -> int:
        """Running places it takes, out of max_num_seqs: a beam search's first beam, before its first token, all of
        its beams (they fork from it and join the running sequences then); any other sequence one."""
        return self.params.beam_width if self.params.use_beam_search and self.num_output_tokens == 0 else 1

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED
