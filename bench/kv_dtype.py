"""fp16 against fp32 K/V pools on the CPU kernel path, SmolLM2-135M: quality, speed and cache bytes in one run.

- Quality, as llama.cpp measures quantization (DESIGN.md, "Precision and quality"): teacher-forced over
  bench/data/perplexity_text.md in windows of 1024 tokens (prefill chunks of 256 read the window's earlier K/V
  back from the pools), the KL divergence of each path's next-token distribution from the fp32 reference's, top-1
  agreement and perplexity. Q8_0 weights (int8) are the yardstick a default path must not exceed.
- Speed: one stream decoding --tokens tokens after bench/engine_throughput.py's first prompt
  (inferplug/benchmark/engine_runs.py), and after a long prompt (--long tokens), the KV dtypes taking turns in
  --rounds rounds; medians.
- Bytes: the pools' bytes a token, and at the long context.

    .venv/bin/python bench/kv_dtype.py --threads 2
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

import torch

from inferplug.benchmark.engine_runs import single_stream, workload
from inferplug.benchmark.machine import default_model

TEXT = Path(__file__).parent / "data" / "perplexity_text.md"
WINDOW, CHUNK = 1024, 256


def build(path: Path, tokenizer, fmt: str | None, kv_dtype: str, blocks: int):
    from inferplug.engine.config import EngineConfig
    from inferplug.engine.llm_engine import LLMEngine
    from inferplug.models.loader import load_weights, read_config

    config = EngineConfig(dtype="float32", kv_dtype=kv_dtype, num_kv_blocks=blocks, max_num_seqs=4,
                          max_num_batched_tokens=CHUNK, weight_format=fmt or None)  # as the native backend builds
    return LLMEngine(read_config(path), load_weights(path, config.torch_dtype), tokenizer, config)


@torch.inference_mode()
def teacher_forced_logprobs(engine, ids: list[int]) -> torch.Tensor:
    """Log-softmax of the next-token logits at every position but the last, window by window, through the engine's
    own ops (one sequence, blocks 0.. in order, prefill chunks of CHUNK rows): row i predicts ids[i + 1]."""
    from inferplug.engine.sequence import Sequence
    from inferplug.ops import StepLayout
    from inferplug.types import SamplingParams

    model, runner = engine.runner.model, engine.runner
    out = []
    for start in range(0, len(ids) - 1, WINDOW):
        window = ids[start:min(start + WINDOW, len(ids) - 1)]
        seq = Sequence("kld", 0, window, SamplingParams(), max_tokens=1)
        seq.block_table = list(range(-(-len(window) // runner.block_size)))
        for first in range(0, len(window), CHUNK):
            rows = min(CHUNK, len(window) - first)
            seq.num_computed_tokens = first
            slots = torch.arange(first, first + rows)  # identity block table: slot = position
            ctx = model.ops.context(StepLayout([], [(seq, rows)], runner.block_size), slots.to(model.device))
            hidden = model.forward(torch.tensor(window[first:first + rows]), slots.clone(), ctx, runner.kv_caches)
            out.append(torch.log_softmax(model.compute_logits(hidden), dim=-1))
    return torch.cat(out)


def quality(ref: torch.Tensor, lp: torch.Tensor, targets: torch.Tensor) -> dict:
    kld = (ref.exp() * (ref - lp)).sum(-1)
    return {"kld_mean": kld.mean().item(), "kld_p99": kld.quantile(0.99).item(),
            "top1_agreement": (ref.argmax(-1) == lp.argmax(-1)).float().mean().item(),
            "ppl": math.exp(-lp.gather(1, targets[:, None]).mean().item())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--windows", type=int, default=4, help="1024-token windows of the text for the KL divergence")
    ap.add_argument("--tokens", type=int, default=128, help="decoded tokens a speed run")
    ap.add_argument("--long", type=int, default=3000, help="prompt tokens of the long-context speed run")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="bench/results/kv_dtype.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from inferplug.models.loader import load_tokenizer

    path = default_model()
    tokenizer = load_tokenizer(path)
    ids = tokenizer(TEXT.read_text())["input_ids"]
    text = ids[: args.windows * WINDOW + 1]
    targets = torch.tensor([t for s in range(0, len(text) - 1, WINDOW) for t in text[s + 1:s + WINDOW + 1]])
    blocks = max(-(-(args.long + args.tokens) // 16), WINDOW // 16) + 8
    # label -> (weight format, kv dtype); the reference is fp32 weights with fp32 K/V
    paths = {"fp32": (None, "float32"), "fp32 weights, fp16 KV": (None, "float16"), "Q8_0 weights": ("int8", "float32"),
             "fp16 weights, fp32 KV": ("fp16", "float32"), "fp16 weights, fp16 KV (default)": ("fp16", "float16")}
    report, ref = {}, None
    for label, (fmt, kv) in paths.items():
        lp = teacher_forced_logprobs(build(path, tokenizer, fmt, kv, blocks), text)
        ref = lp if ref is None else ref
        report[label] = quality(ref, lp, targets)
        print(f"{label:<34} KLD {report[label]['kld_mean']:.2e}  top-1 {report[label]['top1_agreement']:.4f}  "
              f"ppl {report[label]['ppl']:.4f}", flush=True)

    engines = {kv: build(path, tokenizer, "fp16", kv, blocks) for kv in ("float32", "float16")}
    short = workload(tokenizer, 1, 0)[0][0]
    long = (text * (args.long // len(text) + 1))[: args.long]
    speed = {kv: {"short": [], "long": []} for kv in engines}
    for r in range(args.rounds):
        for kv in list(engines)[r % 2:] + list(engines)[:r % 2]:
            speed[kv]["short"].append(single_stream(engines[kv], short, args.tokens))
            speed[kv]["long"].append(single_stream(engines[kv], long, args.tokens))
    for kv, engine in engines.items():
        k, _ = engine.runner.kv_caches[0]
        per_token = 2 * len(engine.runner.kv_caches) * k.shape[0] * k.shape[-1] * k.element_size()
        report[f"speed {kv} KV"] = {"short_tok_per_s": statistics.median(speed[kv]["short"]),
                                    "long_tok_per_s": statistics.median(speed[kv]["long"]),
                                    "kv_bytes_per_token": per_token,
                                    "kv_bytes_at_long_context": per_token * (args.long + args.tokens)}
        row = report[f"speed {kv} KV"]
        print(f"fp16 weights, {kv} KV: one stream {row['short_tok_per_s']:.1f} tok/s ({len(short)}-token prompt), "
              f"{row['long_tok_per_s']:.1f} tok/s ({args.long}-token prompt); {per_token} B/token, "
              f"{row['kv_bytes_at_long_context'] / 2**20:.1f} MiB at {args.long + args.tokens} tokens")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"threads": args.threads, "text_tokens": len(text), **report}, indent=2))


if __name__ == "__main__":
    main()
