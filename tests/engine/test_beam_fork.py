"""Scheduler.fork on a bare pool: beams share their parent's blocks and copy only the shared partial block, or
a beam is preempted (by recompute) when no block is free for its copy; the pool's accounting holds throughout."""

from __future__ import annotations

import pytest
import torch

from inferplug.engine.block_manager import BlockManager
from inferplug.engine.scheduler import Scheduler
from inferplug.engine.sequence import Sequence, SequenceStatus
from inferplug.types import SamplingParams


def parent_and_beam(num_blocks: int) -> tuple[Scheduler, Sequence, Sequence]:
    """A parent with 6 computed tokens in blocks of 4 (one full block, one partial) and a beam not yet running."""
    scheduler = Scheduler(BlockManager(num_blocks, 4), max_num_seqs=4, max_num_batched_tokens=16)
    params = SamplingParams(use_beam_search=True, beam_width=2)
    parent, beam = (Sequence("r", 0, [3, 4, 5, 6, 7, 8], params, 8), Sequence("r", 0, [3, 4, 5, 6, 7, 8], params, 8))
    scheduler.add(parent)
    scheduler.update_after_step(scheduler.schedule())
    return scheduler, parent, beam


def test_beams_share_full_blocks_and_copy_the_partial_one():
    scheduler, parent, beam = parent_and_beam(num_blocks=3)
    full, partial = parent.block_table
    copies = scheduler.fork([parent, beam], [parent, parent], [9, 10])
    assert copies == [(partial, parent.block_table[1], False)]  # the first holder copies, the last keeps the block
    assert (parent.token_ids[-1], beam.token_ids[-1]) == (9, 10)
    assert parent.block_table[0] == beam.block_table[0] == full and beam.block_table[1] == partial
    assert scheduler.blocks.ref_counts[full] == 2 and scheduler.blocks.num_free == 0
    assert beam.num_computed_tokens == 6 and beam.status is SequenceStatus.RUNNING
    scheduler.blocks.check_invariants()
    for seq in (parent, beam):
        scheduler.finish(seq)
    assert scheduler.blocks.num_free == 3


def test_a_beam_without_a_free_block_for_its_copy_is_preempted():
    scheduler, parent, beam = parent_and_beam(num_blocks=2)
    assert scheduler.fork([parent, beam], [parent, parent], [9, 10]) == []
    assert list(scheduler.waiting) == [parent] and scheduler.running == [beam]  # parent recomputes its tokens
    assert parent.token_ids[-1] == 9 and parent.block_table == [] and len(beam.block_table) == 2
    scheduler.blocks.check_invariants()
    for seq in (parent, beam):
        scheduler.finish(seq)
    assert scheduler.blocks.num_free == 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn])
def test_block_copies_take_any_pool_dtype(dtype):
    """A beam's copy on write copies a block's bytes (torch's index_copy_ has no float8 kernel), each in its own
    group's pools: layer 1 keeps a sliding window in pools of its own (engine/window_blocks.py)."""
    from types import SimpleNamespace

    from inferplug.engine.model_runner import ModelRunner
    from inferplug.models.decoder import DecoderModel

    pools = [tuple(torch.randn(2, 4, 8, 16).to(dtype) for _ in range(2)) for _ in range(3)]  # [heads, blocks, size, dim]
    before = [[kv.clone() for kv in pool] for pool in pools]
    layers = [SimpleNamespace(delta=None, kv_source=i, window=8 * (i == 1)) for i in range(3)]
    model = SimpleNamespace(layers=layers)
    model.keeps_window_kv = lambda layer: DecoderModel.keeps_window_kv(model, layer)
    runner = SimpleNamespace(kv_caches=pools, _tensor=lambda values: torch.tensor(values, dtype=torch.long),
                             model=model, windowed_pools=True)
    ModelRunner.copy_blocks(runner, [(1, 3, False), (0, 2, False), (2, 1, True)])
    for i, (pool, old) in enumerate(zip(pools, before)):
        for kv, was in zip(pool, old):
            expected = was.clone()
            if i == 1:
                expected[:, 1] = was[:, 2]
            else:
                expected[:, 3], expected[:, 2] = was[:, 1], was[:, 0]
            assert torch.equal(kv.view(torch.uint8), expected.view(torch.uint8))
