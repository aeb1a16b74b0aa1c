"""A chat's second turn on a hybrid model (Qwen3.5): its time to first token with inferplug's prefix cache (the
DeltaNet state resumed from a snapshot, engine/state_snapshots.py), without it, and on llama.cpp, same file, same run.

Turn 1 is a --prompt-tokens prompt and a --reply-tokens greedy reply; turn 2 is turn 1's prompt, its reply and
--turn-tokens new ones, asked for one token. inferplug runs the native backend a user's profile gets (the file's
blocks, the plan's KV dtype and prefill path, [native] num_threads), with the prefix cache on, then off. llama.cpp (llama-cpp-python's C API, one sequence) keeps its sequence's state after turn 1
and evaluates only turn 2's new tokens, as llama-server's prompt cache does when a prompt extends the last one: its
best case; then, its memory cleared, the whole turn 2 prompt. Medians of --repeats.

    .venv/bin/python bench/real_size.py --geometry qwen35-9b --formats gguf --engines inferplug  # writes the file
    .venv/bin/python bench/hybrid_chat.py /work/tmp-realsize/random-qwen35-32L-Q4_K_M.gguf
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import time
from pathlib import Path


def inferplug_ttft(path: Path, turn1: list[int], reply: int, new: list[int], cached: bool, threads: int) -> dict:
    import tempfile

    from inferplug.backends.native import NativeBackend
    from inferplug.hardware import probe
    from inferplug.profile import load_profile
    from inferplug.resolver import resolve
    from inferplug.types import Request, SamplingParams

    context = len(turn1) + reply + len(new) + 16
    toml = Path(tempfile.mkdtemp()) / "chat.toml"
    toml.write_text(f'backend = "native"\n[model]\npath = "{path}"\n[quantization]\nformat = "gguf"\n[cache]\n'
                    f'prefix_caching = {str(cached).lower()}\n[limits]\nmax_model_len = {context}\nmax_num_seqs = 2\n'
                    f'max_num_batched_tokens = 512\n[native]\nnum_threads = {threads}\n')
    profile = load_profile(str(toml))
    engine = NativeBackend(profile, resolve(profile, probe())).engine.engine

    def run(prompt: list[int], tokens: int, rid: str) -> tuple[float, list[int], int]:
        engine.add_request(Request(prompt=prompt, request_id=rid,
                                   params=SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)))
        start, first, out, cached = time.perf_counter(), None, [], 0
        while engine.has_unfinished():
            for event in engine.step():
                out += event.token_ids
                first = first or (time.perf_counter() if out else None)
                cached = event.usage.cached_tokens if event.usage else cached
        return first - start, out, cached

    ttft1, replied, _ = run(turn1, reply, "1")
    ttft2, _, cached = run(turn1 + replied + new, 1, "2")
    return {"turn1_ttft": ttft1, "turn2_ttft": ttft2, "turn2_cached_tokens": cached, "reply": replied}


def llama_cpp_ttft(path: Path, turn1: list[int], reply: list[int], new: list[int], threads: int) -> dict:
    from inferplug.benchmark.llama_cpp_engine import LlamaCpp
    from inferplug.benchmark.real_size_workload import Workload

    w = Workload(context=len(turn1) + len(reply) + len(new) + 16, threads=threads, vocab=0, prefill_tokens=0,
                 decode_tokens=0, streams=1, repeats=1)
    engine = LlamaCpp(str(path), w)
    engine.load()

    def feed(tokens: list[int], first: int) -> float:
        start = time.perf_counter()
        for i in range(0, len(tokens), 512):
            chunk = tokens[i:i + 512]
            engine.decode([(t, first + i + j, 0, i + j == len(tokens) - 1) for j, t in enumerate(chunk)])
        engine.argmax(len(tokens) - 1 - (len(tokens) - 1) // 512 * 512)
        return time.perf_counter() - start

    lc = engine.lc
    lc.llama_memory_clear(lc.llama_get_memory(engine.ctx), True)
    ttft1 = feed(turn1, 0)
    for i, t in enumerate(reply[:-1]):  # the reply's tokens, one a step (its last is turn 2's first new input)
        engine.decode([(t, len(turn1) + i, 0, True)])
    kept = feed([reply[-1], *new], len(turn1) + len(reply) - 1)
    lc.llama_memory_clear(lc.llama_get_memory(engine.ctx), True)
    whole = feed(turn1 + reply + new, 0)
    return {"turn1_ttft": ttft1, "turn2_ttft_state_kept": kept, "turn2_ttft_cleared": whole}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", type=Path)
    parser.add_argument("--prompt-tokens", type=int, default=1024)
    parser.add_argument("--reply-tokens", type=int, default=64)
    parser.add_argument("--turn-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--json", default="hybrid-chat-result.json")
    args = parser.parse_args()
    rng = random.Random(0)
    turn1 = [rng.randrange(1000, 40000) for _ in range(args.prompt_tokens)]
    new = [rng.randrange(1000, 40000) for _ in range(args.turn_tokens)]
    rows = {}
    for name, cached in (("inferplug, prefix cache", True), ("inferplug, no prefix cache", False)):
        runs = [inferplug_ttft(args.model, turn1, args.reply_tokens, new, cached, args.threads)
                for _ in range(args.repeats)]
        rows[name] = {k: statistics.median(r[k] for r in runs) for k in ("turn1_ttft", "turn2_ttft",
                                                                         "turn2_cached_tokens")}
        reply = runs[0]["reply"]
        gc.collect()
        print(name, rows[name], flush=True)
    runs = [llama_cpp_ttft(args.model, turn1, reply, new, args.threads) for _ in range(args.repeats)]
    rows["llama.cpp"] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    print("llama.cpp", rows["llama.cpp"], flush=True)
    Path(args.json).write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows},
                                          indent=2))


if __name__ == "__main__":
    main()
