"""Draft-model speculative decoding: a small model that shares the target's tokenizer proposes the next tokens.

The draft runs in the same engine with its own paged KV pool (a BlockManager without prefix caching, so none
of its blocks is ever hashed) and one shadow Sequence per target sequence, written only here. Each step it
proposes for all decoding sequences together: one forward catches every shadow up with its sequence (after
rolling it back to the longest prefix its KV still agrees with: rejected proposals go), then one one-token
forward per further proposal. A greedy sequence's draft takes the argmax (q is a point mass); a sampled one
draws from the draft's distribution under the sequence's own penalties, temperature and top-k/p and keeps it
as q for the rejection sampler (engine/spec_verify.py). A shadow is freed with its sequence (finish, abort,
preemption).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch

from inferplug.engine.block_manager import BlockManager
from inferplug.engine.model_runner import ModelRunner
from inferplug.engine.sampler import processed_logits, sampling_probs
from inferplug.engine.sequence import Sequence
from inferplug.engine.spec_verify import Proposal, ahead
from inferplug.errors import ProfileError
from inferplug.models.config import ModelConfig
from inferplug.quant.formats import float_model_format

log = logging.getLogger(__name__)


@dataclass
class DraftModel:
    """A loaded draft: its config, weights (as loader.load_weights gives them) and tokenizer."""

    config: ModelConfig
    weights: dict[str, Any]
    tokenizer: Any


def check_draft(target: ModelConfig, tokenizer: Any, draft: DraftModel, max_model_len: int) -> None:
    """The draft must score the target's token ids: the same vocabulary size and the same id for every token,
    and positions as far as the target's context."""
    fix = "use a draft of the target's model family (one that ships the same tokenizer)"
    if draft.config.vocab_size != target.vocab_size:
        raise ProfileError(f"the draft model's vocabulary has {draft.config.vocab_size} entries and the target's "
                           f"{target.vocab_size}: a draft must share the target's tokenizer; {fix}")
    ours, theirs = tokenizer.get_vocab(), draft.tokenizer.get_vocab()
    differ = sorted(t for t in ours.keys() | theirs.keys() if ours.get(t) != theirs.get(t))
    if differ:
        raise ProfileError(f"the draft model's tokenizer differs from the target's on {len(differ)} tokens "
                           f"(e.g. {differ[0]!r}: id {theirs.get(differ[0])} vs {ours.get(differ[0])}); {fix}")
    if draft.config.max_position_embeddings < max_model_len:
        raise ProfileError(f"the draft model reaches {draft.config.max_position_embeddings} positions, the target's "
                           f"context {max_model_len}: lower [limits] max_model_len or use a draft with a longer context")


@dataclass(eq=False)
class _Shadow:
    view: Sequence  # the draft's copy: its tokens (the target's, then proposals), block table and computed count
    synced: int  # how many of view's tokens are the target sequence's own


@dataclass
class _Drafting:
    seq: Sequence
    shadow: _Shadow
    k: int
    tokens: list[int] = field(default_factory=list)
    probs: list[torch.Tensor] = field(default_factory=list)


