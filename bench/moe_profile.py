"""Where one decode step of an MoE model goes, at 1 and 8 streams (issue 40's "profile first"): torch's profiler over
the engine's decode steps, each op's own CPU time gathered by what it does:
  experts    kernels/cpu/moe_experts.cpp: grouping the rows by expert, gate/up, SiLU, down, the weighted sum
  router     the router's row-invariant product, softmax, top-k and renormalization (torch ops)
  attention  q/k/v and o projections, QK-norm, RoPE with the K/V store, paged attention
  norms      the layers' RMSNorms
  head       the final norm's output through the lm_head
  other      sampling, the step's bookkeeping
A model file from bench/real_size.py (--geometry qwen3-30b-a3b) loads through its profile TOML.

    .venv/bin/python bench/moe_profile.py /work/tmp-realsize/random-qwen3moe-24L-Q4_K_M.gguf.toml
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

from torch.profiler import ProfilerActivity, profile

from inferplug.types import Request, SamplingParams

CATEGORIES = {"experts": ("inferplug::moe_experts",),
              "router": ("aten::mul", "aten::sum", "aten::cat", "aten::softmax", "aten::_softmax", "aten::topk",
                         "aten::div", "aten::to", "aten::_to_copy", "aten::copy_"),
              "attention": ("inferplug::q4_k_matmul", "inferplug::q5_k_matmul", "inferplug::q6_k_matmul",
                            "inferplug::q8_matmul", "inferplug::q4_matmul", "inferplug::qk_rms_norm_",
                            "inferplug::rope_write_kv_", "inferplug::paged_attention"),
              "norms": ("inferplug::rms_norm", "inferplug::add_rms_norm_"),
              "head": ("inferplug::q8_head_matmul", "inferplug::q6_k_head_matmul")}


def category(op: str) -> str:
    return next((name for name, ops in CATEGORIES.items() if op in ops), "other")


def decode_profile(engine, streams: int, steps: int, vocab: int) -> tuple[float, dict[str, float]]:
    """Seconds a decode step of `streams` streams, and each category's share of the profiled CPU time."""
    for i in range(streams):
        ids = [(7 * i + j) % (vocab - 1) + 1 for j in range(32)]
        params = SamplingParams(temperature=0.0, max_tokens=steps + 8, ignore_eos=True)
        request = Request(prompt=ids, params=params, request_id=f"s{i}")
        engine.add_request(request, engine.encode(request))
    for _ in range(4):  # the prefills, and a decode step to warm up
        engine.step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            engine.step()
        elapsed = (time.perf_counter() - start) / steps
    while engine.has_unfinished():
        engine.step()
    times: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        times[category(event.key)] += event.self_cpu_time_total
    total = sum(times.values())
    return elapsed, {name: times[name] / total for name in (*CATEGORIES, "other")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("profile", help="a profile TOML (bench/real_size.py writes one beside each model file)")
    parser.add_argument("--steps", type=int, default=16)
    args = parser.parse_args()
    from inferplug.llm import LLM
    from inferplug.profile import load_profile

    llm = LLM(load_profile(args.profile))
    vocab = llm.engine.runner.model.config.vocab_size
    print("| streams | step ms | tok/s | " + " | ".join(f"{name} %" for name in (*CATEGORIES, "other")) + " |")
    print("|---:|---:|---:|" + "---:|" * (len(CATEGORIES) + 1))
    for streams in (1, 8):
        elapsed, shares = decode_profile(llm.engine, streams, args.steps, vocab)
        print(f"| {streams} | {elapsed * 1e3:.1f} | {streams / elapsed:.1f} | " +
              " | ".join(f"{100 * share:.1f}" for share in shares.values()) + " |", flush=True)
    llm.engine.close()


if __name__ == "__main__":
    main()
