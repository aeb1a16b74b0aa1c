"""SmolLM2-135M-Instruct as fp32, Q4_1 GGUF, AWQ and GPTQ on the native engine: perplexity, one-stream decode
speed and 64-request throughput, every format in the same run.

The AWQ / GPTQ checkpoints are built by bench/make_smollm2_awq_gptq.py (GPTQModel, its own venv) into --quant-dir;
"fp32" there is the Q4_1 GGUF dequantized (the only SmolLM2 this project has), so AWQ and GPTQ re-quantize a model
that was Q4_1 already, and fp32 and Q4_1 have the same weights.
- Perplexity: on bench/data/perplexity_text.md (a frozen copy of docs/profiles.md), windows of 1024 tokens, with
  transformers' Llama in fp32 over the weights each format runs (the engine's layers dequantized: Q4_1 blocks, the
  AWQ / GPTQ repack with its fp16 mins): what prefill computes; decode also rounds activations to int8.
- Speed: bench/engine_throughput.py's workload (inferplug/benchmark/engine_runs.py: chat prompts of ~30-300 tokens),
  one stream of its first prompt (formats taking turns, --rounds rounds, median), then all --requests at once.

    .venv/bin/python bench/awq_gptq.py --quant-dir /tmp/smollm2-quant --threads 2
    .venv/bin/python bench/awq_gptq.py --quant-dir /tmp/smollm2-quant --formats "q4_1 gguf,gptq g32 act-order" \
        --speed-only --rounds 9        # one-stream speed of two peers alone: quicker on a loaded host
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

import torch

from inferplug.benchmark.engine_runs import run_native, single_stream, workload
from inferplug.benchmark.machine import default_model

TEXT = Path(__file__).parent / "data" / "perplexity_text.md"
WINDOW = 1024


def formats(quant_dir: Path, gguf: Path) -> dict[str, tuple[Path, str | None]]:
    """label -> (model path, the weight format the engine is built in)."""
    return {"fp32": (quant_dir / "fp32", None), "q4_1 gguf": (gguf, "int4"),
            "awq g32": (quant_dir / "awq-g32", "awq"), "gptq g32 act-order": (quant_dir / "gptq-g32", "gptq")}


def build(path: Path, fmt: str | None, tokenizer):
    from inferplug.engine.config import EngineConfig
    from inferplug.engine.llm_engine import LLMEngine
    from inferplug.models.loader import load_weights, read_config

    config = EngineConfig(dtype="float32", num_kv_blocks=2048, max_num_seqs=64, max_num_batched_tokens=2048,
                          weight_format=fmt)  # as the native backend builds it
    return LLMEngine(read_config(path), load_weights(path, config.torch_dtype), tokenizer, config)


def float_state(model) -> dict[str, torch.Tensor]:
    """The engine model's weights as transformers names them, dequantized as the engine holds them."""
    def dense(w):
        return w.float() if isinstance(w, torch.Tensor) else w.dequantized().float()

    q, kv = model.q_size, model.kv_size
    state = {"model.embed_tokens.weight": model.embed.float(), "model.norm.weight": model.norm.float(),
             "lm_head.weight": dense(model.lm_head)}
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        qkv, gate_up = dense(layer.qkv), dense(layer.gate_up)
        state |= {p + "input_layernorm.weight": layer.input_norm.float(),
                  p + "post_attention_layernorm.weight": layer.post_norm.float(),
                  p + "self_attn.q_proj.weight": qkv[:q], p + "self_attn.k_proj.weight": qkv[q:q + kv],
                  p + "self_attn.v_proj.weight": qkv[q + kv:], p + "self_attn.o_proj.weight": dense(layer.o),
                  p + "mlp.gate_proj.weight": gate_up[: gate_up.shape[0] // 2],
                  p + "mlp.up_proj.weight": gate_up[gate_up.shape[0] // 2:], p + "mlp.down_proj.weight": dense(layer.down)}
    return state


@torch.inference_mode()
def perplexity(hf_model, state: dict[str, torch.Tensor], ids: list[int]) -> float:
    hf_model.load_state_dict(state, strict=False)
    nll, count = 0.0, 0
    for start in range(0, len(ids) - 1, WINDOW):
        window = torch.tensor([ids[start:start + WINDOW + 1]])
        logits = hf_model(window[:, :-1]).logits.float()
        nll += torch.nn.functional.cross_entropy(logits[0], window[0, 1:], reduction="sum").item()
        count += window.shape[1] - 1
    return math.exp(nll / count)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quant-dir", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--output-cap", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--formats", help="comma-separated labels to run (default: every one built); q4_1 gguf is the base")
    ap.add_argument("--speed-only", action="store_true", help="one-stream speed only: no perplexity, no 64 requests")
    ap.add_argument("--out", default="bench/results/awq_gptq.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    import transformers

    from inferplug.models.loader import load_tokenizer

    tokenizer = load_tokenizer(args.quant_dir / "fp32")
    ids = tokenizer(TEXT.read_text())["input_ids"]
    requests = workload(tokenizer, args.requests, args.output_cap)
    wanted = args.formats.split(",") if args.formats else list(formats(args.quant_dir, Path()))
    present = {label: spec for label, spec in formats(args.quant_dir, default_model()).items()
               if label in wanted and spec[0].exists()}
    for label in set(wanted) - present.keys():
        print(f"skipping {label}: not built yet (bench/make_smollm2_awq_gptq.py) or not a format label")
    engines = {label: build(path, fmt, tokenizer) for label, (path, fmt) in present.items()}
    report = {label: {"decode_weight_bytes": e.runner.model.decode_weight_bytes()} for label, e in engines.items()}
    if not args.speed_only:
        hf = transformers.AutoModelForCausalLM.from_pretrained(args.quant_dir / "fp32", dtype=torch.float32).eval()
        for label, engine in engines.items():
            report[label]["perplexity"] = perplexity(hf, float_state(engine.runner.model), ids)
    one_stream: dict[str, list[float]] = {label: [] for label in engines}
    for r in range(args.rounds):
        labels = list(engines)[r % len(engines):] + list(engines)[:r % len(engines)]
        for label in labels:
            one_stream[label].append(single_stream(engines[label], requests[0][0], args.output_cap))
    for label, engine in engines.items():
        report[label]["single_stream_tok_per_s"] = statistics.median(one_stream[label])
        if not args.speed_only:
            run_native(engine, requests[:2])  # warm-up
            report[label]["batch"] = run_native(engine, requests)
    base = report["q4_1 gguf"]["single_stream_tok_per_s"]
    print(f"{'format':<22}{'ppl':>8}{'MiB/step':>10}{'1-stream tok/s':>16}{'vs q4_1':>9}{f'{args.requests} req tok/s':>14}")
    for label, row in report.items():
        print(f"{label:<22}{row.get('perplexity', math.nan):>8.3f}{row['decode_weight_bytes'] / 2**20:>10.1f}"
              f"{row['single_stream_tok_per_s']:>16.1f}{row['single_stream_tok_per_s'] / base:>8.2f}x"
              f"{row['batch']['tok_per_s'] if 'batch' in row else math.nan:>14.1f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"text_tokens": len(ids), "threads": args.threads, "formats": report}, indent=2))


if __name__ == "__main__":
    main()
