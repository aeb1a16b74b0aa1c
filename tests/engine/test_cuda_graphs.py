"""Decode steps replayed from CUDA graphs give the eager steps' greedy tokens (CUDA only: skipped without it);
the batch-size buckets they are captured for."""

from __future__ import annotations

import pytest
import torch

from inferplug.ops.cuda_graphs import batch_buckets
from inferplug.types import Request
from tests.engine.engine_helpers import greedy, make_engine, prompts_of, run_all, tokens_of


def test_buckets_cover_every_batch_size_up_to_max_num_seqs():
    assert batch_buckets(1) == [1]
    assert batch_buckets(12) == [1, 2, 4, 8, 12]
    assert batch_buckets(64) == [1, 2, 4, 8, 16, 32, 48, 64]
    assert all(any(b >= n for b in batch_buckets(40)) for n in range(1, 41))


def test_no_graphs_off_cuda(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir, cuda_graphs=True)
    run_all(engine, [Request(prompt=[5, 6, 7], params=greedy(3), request_id="a")])
    assert engine.runner.graphs is None


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_graph_replays_match_eager_decode_on_cuda(tiny_llama_dir, dtype):
    prompts = prompts_of([30, 5, 17, 44, 9, 60, 3], seed=4)

    def generate(cuda_graphs: bool):
        engine = make_engine(tiny_llama_dir, device="cuda", dtype=dtype, attention="triton", cuda_graphs=cuda_graphs,
                             max_num_seqs=12, max_num_batched_tokens=64)
        requests = [Request(prompt=p, params=greedy(10), request_id=str(i)) for i, p in enumerate(prompts)]
        events = run_all(engine, requests[:3], {2: requests[3:]})  # batches of 3 to 7 rows: padded buckets
        return engine, {rid: tokens_of(ev) for rid, ev in events.items()}

    graphed, graph_tokens = generate(True)
    eager, eager_tokens = generate(False)
    assert graphed.runner.graphs is not None and graphed.runner.graphs.replays > 5
    assert eager.runner.graphs is None
    assert graph_tokens == eager_tokens


class _EagerGraph:
    """torch.cuda.CUDAGraph's replay() for the interpreter: the captured forward, run again over the same static
    buffers (what a replay computes), writing the same output tensor."""

    def __init__(self, graphs, rows: int):
        self.graphs, self.rows = graphs, rows

    @torch.inference_mode()
    def replay(self) -> None:
        self.graphs.outputs[self.rows].copy_(self.graphs._forward(self.rows))


def test_window_buffers_carry_the_window_groups_slots_and_tables(tmp_path_factory):
    """A Gemma 3 whose window layers keep their own blocks: each replay copies their slots and tables into the second
    pair of static buffers, and the replayed steps give the eager steps' tokens (Triton in its interpreter; the
    capture itself needs CUDA: the test below)."""
    from inferplug.ops.cuda_graphs import DecodeGraphs
    from tests.conftest import _save_tiny

    model_dir = _save_tiny("gemma3", tmp_path_factory.mktemp("tiny-gemma3-graphs"))
    prompts = prompts_of([40, 7, 29], vocab=260, seed=5)

    def generate(graphed: bool):
        engine = make_engine(model_dir, attention="triton", rag_document_cache=False, block_size=4, max_num_seqs=4)
        if graphed:
            graphs = DecodeGraphs(engine.runner.model, engine.runner.kv_caches, max_num_seqs=4, max_blocks=32,
                                  windowed=True)
            with torch.inference_mode():
                for rows in graphs.buckets:
                    graphs.outputs[rows] = graphs._forward(rows)
                    graphs.graphs[rows] = _EagerGraph(graphs, rows)
            engine.runner.graphs = graphs
        requests = [Request(prompt=p, params=greedy(12), request_id=str(i)) for i, p in enumerate(prompts)]
        return engine, {rid: tokens_of(ev) for rid, ev in run_all(engine, requests).items()}

    graphed, graph_tokens = generate(True)
    assert graphed.blocks.window is not None and graphed.runner.graphs.replays > 5
    assert graph_tokens == generate(False)[1]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_graph_replays_of_a_window_group_match_eager_decode_on_cuda(tmp_path_factory):
    from tests.conftest import _save_tiny

    model_dir = _save_tiny("gemma3", tmp_path_factory.mktemp("tiny-gemma3-cuda"))
    prompts = prompts_of([40, 5, 17, 60, 9], vocab=260, seed=6)

    def generate(cuda_graphs: bool):
        engine = make_engine(model_dir, device="cuda", attention="triton", cuda_graphs=cuda_graphs, max_num_seqs=8,
                             rag_document_cache=False, block_size=4, max_num_batched_tokens=64)
        requests = [Request(prompt=p, params=greedy(12), request_id=str(i)) for i, p in enumerate(prompts)]
        return engine, {rid: tokens_of(ev) for rid, ev in run_all(engine, requests[:2], {2: requests[2:]}).items()}

    graphed, graph_tokens = generate(True)
    assert graphed.blocks.window is not None and graphed.runner.graphs.replays > 5
    assert graph_tokens == generate(False)[1]