class DraftProposer:
    def __init__(self, draft: DraftModel, config, eos_token_ids: list[int]):
        from inferplug.models.decoder import DecoderModel

        self.num_tokens = config.num_speculative_tokens
        self.eos_token_ids = eos_token_ids
        self.model = DecoderModel(draft.config, draft.weights, dtype=config.torch_dtype, device=config.device,
                                attention=config.attention, kv_dtype=config.torch_kv_dtype,
                                max_positions=config.max_model_len or 0)
        # as many blocks as the target's pool: a shadow holds fewer tokens than its sequence
        self.blocks = BlockManager(config.num_kv_blocks, config.block_size, enable_prefix_caching=False)
        self.pools = (self.blocks,)
        # only its forward: the draws are here. Quantized like the target, though float whatever the target's
        # checkpoint holds (quant/formats.float_model_format)
        self.runner = ModelRunner(self.model, num_blocks=config.num_kv_blocks, block_size=config.block_size,
                                  sampler=None, prefill_gemm=config.prefill_gemm,
                                  weight_format=config.weight_format and float_model_format(config.weight_format))
        self.shadows: dict[Sequence, _Shadow] = {}
        # draft tokens a step computes before it proposes: beside other decoding streams, no more than the prefill a
        # step may carry beside decode rows (their TPOT bound); one stream alone slows only itself
        self.max_catch_up = config.max_num_batched_tokens
        self.max_catch_up_beside_decodes = config.max_prefill_tokens_while_decoding or config.max_num_batched_tokens

    def propose(self, seqs: list[Sequence], limits: list[int]) -> list[Proposal]:
        try:
            drafted = self._draft(seqs, limits)
        except Exception as exc:  # noqa: BLE001 - a failed draft costs speed, never an answer
            log.warning("the draft model's step failed (%r): these sequences decode without proposals", exc)
            for seq in seqs:  # its KV may be half written: start every shadow again
                self.release(seq)
            drafted = {}
        return [drafted.get(seq, Proposal([])) for seq in seqs]

    def _draft(self, seqs: list[Sequence], limits: list[int]) -> dict[Sequence, Proposal]:
        work = []
        budget = self.max_catch_up if len(seqs) == 1 else self.max_catch_up_beside_decodes
        catch_up = budget  # a shadow behind its sequence by more (a prompt) catches up over steps
        for seq, limit in zip(seqs, limits):
            k = min(self.num_tokens, limit)
            if k > 0 and seq.guide is None:  # a grammar's state cannot look ahead
                shadow = self._sync(seq)
                # KV for the proposals but the last, which is only computed once accepted
                if self.blocks.allocate(shadow.view, len(seq.token_ids) + k - 1):
                    work.append(_Drafting(seq, shadow, k))
                    catch_up -= len(shadow.view.token_ids) - shadow.view.num_computed_tokens
                else:  # the draft pool is short: this sequence decodes plainly
                    self.release(seq)
        active = work
        while active:
            scheduled = [(d.shadow.view, len(d.shadow.view.token_ids) - d.shadow.view.num_computed_tokens)
                         for d in active]
            if catch_up < 0:  # first pass over budget: the longest catch-ups take a chunk and propose next step
                scheduled, catch_up = _within(scheduled, budget), 0
            views, logits = self.runner.forward(scheduled)
            row = {id(v): i for i, v in enumerate(views)}
            for view, n in scheduled:
                view.num_computed_tokens += n
            active = [d for d in active if id(d.shadow.view) in row]
            for d in active:
                token = self._draw(d, logits[row[id(d.shadow.view)]])
                d.shadow.view.token_ids.append(token)
                d.tokens.append(token)
            active = [d for d in active if len(d.tokens) < d.k]
        return {d.seq: Proposal(d.tokens, torch.stack(d.probs) if d.probs else None) for d in work if d.tokens}

    def release(self, seq: Sequence) -> None:
        shadow = self.shadows.pop(seq, None)
        if shadow is not None:
            self.blocks.release(shadow.view)

    def _sync(self, seq: Sequence) -> _Shadow:
        """seq's shadow with seq's tokens, its KV kept for the longest prefix both still agree on."""
        shadow = self.shadows.get(seq)
        if shadow is None:
            view = Sequence(seq.request_id, seq.index, seq.prompt_ids, seq.params, seq.max_tokens,
                            token_ids=list(seq.token_ids))
            shadow = self.shadows[seq] = _Shadow(view, len(seq.token_ids))
            return shadow
        view, tokens = shadow.view, seq.token_ids
        agree = shadow.synced  # the tokens past it were proposals: keep those the target accepted
        while agree < min(len(view.token_ids), len(tokens)) and view.token_ids[agree] == tokens[agree]:
            agree += 1
        del view.token_ids[agree:]
        view.token_ids.extend(tokens[agree:])
        # at least the last token is computed: its logits give the first proposal
        view.num_computed_tokens = min(view.num_computed_tokens, agree, len(tokens) - 1)
        self.blocks.truncate(view, view.num_computed_tokens)
        shadow.synced = len(tokens)
        return shadow

    def _draw(self, d: _Drafting, raw: torch.Tensor) -> int:
        """The next proposal from one logits row, processed as the target's row will be; a sampled draw keeps q."""
        seq = d.seq
        logits = processed_logits(raw, ahead(seq, d.tokens) if d.tokens else seq, self.eos_token_ids)
        if seq.params.greedy:
            return int(logits.argmax())
        q = sampling_probs(logits, seq.params)
        d.probs.append(q)
        return int(torch.multinomial(q, 1, generator=seq.generator))


def _within(scheduled: list[tuple[Sequence, int]], budget: int) -> list[tuple[Sequence, int]]:
    """The rows cut to `budget` tokens in all, the shortest catch-ups first (one token each still proposes);
    a row cut short computes part of its catch-up and samples nothing."""
    kept = []
    for view, n in sorted(scheduled, key=lambda row: row[1]):
        if budget > 0:
            kept.append((view, min(n, budget)))
            budget -= kept[-1][1]
    return kept
