"""bench/tensor_parallel.py's wire costs, between two otherwise idle processes over gloo (loopback): one
all-reduce of a decode step's hidden rows, and the two ways rank 0 can hand a step's rows to another rank:
a pipe (what engine/parallel uses) or torch.distributed.broadcast_object_list (one collective on the group).
Both control paths are timed as a round trip with a one-byte answer, so they compare on equal terms."""

from __future__ import annotations

import statistics
import time

REPEATS = 200


def _rank(rank: int, port: int, conn, payload, shapes, out) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    results = {}
    for shape in shapes:
        x = torch.randn(shape)
        times = []
        for _ in range(REPEATS):
            start = time.perf_counter()
            dist.all_reduce(x)
            times.append(time.perf_counter() - start)
        results[f"all_reduce {list(shape)} fp32"] = statistics.median(times)
    for name in ("pipe", "broadcast_object_list"):
        times = []
        dist.barrier()
        for _ in range(REPEATS):
            start = time.perf_counter()
            if name == "pipe":
                if rank == 0:
                    conn.send(payload)
                    conn.recv_bytes()
                else:
                    conn.recv()
                    conn.send_bytes(b"k")
            else:
                box = [payload if rank == 0 else None]
                dist.broadcast_object_list(box, src=0)
                if rank == 0:
                    conn.recv_bytes()
                else:
                    conn.send_bytes(b"k")
            times.append(time.perf_counter() - start)
        results[f"step rows by {name} (round trip)"] = statistics.median(times)
    if rank == 0:
        out.update(results)
    dist.destroy_process_group()


def wire_costs(payload, shapes) -> dict[str, float]:
    """{what: median seconds} measured on rank 0."""
    import multiprocessing

    from inferplug.engine.parallel.runner import free_port

    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    port = free_port()
    worker = ctx.Process(target=_rank, args=(1, port, theirs, payload, shapes, {}), daemon=True)
    worker.start()
    out: dict[str, float] = {}
    _rank(0, port, ours, payload, shapes, out)
    worker.join(30)
    return out
