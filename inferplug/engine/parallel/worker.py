"""Ranks 1..N-1: a spawned process that runs each step rank 0 sends it, until told to stop or rank 0 is gone.

Control goes through a pipe per worker (a pickled ops.step.StepLayout, a few KB a step), not a collective: a worker waits
on it without a timeout however long the engine idles, and sees EOF the moment rank 0's process ends, so no
worker outlives it (Ctrl-C, a crash, a kill). The collectives carry only the model's tensors."""

from __future__ import annotations

import os
import signal
import sys
import traceback
from dataclasses import dataclass
from datetime import timedelta


@dataclass
class WorkerSpec:
    rank: int
    size: int
    port: int  # rank 0's TCP rendezvous on 127.0.0.1
    model_config: object  # models.config.ModelConfig (full architecture)
    engine_config: object  # engine.config.EngineConfig
    threads: int  # torch intra-op threads for this rank (0: torch's default)


def init_rank(spec: WorkerSpec):
    """Join the process group and build this rank's model: (DecoderModel, device)."""
    import torch
    import torch.distributed as dist

    from inferplug.ops.parallel_group import TensorParallelGroup

    config = spec.engine_config
    cuda = str(config.device).startswith("cuda")
    device = f"cuda:{spec.rank}" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(device)
    if spec.threads:
        torch.set_num_threads(spec.threads)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{spec.port}", rank=spec.rank,
                            world_size=spec.size, timeout=timedelta(minutes=5))
    return TensorParallelGroup(spec.rank, spec.size), device


def rank_model(spec: WorkerSpec, shard: dict, group, device: str):
    from inferplug.models.decoder import DecoderModel
    from inferplug.models.shard import rank_config

    config = spec.engine_config
    return DecoderModel(rank_config(spec.model_config, spec.size), shard, dtype=config.torch_dtype, device=device,
                      attention=config.attention, kv_dtype=config.torch_kv_dtype, parallel=group)


def worker_main(spec: WorkerSpec, shard: dict, conn) -> None:
    """The worker's whole life. Any error ends the process: rank 0's next collective then fails, which fails
    that step's requests there with the error, rather than a rank hanging."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: rank 0 decides
    try:
        import torch.distributed as dist

        from inferplug.engine.model_runner import ModelRunner

        conn.send("started")  # imported and unpickled: rank 0 may now wait in the rendezvous
        group, device = init_rank(spec)
        model = rank_model(spec, shard, group, device)
        del shard
        config = spec.engine_config
        runner = ModelRunner(model, num_blocks=config.num_kv_blocks, block_size=config.block_size, sampler=None,
                             weight_format=config.weight_format, prefill_gemm=config.prefill_gemm,
                             window_blocks=config.window_kv_blocks)  # rank 0's format and pools
        conn.send("ready")
        while True:
            try:
                kind, arg = conn.recv()
            except EOFError:  # rank 0 is gone
                break
            if kind == "stop":
                break
            getattr(runner, kind)(arg)  # execute, copy_blocks: what rank 0 does to its own slice
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - report, then end this rank without unwinding into the pipe
        traceback.print_exc(file=sys.stderr)
        os._exit(1)
