"""Native engine vs HF transformers `generate` on SmolLM2-135M, same workload, same run.

Workload: 64 chat requests, prompts of ~30-300 tokens, output lengths spread over 16-256 tokens
(fixed per request, ignore_eos), greedy. HF runs static batches (left padding) of 1, 8 and 16 on
the first --hf-requests requests; its best throughput is the peer figure. Where llama-cpp-python is
installed, llama.cpp decodes one stream of the first prompt from the same GGUF file (the one-stream
peer). Prints a table and writes JSON.

    .venv/bin/python bench/engine_throughput.py --threads 2            # dtype: the resolver's choice
    .venv/bin/python bench/engine_throughput.py --quant none,fp16,int8,int4  # weight formats (quant/linear.py)
    .venv/bin/python bench/engine_throughput.py --quant int4 --isa avx2,avx512 --hf-requests 0  # CPU kernel sets
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

import torch

from inferplug.benchmark.engine_runs import run_native, single_stream, workload
from inferplug.benchmark.machine import default_model

def single_stream_by_isa(engine, prompt: list[int], n: int, isas: list[str], rounds: int) -> dict[str, float]:
    """Median one-stream tok/s per CPU kernel set, the sets taking turns in every round (same engine, same prompt)."""
    from inferplug.kernels import cpu as cpu_kernels

    runs: dict[str, list[float]] = {isa: [] for isa in isas}
    for r in range(rounds):
        for isa in isas[r % len(isas):] + isas[:r % len(isas)]:
            cpu_kernels.set_isa(isa)
            runs[isa].append(single_stream(engine, prompt, n))
    cpu_kernels.set_isa(cpu_kernels.chosen_isa())
    return {isa: statistics.median(tps) for isa, tps in runs.items()}


def llama_cpp_single_stream(gguf: Path, prompt: list[int], n: int, threads: int) -> float | None:
    """llama.cpp's decode tok/s on one stream of the same prompt (greedy, EOS suppressed); None if not installed."""
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    llm = Llama(model_path=str(gguf), n_ctx=len(prompt) + n + 16, n_threads=threads, n_batch=512, verbose=False)
    stamps = []
    for _ in llm.create_completion(prompt, max_tokens=n, temperature=0.0, stream=True, logit_bias={llm.token_eos(): float("-inf")}):
        stamps.append(time.perf_counter())
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])  # from the first token: decode only, as TPOT


