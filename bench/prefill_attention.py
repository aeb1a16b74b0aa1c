"""One layer's prefill attention (SmolLM2-135M's shape: 9 heads, 3 KV heads, head_dim 64), one causal sequence:
inferplug's C++ paged attention kernel against torch's fused CPU flash SDPA (is_causal, no mask, K/V contiguous
and expanded to every head, which it needs) and against the previous kernel path (every row a paged_decode row
reading its whole prefix, now the one-row case of the same kernel). Best of --repeats; the table gives CPU time
(this process's, so other load on the machine counts less), the JSON wall time too; ratios in the same run.

    .venv/bin/python bench/prefill_attention.py --lengths 512,2048,4096 --threads 1
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

from inferplug.kernels import cpu as cpu_kernels
from inferplug.kernels.paged_attention_ref import random_pool

HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64


def best(fn, repeats: int) -> tuple[float, float]:
    fn()
    wall, cpu = [], []
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - w)
        cpu.append(time.process_time() - c)
    return min(wall), min(cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="512,2048,4096")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default="prefill-attention-result.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ops = cpu_kernels.ops()
    rows = []
    print("| tokens | ours (CPU ms) | torch flash SDPA (CPU ms) | per-row decode (CPU ms) | SDPA / ours | decode / ours |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n in [int(x) for x in args.lengths.split(",")]:
        q, k_cache, v_cache, tables, lens = random_pool(batch=1, heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM,
                                                        block_size=16, seq_lens=[n])
        q = torch.randn(n, HEADS, HEAD_DIM)
        tables, lens = tables.long(), lens.long()
        k, v = (c[:, tables[0]].flatten(1, 2)[:, :n].repeat_interleave(HEADS // KV_HEADS, 0) for c in (k_cache, v_cache))
        q_heads = q.transpose(0, 1).contiguous()
        row_tables, row_lens = tables.expand(n, -1).contiguous(), torch.arange(1, n + 1)
        times = {
            "ours": best(lambda: ops.paged_attention(q, k_cache, v_cache, tables, torch.tensor([0, n]), lens, 0.125),
                         args.repeats),
            "sdpa_flash": best(lambda: F.scaled_dot_product_attention(q_heads, k, v, is_causal=True, scale=0.125),
                               args.repeats),
            "per_row_decode": best(lambda: ops.paged_decode(q, k_cache, v_cache, row_tables, row_lens, 0.125),
                                   args.repeats),
        }
        ours, sdpa, per_row = (times[k][1] for k in ("ours", "sdpa_flash", "per_row_decode"))
        rows.append({"tokens": n, "threads": args.threads, **{f"{k}_s": w for k, (w, _) in times.items()},
                     **{f"{k}_cpu_s": c for k, (_, c) in times.items()}})
        print(f"| {n} | {ours * 1e3:.1f} | {sdpa * 1e3:.1f} | {per_row * 1e3:.1f} | {sdpa / ours:.2f}x | "
              f"{per_row / ours:.2f}x |", flush=True)
    with open(args.json, "w") as f:
        json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
