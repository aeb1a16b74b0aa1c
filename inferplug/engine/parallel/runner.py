"""Rank 0 of a tensor-parallel engine: a ModelRunner over its own slice of the model that also starts the
other ranks (worker.py), sends them each step's rows before running it, and stops them on close."""

from __future__ import annotations

import dataclasses
import multiprocessing
import socket
import weakref

from inferplug.engine.model_runner import ModelRunner
from inferplug.engine.parallel.worker import WorkerSpec, init_rank, rank_model, worker_main
from inferplug.errors import BackendUnavailable, ProfileError
from inferplug.models.shard import check_tensor_parallel, shard_weights
from inferplug.ops.step import SeqView, StepLayout

STOP_WAIT_S = 10  # a worker that has not exited by then is killed


class ParallelRunner(ModelRunner):
    def __init__(self, model_config, state_dict: dict, config, *, sampler, threads_per_rank: int = 0):
        import torch.distributed as dist

        size = config.tensor_parallel_size
        why = check_tensor_parallel(model_config.num_attention_heads, model_config.num_key_value_heads, size,
                                    model_config.family, model_config.layer_kv_heads)
        if why:
            raise ProfileError(why)
        if dist.is_initialized():  # torch.distributed has one default group per process
            raise ProfileError("this process already runs a tensor-parallel engine; close it first, or run another "
                               "process")
        shards = {rank: shard_weights(model_config, state_dict, rank, size) for rank in range(size)}  # errors first
        state_dict.clear()  # the shards are copies: the whole float model goes before rank 0 quantizes and allocates
        self.workers: list = []
        self.pipes: list = []
        self._stop = weakref.finalize(self, stop_workers, self.workers, self.pipes)
        try:
            model = self._start(model_config, config, shards, threads_per_rank)
            # rank 0 puts its slice in config's format while the workers put theirs (worker.py); no CUDA graphs: a
            # captured step would have to capture the collectives too
            super().__init__(model, num_blocks=config.num_kv_blocks, block_size=config.block_size, sampler=sampler,
                             weight_format=config.weight_format, prefill_gemm=config.prefill_gemm,
                             window_blocks=config.window_kv_blocks)
            self._expect("ready")  # every rank's model in its final format, its pools allocated
        except BaseException:  # no worker outlives a failed start (Ctrl-C included)
            self.close()
            raise

    def _start(self, model_config, config, shards: dict, threads_per_rank: int):
        """Spawn ranks 1.., join the group as rank 0, build rank 0's model (the workers build theirs meanwhile)."""
        spawn = multiprocessing.get_context("spawn")
        port, size = free_port(), config.tensor_parallel_size
        for rank in range(1, size):
            spec = WorkerSpec(rank, size, port, model_config, config, threads_per_rank)
            ours, theirs = spawn.Pipe()
            process = spawn.Process(target=worker_main, args=(spec, shards.pop(rank), theirs), daemon=True,
                                    name=f"inferplug-tp-rank{rank}")
            process.start()
            theirs.close()
            self.workers.append(process)
            self.pipes.append(ours)
        self._expect("started")  # a worker that dies on import would otherwise leave rank 0 in the rendezvous
        spec = WorkerSpec(0, size, port, model_config, config, threads_per_rank)
        group, device = init_rank(spec)
        return rank_model(spec, shards.pop(0), group, device)

    def _expect(self, stage: str) -> None:
        """Wait for every worker's word that it reached `stage` ("started", "ready")."""
        for rank, pipe in enumerate(self.pipes, start=1):
            try:
                pipe.recv()
            except EOFError:
                raise BackendUnavailable(f"tensor-parallel rank {rank} ended before it was {stage} (its traceback "
                                         "is above; a "
                                         "script must start engines under `if __name__ == '__main__':`); fix it, or "
                                         "set tensor_parallel_size = 1") from None

    # What changes the model or its KV runs on every rank: the worker calls its own runner's method of that name.
    def execute(self, inputs: StepLayout):
        self._send("execute", dataclasses.replace(inputs, decodes=_views(inputs.decodes),
                                                  prefills=_views(inputs.prefills)))
        return super().execute(inputs)

    def copy_blocks(self, pairs: list[tuple[int, int, bool]]) -> None:
        if pairs:
            self._send("copy_blocks", pairs)
        super().copy_blocks(pairs)

    def _send(self, kind: str, arg) -> None:
        for rank, pipe in enumerate(self.pipes, start=1):
            try:
                pipe.send((kind, arg))
            except (BrokenPipeError, ConnectionResetError, OSError):
                raise BackendUnavailable(f"tensor-parallel rank {rank} has exited (its traceback is above); restart "
                                         "the engine") from None

    def close(self) -> None:
        self._stop()


def stop_workers(workers: list, pipes: list) -> None:
    """Tell every worker to stop, wait, kill what is left, and leave the process group (so another engine can
    start in this process)."""
    import torch.distributed as dist

    for pipe in pipes:
        try:
            pipe.send(("stop", None))
        except OSError:
            pass  # already gone
        pipe.close()
    for process in workers:
        process.join(STOP_WAIT_S)
        if process.is_alive():
            process.kill()
            process.join()
    if dist.is_initialized():
        dist.destroy_process_group()


def _views(rows: list) -> list:
    return [(SeqView(seq.num_computed_tokens, seq.block_table, seq.window_table), n) for seq, n in rows]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
