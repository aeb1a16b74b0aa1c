"""Replicas on Ray Serve against one process: the same workload through `inferplug bench --url`, same host, same run.

Peers (each a fresh `inferplug serve` on loopback, stopped before the next starts):
  1 process        plain `inferplug serve PROFILE` (no Ray)
  1 replica        `--replicas 1 --ray-address local`: Ray Serve's own cost (the front, the handle hop)
  2, power of two  `--replicas 2`, [parallel] routing = "power_of_two"
  2, prefix-aware  `--replicas 2`, [parallel] routing = "prefix" (Ray's PrefixCacheAffinityRouter)
Workload: --num-prompts requests behind 8 system prompts (`--random-num-prefixes 8`, --prefix-len tokens each),
all arriving at once (or at --request-rate), exactly --output-len tokens each. The table gives throughput, TTFT
and the prefix-cache hit rate (cached prompt tokens / prompt tokens, from the servers' usage), and each peer's
throughput / 1 process. On one host the replicas share its cores (cores / replicas threads each); the hit rate
column is what the routing changes.

    .venv/bin/python bench/replicas.py --num-prompts 64 --rounds 3 --json replicas.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from inferplug.server.launch import start_serve

PEERS = [("1 process", [], None), ("1 replica (Ray)", ["--replicas", "1", "--ray-address", "local"], "prefix"),
         ("2, power of two", ["--replicas", "2"], "power_of_two"), ("2, prefix-aware", ["--replicas", "2"], "prefix")]


def start(profile: str, extra: list[str], routing: str | None, cache: str) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "INFERPLUG_CACHE__MEMORY": cache,
           **({"INFERPLUG_PARALLEL__ROUTING": routing} if routing else {})}
    return start_serve(profile, "--log-level", "warning", *extra, env=env, timeout=600)


def bench(base: str, args: argparse.Namespace, tokenizer: str | None, out: Path) -> dict:
    cmd = [sys.executable, "-m", "inferplug.cli", "bench", "--url", base + "/v1", "--num-prompts",
           str(args.num_prompts), "--random-input-len", str(args.input_len), "--random-output-len",
           str(args.output_len), "--random-prefix-len", str(args.prefix_len), "--random-num-prefixes", "8",
           "--request-rate", str(args.request_rate), "--ignore-eos", "--no-progress", "--seed", str(args.seed),
           "--save-result", str(out)]
    subprocess.run(cmd + (["--tokenizer", tokenizer] if tokenizer else []), check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="smollm2-135m")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--prefix-len", type=int, default=256, help="tokens of each of the 8 system prompts")
    parser.add_argument("--input-len", type=int, default=32, help="tokens after the system prompt")
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--request-rate", type=float, default=float("inf"),
                        help="mean requests/s (default: all at once)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of every peer; the table gives medians")
    parser.add_argument("--cache-memory", default="512MiB", help="KV cache of each replica (and of the 1 process)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    from inferplug.profile import load_profile
    from inferplug.sources import ensure_local

    tokenizer = str(ensure_local(load_profile(args.profile).model))
    runs: dict[str, list[dict]] = {name: [] for name, _, _ in PEERS}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):  # peers interleaved, so a noisy minute hits every peer alike
            for name, extra, routing in PEERS:
                proc, base = start(args.profile, extra, routing, args.cache_memory)
                try:
                    result = bench(base, args, tokenizer, Path(tmp) / "result.json")
                finally:
                    proc.terminate()
                    proc.communicate(timeout=120)
                runs[name].append({"output_throughput": result["output_throughput"],
                                   "ttft_ms_median": result["ttft_ms"]["median"],
                                   "prefix_cache_hit_rate": result["prefix_cache_hit_rate"], "failed": result["failed"]})
                print(f"round {round_ + 1}, {name}: done", file=sys.stderr, flush=True)
    rows = [{"peer": name, **{k: statistics.median(r[k] for r in results) for k in results[0]}}
            for name, results in runs.items()]
    base_tput = rows[0]["output_throughput"]
    print(f"medians of {args.rounds} round(s), {os.cpu_count()} cores")
    print(f"{'peer':<18} {'out tok/s':>10} {'x 1 proc':>9} {'TTFT p50 ms':>12} {'prefix hit':>11} {'failed':>7}")
    for r in rows:
        print(f"{r['peer']:<18} {r['output_throughput']:>10.1f} {r['output_throughput'] / base_tput:>9.2f} "
              f"{r['ttft_ms_median']:>12.0f} {r['prefix_cache_hit_rate']:>11.1%} {r['failed']:>7.0f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "cores": os.cpu_count(), "medians": rows,
                                               "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
