"""Decode steps replayed from CUDA graphs, one captured per batch-size bucket (as nano-vllm and vLLM do).

A decode step launches a few kernels per layer for a handful of tokens; on a GPU the launches, not the work,
bound it. Each bucket's graph is captured once over static input buffers (token ids, positions, slots, block
tables, lengths); a step of `n` decode rows copies its inputs into the smallest bucket >= n and replays it.
Padding rows store nothing (slot -1) and attend to nothing (length 0); their outputs are sliced away. A model whose
sliding-window layers keep their own blocks (engine/window_blocks.py) has a second pair of slot and table buffers
for them (AttentionContext.window).
The graphs capture the model's ops set (ops/), so only a set whose decode path never syncs with the host
offers them (TritonOps.decode_graphs)."""

from __future__ import annotations

import torch

from inferplug.ops.attention import AttentionContext, PagedRows


def batch_buckets(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every 16 up to max_num_seqs (and max_num_seqs itself)."""
    small = [b for b in (1, 2, 4, 8) if b < max_num_seqs]
    return sorted({*small, *range(16, max_num_seqs + 1, 16), max_num_seqs})


class DecodeGraphs:
    def __init__(self, model, kv_caches, *, max_num_seqs: int, max_blocks: int, windowed: bool = False):
        self.model, self.kv_caches = model, kv_caches
        self.buckets = batch_buckets(max_num_seqs)
        device, rows = model.device, self.buckets[-1]
        self.input_ids = torch.zeros(rows, dtype=torch.long, device=device)
        self.positions = torch.zeros(rows, dtype=torch.long, device=device)
        self.slots = torch.full((rows,), -1, dtype=torch.long, device=device)
        self.lengths = torch.zeros(rows, dtype=torch.int32, device=device)
        self.tables = torch.zeros(rows, max_blocks, dtype=torch.int32, device=device)
        # (slots, tables) of the sliding-window layers' own pools, or None
        self.window = (self.slots.clone(), self.tables.clone()) if windowed else None
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.replays = 0  # tests and benchmarks check the graphs ran

    def _context(self, rows: int) -> AttentionContext:
        ctx = _decode_context(self.slots[:rows], self.tables[:rows], self.lengths[:rows])
        if self.window is not None:
            slots, tables = self.window
            ctx.window = _decode_context(slots[:rows], tables[:rows], self.lengths[:rows])
        return ctx

    def _forward(self, rows: int) -> torch.Tensor:
        return self.model.forward(self.input_ids[:rows], self.positions[:rows], self._context(rows), self.kv_caches)

    @torch.inference_mode()
    def capture(self) -> None:
        """Largest bucket first, so the smaller graphs reuse its memory pool."""
        pool = None
        for rows in reversed(self.buckets):
            self._forward(rows)  # warm-up: Triton compiles and autotunes outside the capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool):
                self.outputs[rows] = self._forward(rows)
            pool = pool or graph.pool()
            self.graphs[rows] = graph
        torch.cuda.synchronize()

    def fits(self, ctx: AttentionContext, tokens: int) -> bool:
        """A decode-only step of at most the largest bucket's rows, whose tables fit the static buffer."""
        if ctx.decode_rows != tokens or ctx.packed_prefill is not None or tokens > self.buckets[-1]:
            return False
        return len(ctx.paged_rows) == 1 and ctx.paged_rows[0].block_tables.shape[1] <= self.tables.shape[1] and \
            (ctx.window is None) == (self.window is None)

    def replay(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        rows = input_ids.shape[0]
        bucket = next(b for b in self.buckets if b >= rows)
        self.input_ids[:rows] = input_ids
        self.positions[:rows] = positions
        self.lengths.zero_()
        self.lengths[:rows] = ctx.paged_rows[0].lengths
        for (slots, tables), step in [((self.slots, self.tables), ctx)] + \
                ([(self.window, ctx.window)] if self.window is not None else []):
            slots.fill_(-1)
            slots[:rows] = step.slot_mapping
            tables[:rows, : step.paged_rows[0].block_tables.shape[1]] = step.paged_rows[0].block_tables
        self.graphs[bucket].replay()
        self.replays += 1
        return self.outputs[bucket][:rows]


def _decode_context(slots: torch.Tensor, tables: torch.Tensor, lengths: torch.Tensor) -> AttentionContext:
    rows = slots.shape[0]
    return AttentionContext(slot_mapping=slots, decode_rows=rows,
                            paged_rows=[PagedRows(0, rows, tables, None, lengths=lengths)])