def run_hf(model, tokenizer, requests, batch: int) -> dict:
    tokenizer.padding_side = "left"
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    start, useful = time.perf_counter(), 0
    for at in range(0, len(requests), batch):
        group = requests[at:at + batch]
        width = max(len(p) for p, _ in group)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p, _ in group])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in group])
        longest = max(n for _, n in group)
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=longest, min_new_tokens=longest,
                           do_sample=False, pad_token_id=pad)
        useful += sum(n for _, n in group)  # a static batch runs to its longest; only requested tokens count
    wall = time.perf_counter() - start
    return {"batch": batch, "output_tokens": useful, "seconds": wall, "tok_per_s": useful / wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="GGUF file or HF dir (default: the smollm2-135m profile's model)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="auto", help="auto: what the resolver picks here (float32 on every CPU; a pinned bfloat16 or float16 is opt-in)")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--hf-requests", type=int, default=16, help="requests HF runs at each batch size (0 skips HF)")
    ap.add_argument("--hf-batches", default="1,8,16")
    ap.add_argument("--output-cap", type=int, default=256, help="cap output lengths (a quick smoke run of the script)")
    ap.add_argument("--quant", default="auto,int4",
                    help="native weight formats to run, comma-separated: auto (the resolver's choice for the default "
                         "profile here: the GGUF's own blocks on x86 CPUs), none (weights in the dtype), fp16, int8, int4")
    ap.add_argument("--isa", default="", help="CPU kernel sets (avx2,avx512) whose one-stream tok/s to time too, "
                    "taking turns in --isa-rounds rounds; the main runs use the set INFERPLUG_CPU_ISA or the CPU picks")
    ap.add_argument("--isa-rounds", type=int, default=5)
    ap.add_argument("--out", default="bench/results/engine_throughput.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from inferplug.backends.native import engine_config, gguf_layer_format
    from inferplug.engine.llm_engine import LLMEngine
    from inferplug.models.loader import load_tokenizer, load_weights, read_config

    path = Path(args.model) if args.model else default_model()
    plan = _default_plan()
    plan = dataclasses.replace(plan, dtype=plan.dtype if args.dtype == "auto" else args.dtype)
    config = engine_config(plan)  # the default profile's engine as the native backend builds it
    tokenizer = load_tokenizer(path)
    requests = workload(tokenizer, args.requests, args.output_cap)
    natives = {}
    for fmt in args.quant.split(","):
        fmt = (plan.weight_format or "none") if fmt == "auto" else fmt
        t0 = time.perf_counter()
        built = dataclasses.replace(plan, weight_format=None if fmt == "none" else fmt)  # as the native backend
        weights = load_weights(path, config.torch_dtype, gguf_layers=gguf_layer_format(built, 1))  # a GGUF's blocks
        engine = LLMEngine(read_config(path), weights, tokenizer, engine_config(built))
        load_s = time.perf_counter() - t0
        run_native(engine, requests[:2])  # warm-up
        natives[fmt] = run_native(engine, requests)
        natives[fmt]["single_stream_tok_per_s"] = single_stream(engine, requests[0][0], min(128, args.output_cap))
        if args.isa:
            natives[fmt]["single_stream_tok_per_s_by_isa"] = single_stream_by_isa(
                engine, requests[0][0], min(128, args.output_cap), args.isa.split(","), args.isa_rounds)
        natives[fmt]["load_seconds"] = load_s
        del engine
    hf_runs = []
    if args.hf_requests:
        import transformers

        kwargs = {"gguf_file": path.name} if path.suffix == ".gguf" else {}
        hf = transformers.AutoModelForCausalLM.from_pretrained(
            path.parent if path.suffix == ".gguf" else path, dtype=config.torch_dtype, **kwargs).eval()
        subset = requests[: args.hf_requests]
        hf_runs = [run_hf(hf, tokenizer, subset, int(b)) for b in args.hf_batches.split(",")]
    best = max(hf_runs, key=lambda r: r["tok_per_s"]) if hf_runs else None
    llama_cpp = llama_cpp_single_stream(path, requests[0][0], min(128, args.output_cap), args.threads) if path.suffix == ".gguf" else None
    report = {"workload": {"requests": len(requests), "dtype": plan.dtype, "threads": args.threads,
                           "prompt_tokens": [len(p) for p, _ in requests], "output_tokens": [n for _, n in requests]},
              "native": natives, "hf": hf_runs, "llama_cpp_single_stream_tok_per_s": llama_cpp,
              "ratio_vs_best_hf": {fmt: n["tok_per_s"] / best["tok_per_s"] for fmt, n in natives.items()} if best else None}
    print(f"{'engine':<26}{'out tok/s':>10}{'TTFT med':>10}{'TPOT med':>10}{'1-stream tok/s':>16}{'vs best HF':>12}")
    for fmt, native in natives.items():
        ratio = f"{report['ratio_vs_best_hf'][fmt]:.2f}x" if best else "-"
        print(f"{f'native {fmt} ({len(requests)} req)':<26}{native['tok_per_s']:>10.1f}{native['ttft_median_s']:>9.2f}s"
              f"{native['tpot_median_s'] * 1000:>8.1f}ms{native['single_stream_tok_per_s']:>16.1f}{ratio:>12}")
    for fmt, native in natives.items():
        for isa, tps in native.get("single_stream_tok_per_s_by_isa", {}).items():
            print(f"{f'native {fmt} one stream, {isa}':<56}{tps:>16.1f}")
    for run in hf_runs:
        print(f"{'hf generate b=' + str(run['batch']):<26}{run['tok_per_s']:>10.1f}")
    if llama_cpp is not None:
        print(f"{'llama.cpp (one stream)':<26}{'':>10}{'':>10}{'':>10}{llama_cpp:>16.1f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))


def _default_plan():
    from inferplug.hardware import probe
    from inferplug.profile import load_profile
    from inferplug.resolver import resolve

    return resolve(load_profile("smollm2-135m"), probe())


if __name__ == "__main__":
    main()
