"""Build one step's flat inputs from the schedule, run the model, sample the rows that finish their tokens.

The attention metadata comes from the model's ops set (ops/): the runner only lays the rows out."""

from __future__ import annotations

import dataclasses
from functools import partial

import torch

from inferplug.engine.prompt_scores import PromptScores, scored_rows
from inferplug.engine.rag_recompute import DeviationProbe, runs
from inferplug.engine.sampler import SampleResult, Sampler
from inferplug.engine.sequence import Sequence
from inferplug.ops.attention import AttentionContext, read_kv
from inferplug.ops.step import SeqView, StepLayout


def is_decode_row(seq: Sequence, tokens: int) -> bool:
    """Whether seq's `tokens` scheduled rows are one decode row: one generated token, no proposals to check. A
    prompt's last token is a prefill row even when it is computed alone (a 1-token final chunk, or everything before it from the prefix cache): it takes the prefill arithmetic
    its chunk-mates take, so its logits do not depend on how the prompt was chunked or cached."""
    return tokens == 1 and not seq.spec_token_ids and seq.num_computed_tokens >= seq.num_prompt_tokens


class ModelRunner:
    def __init__(self, model, *, num_blocks: int, block_size: int, sampler: Sampler, max_num_seqs: int = 0,
                 max_model_len: int = 0, weight_format: str | None = None, prefill_gemm: str = "float32",
                 state_slots: int = 0, window_blocks: int = 0):
        """The model is put in its final format first: weight_format's weight-only layers (quant/linear.py; None:
        as loaded) and prefill_gemm, how its block layers multiply prompt rows (quant/block_linear.py), before the
        KV pools take their memory. max_num_seqs and max_model_len size the decode CUDA graphs (0: none), where the
        ops set offers them. state_slots: the sequences a hybrid model's DeltaNet layers hold a state for.
        window_blocks: the blocks of the sliding-window layers' own pools (engine/window_blocks.py; 0: they keep
        their KV in num_blocks-block pools, as the other layers do)."""
        from inferplug.models.heap import keep_freed_heap
        from inferplug.quant.block_linear import set_prefill_gemm
        from inferplug.quant.linear import quantize_model

        if weight_format:  # each float layer goes as its quantized one is made: the pools come after, not beside
            quantize_model(model, weight_format)
        set_prefill_gemm(model, prefill_gemm)  # once per model, never per step
        self.model = model
        self.block_size = block_size
        self.kv_caches = model.allocate_kv_cache(num_blocks, block_size, state_slots, window_blocks)
        if model.device.type == "cpu":  # the steps' temporaries reused, not mapped afresh each step (models/heap.py)
            keep_freed_heap()
        self.keeps_states = state_slots > 0
        self.windowed_pools = window_blocks > 0
        self.sampler = sampler
        self.device = model.device
        self.graphs = None
        # Captured at the first decode step, on the thread that steps the engine, not while it is built.
        self._graph_sizes = dict(max_num_seqs=max_num_seqs, max_blocks=-(-max_model_len // block_size)) \
            if max_num_seqs and max_model_len else None

    def run(self, scheduled: list[tuple[Sequence, int]]
            ) -> tuple[list[tuple[Sequence, list[SampleResult]]], list[PromptScores]]:
        """Compute the scheduled tokens; return the samples of each sequence whose tokens are now all computed
        (one, or for a speculating sequence its accepted proposals and one more: engine/spec_verify.py), and the
        logits of the prompt rows that sequences asking for prompt_logprobs computed."""
        inputs, seqs, spans = self.layout(scheduled, score_prompts=True)
        logits = self.execute(inputs)
        if logits is None:
            return [], []
        logits, prompt_logits = logits.split([len(inputs.sample_rows), len(inputs.prompt_rows)])
        scores = [PromptScores(seq, start, rows)
                  for (seq, start, _), rows in zip(spans, prompt_logits.split([n for *_, n in spans]))]
        if not seqs:
            return [], scores
        samples = self.sampler(logits, seqs, [s.spec_token_ids for s in seqs], [s.spec_probs for s in seqs])
        return list(zip(seqs, samples)), scores

    def forward(self, scheduled: list[tuple[Sequence, int]]) -> tuple[list[Sequence], torch.Tensor | None]:
        """Compute the scheduled tokens; return the sequences whose tokens are now all computed and their logits
        rows: one each, or for a speculating sequence one per proposal and one more."""
        inputs, seqs, _ = self.layout(scheduled)
        return seqs, self.execute(inputs)

    def layout(self, scheduled: list[tuple[Sequence, int]], score_prompts: bool = False
               ) -> tuple[StepLayout, list[Sequence], list[tuple[Sequence, int, int]]]:
        """The step's flat rows, the sequences that sample (in sample-row order) and, with score_prompts, the
        (sequence, first position, rows) of the prompt rows scored for prompt_logprobs (in prompt-row order).
        Verification rows (a decode token and its proposals) follow the decode rows and take their arithmetic
        (verify_rows), so a token comes out as plain decoding would compute it."""
        decodes = [(s, n) for s, n in scheduled if is_decode_row(s, n)]
        decodes.sort(key=lambda d: -d[0].num_computed_tokens)  # longest first: groups of similar lengths
        verifies = [(s, n) for s, n in scheduled if s.spec_token_ids]
        prefills = [(s, n) for s, n in scheduled if not is_decode_row(s, n) and not s.spec_token_ids]
        inputs = StepLayout(decodes, [], self.block_size, sum(n for _, n in verifies))
        sample_seqs: list[Sequence] = []
        spans: list[tuple[Sequence, int, int]] = []
        for i, (seq, n) in enumerate(decodes + verifies + prefills):
            if seq.recompute:  # reused document rows computed again, before the chunk that attends to them
                self._recompute_rows(inputs, seq)
            if i >= len(decodes):
                inputs.prefills.append((seq, n))
            start, tokens = seq.num_computed_tokens, seq.token_ids + seq.spec_token_ids
            first, scored = scored_rows(seq, start, n) if score_prompts else (start, 0)
            if scored:
                row = len(inputs.input_ids) + first - start
                inputs.prompt_rows += range(row, row + scored)
                spans.append((seq, first, scored))
            if self.keeps_states:  # from zero state at its first token, else from its slot's
                inputs.states.append((n, seq.state_slot, start == 0))
            inputs.input_ids += tokens[start:start + n]
            inputs.positions += range(start, start + n)
            inputs.slots += [self._slot(seq.block_table, p) for p in range(start, start + n)]
            if self.windowed_pools:
                inputs.window_slots += [self._slot(seq.window_table, p) for p in range(start, start + n)]
            if start + n == len(tokens):
                inputs.sample_rows += range(len(inputs.input_ids) - 1 - len(seq.spec_token_ids), len(inputs.input_ids))
                sample_seqs.append(seq)
        return inputs, sample_seqs, spans

    def _recompute_rows(self, inputs: StepLayout, seq: Sequence) -> None:
        """The one place recompute rows join a step (engine/rag_recompute.py): each a span of prefill rows at its
        own positions, attending to the pools up to its end, whose K/V overwrite the reused ones in seq's blocks."""
        for r in seq.recompute:
            first = len(inputs.input_ids)
            inputs.prefills.append((SeqView(r.start, seq.block_table), r.rows))
            inputs.input_ids += seq.token_ids[r.start:r.end]
            inputs.positions += range(r.start, r.end)
            inputs.slots += [self._slot(seq.block_table, p) for p in range(r.start, r.end)]
            if r.probe_layer is not None:
                inputs.probe_layer = r.probe_layer
                inputs.probes.append((first, first + r.rows, r.keep))

    def execute(self, inputs: StepLayout) -> torch.Tensor | None:
        """Run the model over the step's rows; the fp32 logits of its sample rows, then of its prompt rows (None:
        neither)."""
        ctx = self.model.ops.context(inputs, self._tensor(inputs.slots))
        ctx.states = inputs.states
        if self.windowed_pools:
            ctx.window = self.model.ops.context(inputs.windowed(), self._tensor(inputs.window_slots))
        if inputs.probes:
            probed = self._tensor([r for a, b, _ in inputs.probes for r in range(a, b)])
            ctx.probe = DeviationProbe(inputs.probe_layer, inputs.probes,
                                       read_kv(self.kv_caches[inputs.probe_layer][0], ctx.slot_mapping[probed]),
                                       partial(self._narrowed, inputs, ctx.slot_mapping), len(inputs.input_ids))
        ids, pos = self._tensor(inputs.input_ids), self._tensor(inputs.positions)
        if self._graph_sizes is not None and not inputs.prefills:
            self.graphs = self.model.ops.decode_graphs(self.model, self.kv_caches, **self._graph_sizes,
                                                       windowed=self.windowed_pools)
            self._graph_sizes = None
        if self.graphs is not None and self.graphs.fits(ctx, len(inputs.input_ids)):
            hidden = self.graphs.replay(ids, pos, ctx)
        else:
            hidden = self.model.forward(ids, pos, ctx, self.kv_caches)
        rows = self._tensor(inputs.sample_rows + inputs.prompt_rows)
        if not len(rows):
            return None
        if ctx.probe is not None:  # the probe dropped rows: the kept ones moved up
            rows = torch.searchsorted(ctx.probe.kept, rows)
        return self.model.compute_logits(hidden[rows])

    def _narrowed(self, inputs: StepLayout, slots: torch.Tensor, kept: torch.Tensor) -> AttentionContext:
        """The step's attention context for its `kept` rows only (a deviation probe dropped the others): each
        prefill span becomes the runs of its kept positions."""
        keep, prefills, row = set(kept.tolist()), [], len(inputs.decodes)
        for seq, n in inputs.prefills:
            positions = [inputs.positions[r] for r in range(row, row + n) if r in keep]
            prefills += [(SeqView(a, seq.block_table), b - a) for a, b in runs(positions)]
            row += n
        return self.model.ops.context(dataclasses.replace(inputs, prefills=prefills), slots[kept])

    def copy_blocks(self, pairs: list[tuple[int, int, bool]]) -> None:
        """Copy whole KV blocks, (source, destination, windowed) each: a beam's copy on write of a shared partial
        block, in the sliding-window layers' own pools where windowed."""
        for windowed in (False, True):
            group = [(s, c) for s, c, w in pairs if w == windowed]
            if not group:
                continue
            sources, copies = self._tensor([s for s, _ in group]), self._tensor([c for _, c in group])
            for layer, pool in zip(self.model.layers, self.kv_caches):
                if layer.delta is not None or (self.windowed_pools and self.model.keeps_window_kv(layer)) != windowed:
                    continue
                for kv in pool:  # [kv heads, blocks, block size, head dim]; index_put_ took 0.3 s a fork (SmolLM2)
                    raw = kv.view(torch.uint8)  # as bytes: index_copy_ has no float8 kernel
                    raw.index_copy_(1, copies, raw.index_select(1, sources))

    def read_state(self, slot: int) -> list[torch.Tensor]:
        """A copy of a hybrid model's DeltaNet state in `slot`: each DeltaNet layer's conv window and recurrent
        state (engine/state_snapshots.py)."""
        return [pool[slot].clone() for pools in self._state_pools() for pool in pools]

    def write_state(self, slot: int, state: list[torch.Tensor]) -> None:
        """read_state's copy back into `slot`."""
        for pool, values in zip((pool for pools in self._state_pools() for pool in pools), state):
            pool[slot].copy_(values)

    def _state_pools(self):
        return (pools for layer, pools in zip(self.model.layers, self.kv_caches) if layer.delta is not None)

    def close(self) -> None:
        """Nothing to release on one device (engine/parallel's runner stops its workers)."""

    def _slot(self, table: list[int], position: int) -> int:
        return table[position // self.block_size] * self.block_size + position % self.block_size

    def _tensor(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)
