"""The Triton paged-decode kernel on a CUDA GPU: achieved HBM bandwidth against the device's measured copy
bandwidth, and time against torch SDPA on the same K/V gathered contiguous (what a non-paged engine reads); the
Triton prefill kernel (through block tables, packed) against SDPA's causal attention on contiguous K/V.
7B geometry (32 heads, 8 KV heads, head_dim 128), bf16, block 16. Prints a table and writes JSON; a second
table times the kernel's knobs (split-K against one program per sequence, partition size, tile, warps, stages)
against the defaults, so a tuning change is one run.

    python3 bench/gpu_kernels.py --out gpu_kernels.json     # on a machine with a CUDA GPU
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from inferplug.kernels.paged_attention import paged_attention_decode  # noqa: E402
from inferplug.kernels.paged_attention_ref import random_pool  # noqa: E402
from inferplug.kernels.prefill_attention import prefill_attention  # noqa: E402
from inferplug.kernels.prefill_attention_ref import random_prefill  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 32, 8, 128, 16


def cuda_ms(fn, repeats: int = 20) -> float:
    """Median milliseconds of fn() over `repeats` runs, timed with CUDA events after a warm-up."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def copy_bandwidth() -> float:
    """Device-to-device copy of 2 GiB: bytes read plus bytes written per second."""
    src = torch.empty(1 << 30, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.nbytes / (cuda_ms(lambda: dst.copy_(src)) / 1e3)


def decode_row(batch: int, context: int, peak: float) -> dict:
    q, k, v, tables, lens = random_pool(batch=batch, heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM,
                                        block_size=BLOCK, seq_lens=[context] * batch, device="cuda",
                                        dtype=torch.bfloat16)  # fmt: skip
    scale = HEAD_DIM**-0.5
    triton_ms = cuda_ms(lambda: paged_attention_decode(q, k, v, tables, lens, scale))
    kv_bytes = 2 * batch * context * KV_HEADS * HEAD_DIM * 2  # K and V, bf16
    # torch SDPA on the same rows gathered contiguous: [batch, kv_heads, context, head_dim], GQA in the kernel
    gathered = [c[:, tables.long()].flatten(2, 3)[:, :, :context].transpose(0, 1).contiguous() for c in (k, v)]
    query = q.unsqueeze(2)  # [batch, heads, 1, head_dim]
    sdpa = torch.nn.functional.scaled_dot_product_attention
    sdpa_ms = cuda_ms(lambda: sdpa(query, *gathered, scale=scale, enable_gqa=True))
    bandwidth = kv_bytes / (triton_ms / 1e3)
    return {"batch": batch, "context": context, "triton_ms": round(triton_ms, 4), "sdpa_ms": round(sdpa_ms, 4),
            "triton_GBps": round(bandwidth / 1e9, 1), "of_copy_bandwidth": round(bandwidth / peak, 3)}


# Each variant changes one knob from the defaults (inferplug/kernels/paged_attention.py).
VARIANTS = {"default": {}, "single-pass": dict(split_k=False), "partition 128": dict(partition_size=128),
            "partition 512": dict(partition_size=512), "tile 32": dict(tile=32), "tile 128": dict(tile=128),
            "warps 8": dict(num_warps=8), "stages 2": dict(num_stages=2), "stages 4": dict(num_stages=4)}


def variant_rows(batch: int, context: int, peak: float) -> list[dict]:
    q, k, v, tables, lens = random_pool(batch=batch, heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM,
                                        block_size=BLOCK, seq_lens=[context] * batch, device="cuda",
                                        dtype=torch.bfloat16)  # fmt: skip
    kv_bytes = 2 * batch * context * KV_HEADS * HEAD_DIM * 2
    rows = []
    for name, knobs in VARIANTS.items():
        ms = cuda_ms(lambda knobs=knobs: paged_attention_decode(q, k, v, tables, lens, HEAD_DIM**-0.5, **knobs))
        rows.append({"batch": batch, "context": context, "variant": name, "ms": round(ms, 4),
                     "of_copy_bandwidth": round(kv_bytes / (ms / 1e3) / peak, 3)})
    return rows


# Prefill: fresh prompts, and one chunk over a cached prefix (SDPA then needs an explicit mask). Knob variants too.
PREFILL_CASES = [(1, 0, 4096), (4, 0, 2048), (16, 0, 512), (1, 3584, 512)]  # (sequences, cached prefix, new tokens)
PREFILL_VARIANTS = {"default": {}, "block_m 128": dict(block_m=128), "block_n 32": dict(block_n=32),
                    "warps 8": dict(num_warps=8), "stages 3": dict(num_stages=3)}


def prefill_rows(seqs: int, prefix: int, new: int) -> list[dict]:
    q, k, v, cu, lens, tables = random_prefill(chunks=[(prefix, new)] * seqs, heads=HEADS, kv_heads=KV_HEADS,
                                               head_dim=HEAD_DIM, block_size=BLOCK, dtype=torch.bfloat16,
                                               device="cuda")  # fmt: skip
    scale, ctx = HEAD_DIM**-0.5, prefix + new
    gathered = [c[:, tables.long()].flatten(2, 3)[:, :, :ctx].transpose(0, 1).contiguous() for c in (k, v)]
    query = q.view(seqs, new, HEADS, HEAD_DIM).transpose(1, 2)  # [seqs, heads, new, head_dim]
    mask = None if not prefix else (torch.arange(ctx, device="cuda")[None, :] <= torch.arange(prefix, ctx, device="cuda")[:, None])
    sdpa = torch.nn.functional.scaled_dot_product_attention
    sdpa_ms = cuda_ms(lambda: sdpa(query, *gathered, attn_mask=mask, is_causal=mask is None, scale=scale, enable_gqa=True))
    rows = []
    for name, knobs in PREFILL_VARIANTS.items():
        ms = cuda_ms(lambda knobs=knobs: prefill_attention(q, k, v, cu, lens, tables, scale, max_q_len=new, **knobs))
        rows.append({"seqs": seqs, "prefix": prefix, "new": new, "variant": name, "triton_ms": round(ms, 4),
                     "sdpa_ms": round(sdpa_ms, 4), "sdpa_over_triton": round(sdpa_ms / ms, 2)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("gpu_kernels.json"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench/gpu_kernels.py needs a CUDA GPU")
    peak = copy_bandwidth()
    rows = [decode_row(b, c, peak) for b, c in ((1, 4096), (8, 2048), (32, 2048), (64, 2048), (128, 1024))]
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {peak / 1e9:.0f} GB/s")
    print("| batch | context | triton ms | sdpa (contiguous) ms | triton GB/s | of copy bw |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['batch']} | {r['context']} | {r['triton_ms']} | {r['sdpa_ms']} | {r['triton_GBps']} | "
              f"{r['of_copy_bandwidth']:.0%} |")
    variants = [r for b, c in ((1, 4096), (8, 2048), (64, 2048)) for r in variant_rows(b, c, peak)]
    print("\n| batch | context | variant | ms | of copy bw |")
    print("|---:|---:|---|---:|---:|")
    for r in variants:
        print(f"| {r['batch']} | {r['context']} | {r['variant']} | {r['ms']} | {r['of_copy_bandwidth']:.0%} |")
    prefill = [r for case in PREFILL_CASES for r in prefill_rows(*case)]
    print("\n| sequences | cached prefix | new tokens | variant | triton ms | sdpa (contiguous) ms | sdpa / triton |")
    print("|---:|---:|---:|---|---:|---:|---:|")
    for r in prefill:
        print(f"| {r['seqs']} | {r['prefix']} | {r['new']} | {r['variant']} | {r['triton_ms']} | {r['sdpa_ms']} | "
              f"{r['sdpa_over_triton']}x |")
    args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                    "copy_GBps": round(peak / 1e9, 1), "decode": rows, "variants": variants,
                                    "prefill": prefill}, indent=2))


if __name__ == "__main__":
    main()
