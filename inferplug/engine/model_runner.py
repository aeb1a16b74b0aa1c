"""Build one step's flat inputs from the schedule, run the model, sample the rows that finish their tokens."""

from __future__ import annotations

import torch

from inferplug.engine.attention import AttentionContext, DecodeGroup, PrefillChunk
from inferplug.engine.sampler import SampleResult, Sampler
from inferplug.engine.sequence import Sequence

# A row starts a new decode group when it needs at most 2/3 of the group's blocks and 8 fewer: past that,
# reading the padding costs more than another gather and matmul pair (about 0.1 ms a layer).
GROUP_WIDTH_RATIO, GROUP_MIN_GAP_BLOCKS = 2 / 3, 8


class ModelRunner:
    def __init__(self, model, *, num_blocks: int, block_size: int, sampler: Sampler):
        self.model = model
        self.block_size = block_size
        self.kv_caches = model.allocate_kv_cache(num_blocks, block_size)
        self.sampler = sampler
        self.device = model.device
        # Attention in the C++ kernel (fp32, AVX2): every row of a step in one group, each reading its own length.
        self.decode_kernel = model.kernels is not None and model.head_dim % 8 == 0  # see LlamaModel.kernels

    def run(self, scheduled: list[tuple[Sequence, int]]) -> list[tuple[Sequence, SampleResult]]:
        """Compute the scheduled tokens; return a sample for each sequence whose tokens are now all computed."""
        decodes = [(s, n) for s, n in scheduled if n == 1 and s.num_computed_tokens > 0]
        decodes.sort(key=lambda d: -d[0].num_computed_tokens)  # longest first: groups of similar lengths
        prefills = [(s, n) for s, n in scheduled if not (n == 1 and s.num_computed_tokens > 0)]
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        sample_rows: list[int] = []
        sample_seqs: list[Sequence] = []
        for seq, n in decodes + prefills:
            start = seq.num_computed_tokens
            input_ids += seq.token_ids[start:start + n]
            positions += range(start, start + n)
            slots += [self._slot(seq, p) for p in range(start, start + n)]
            if start + n == len(seq.token_ids):
                sample_rows.append(len(input_ids) - 1)
                sample_seqs.append(seq)
        ctx = AttentionContext(slot_mapping=self._tensor(slots), decode_rows=len(decodes))
        if self.decode_kernel:
            ctx.decode_groups = [self._kernel_rows(decodes + prefills)]
        else:
            ctx.decode_groups = self._decode_groups([s for s, _ in decodes])
            q_start = len(decodes)
            for seq, n in prefills:
                ctx.prefills.append(self._prefill_chunk(seq, n, q_start))
                q_start += n
        hidden = self.model.forward(self._tensor(input_ids), self._tensor(positions), ctx, self.kv_caches)
        if not sample_seqs:
            return []
        logits = self.model.compute_logits(hidden[self._tensor(sample_rows)])
        return list(zip(sample_seqs, self.sampler(logits, sample_seqs)))

    def _slot(self, seq: Sequence, position: int) -> int:
        return seq.block_table[position // self.block_size] * self.block_size + position % self.block_size

    def _tensor(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)

    def _kernel_rows(self, spans: list[tuple[Sequence, int]]) -> DecodeGroup:
        """Every row of the step, decode and prefill alike, for the C++ kernel (one block table per sequence):
        each query reads the K/V of its own position and those before it, in one fixed order. So a token's
        attention does not depend on the step's other rows, on how its prompt was chunked, or on whether its
        prefix came from the cache."""
        width = max(-(-(s.num_computed_tokens + n) // self.block_size) for s, n in spans)
        tables = [s.block_table[:width] + [0] * (width - len(s.block_table[:width])) for s, _ in spans]
        starts = [0]
        for _, n in spans:
            starts.append(starts[-1] + n)
        lengths = self._tensor([s.num_computed_tokens + n for s, n in spans])
        return DecodeGroup(0, starts[-1], self._tensor(tables), None, lengths=lengths, query_starts=self._tensor(starts))

    def _decode_groups(self, seqs: list[Sequence]) -> list[DecodeGroup]:
        """Cut the decode rows (longest first) into groups of similar widths (GROUP_WIDTH_RATIO), for the torch path."""
        blocks = [-(-(s.num_computed_tokens + 1) // self.block_size) for s in seqs]
        groups, start = [], 0
        for i in range(1, len(seqs) + 1):
            if i == len(seqs) or (blocks[i] <= GROUP_WIDTH_RATIO * blocks[start]
                                  and blocks[start] - blocks[i] >= GROUP_MIN_GAP_BLOCKS):
                groups.append(self._decode_group(seqs[start:i], start, width=blocks[start]))
                start = i
        return groups

    def _decode_group(self, seqs: list[Sequence], start: int, width: int) -> DecodeGroup:
        lengths = [s.num_computed_tokens + 1 for s in seqs]
        tables = self._tensor([s.block_table[:width] + [0] * (width - len(s.block_table[:width])) for s in seqs])
        if len(seqs) == 1:  # nothing to pad: attention cuts the keys at the length
            return DecodeGroup(start, start + 1, tables, None, lengths[0])
        keys = torch.arange(width * self.block_size, device=self.device)
        past_end = keys[None, :] >= self._tensor(lengths)[:, None]
        bias = torch.zeros(past_end.shape, dtype=self.model.dtype, device=self.device)
        return DecodeGroup(start, start + len(seqs), tables, bias.masked_fill_(past_end, float("-inf"))[None, :, None, :])

    def _prefill_chunk(self, seq: Sequence, n: int, q_start: int) -> PrefillChunk:
        start = seq.num_computed_tokens
        if start == 0:
            return PrefillChunk(q_start, n, n, None, None)
        ctx_len = start + n
        blocks = self._tensor(seq.block_table[: -(-ctx_len // self.block_size)])
        query_pos = torch.arange(start, ctx_len, device=self.device)
        mask = torch.arange(ctx_len, device=self.device)[None, :] <= query_pos[:, None]
        return PrefillChunk(q_start, n, ctx_len, blocks, mask)
