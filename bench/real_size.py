"""Real-size models: inferplug and llama.cpp on the same 7B-geometry files, the same threads, in the same run.

Writes random models at Llama/Mistral-7B geometry (inferplug/benchmark/real_size_files.py: 32 layers, width 4096, 32
heads, 8 KV heads, MLP 14336; SmolLM2's tokenizer, so vocab 49152): a Q4_K_M-style GGUF, an AutoAWQ GEMM and a GPTQ
act-order checkpoint (4-bit, group 128). llama.cpp runs the GGUF; --formats picks inferplug's rows. Each engine runs
in its own subprocess (bench/real_size_engines.py) twice:
  cold   the model's files (and inferplug's INFERPLUG_HOME) dropped from the page cache first; load only
  warm   the files read into the page cache first (inferplug's: the GGUF and the conversion entries its cold load
         used); load, then 512-token prefill, one-stream decode, --streams streams (8) at once
and its peak RSS (VmHWM) is sampled from outside, so an out-of-memory kill still leaves a row. inferplug loads
the way a user's code does: get_backend(a profile TOML written next to the file) with [native] num_threads,
limits.max_model_len = llama.cpp's n_ctx per sequence, and a KV cache of the same number of tokens
(context x streams); `inferplug resolve --json`'s memory plan is shown beside the measured peak. llama.cpp:
n_threads = --threads, n_batch 512, one context of --streams sequences. The AWQ and GPTQ rows are compared to
llama.cpp on the GGUF. `step GiB` is the bytes one decode step reads (inferplug: its weights as
loaded; llama.cpp: the file's, the embedding aside), `decode / bw` one-stream decode over the bound those bytes and
the memory bandwidth set (bandwidth as `doctor --bench` measures it, before and after each engine's warm run; `bw` is
the median of a round's samples, the same for both engines). Medians throughout.

    .venv/bin/python bench/real_size.py --layers 4 --formats gguf,awq,gptq
    .venv/bin/python bench/real_size.py --layers 4 --formats gguf --gguf-mix Q5_K_M
    .venv/bin/python bench/real_size.py --formats gguf,awq --json real-size-7b.json     # ~4 GB a file
    .venv/bin/python bench/real_size.py --geometry qwen3-8b --formats gguf               # Qwen3-8B, ~4.7 GB
    .venv/bin/python bench/real_size.py --geometry gpt-oss-20b --formats gguf            # gpt-oss-20b, ~12 GB
    .venv/bin/python bench/real_size.py --geometry gemma4-26b-a4b --layers 12 --formats gguf  # ~7 GB
    .venv/bin/python bench/real_size.py --geometry qwen35-9b --formats gguf  # Qwen3.5's hybrid stack, ~5.6 GB
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from inferplug.benchmark.machine import machine
from inferplug.benchmark.real_size_files import GEOMETRIES, GGUF_MIXES, decode_bytes, ensure_model, files_of
from inferplug.benchmark.real_size_workload import Workload
from inferplug.memory_plan import PROMISED_PARTS

BENCH = Path(__file__).resolve().parent
GIB = 2**30


def profile_toml(model: Path, fmt: str, w: Workload, cache_bytes: int | None) -> Path:
    """The profile a user would write for this file; the KV cache sized once resolve has said its bytes/token."""
    path = model.with_name(model.name + ".toml")
    cache = f'memory = "{cache_bytes}B"' if cache_bytes else 'memory = "1GiB"'
    path.write_text(f'name = "{model.name}"\nbackend = "native"\n\n[model]\npath = "{model}"\n\n'
                    f'[quantization]\nformat = "{fmt}"\n\n[cache]\n{cache}\n\n[limits]\nmax_model_len = {w.context}\n'
                    f'max_num_seqs = {w.streams}\nmax_num_batched_tokens = 512\n\n[native]\nnum_threads = {w.threads}\n')
    return path


def resolve_json(toml: Path, env: dict) -> dict:
    out = subprocess.run([sys.executable, "-m", "inferplug.cli", "resolve", str(toml), "--json"], env=env,
                         capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"inferplug resolve failed: {out.stderr.strip()[-500:] or out.stdout[-500:]}")
    return json.loads(out.stdout)


def inferplug_profile(model: Path, fmt: str, w: Workload, env: dict) -> tuple[Path, dict]:
    """The TOML and resolve's plan, with the KV pool holding context x streams tokens (what llama.cpp's context
    holds)."""
    first = resolve_json(profile_toml(model, fmt, w, None), env)["memory"]
    toml = profile_toml(model, fmt, w, first["kv_bytes_per_token"] * w.context * w.streams)
    return toml, resolve_json(toml, env)


def drop_page_cache(paths: list[Path]) -> int:
    """posix_fadvise(DONTNEED) on each file (this process's files only, not the machine's caches): the bytes
    still resident after, by fincore."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", *map(str, paths)],
                         capture_output=True, text=True)
    return sum(int(x) for x in out.stdout.split()) if out.returncode == 0 else -1


def read_into_page_cache(paths: list[Path]) -> None:
    for p in paths:
        with open(p, "rb") as f:
            while f.read(64 << 20):
                pass


def run_child(engine: str, model: Path, w: Workload, load_only: bool, env: dict, log: Path, timeout: float,
              max_rss_gib: float | None) -> dict:
    """The engine's stages as it reported them, plus its peak RSS sampled from outside and how it ended."""
    max_rss = (max_rss_gib or 0.85 * _available_gib()) * GIB
    cmd = [sys.executable, str(BENCH / "real_size_engines.py"), engine, str(model), "--workload",
           json.dumps(asdict(w))] + (["--load-only"] if load_only else [])
    with open(log, "a") as err:
        err.write(f"\n$ {' '.join(cmd)}\n")
        err.flush()
        child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        status, peak, start, stopped = Path(f"/proc/{child.pid}/status"), 0, time.monotonic(), None
        while child.poll() is None:
            try:
                fields = dict(x.split(":", 1) for x in status.read_text().splitlines() if ":" in x)
                peak, rss = max(peak, int(fields["VmHWM"].split()[0]) * 1024), int(fields["VmRSS"].split()[0]) * 1024
            except (OSError, KeyError):
                rss = 0
            if rss > max_rss:  # the bench stops it first: an OOM kill on a shared machine may hit another process
                stopped = f"stopped by the bench at RSS {rss / GIB:.1f} GiB (max RSS {max_rss / GIB:.1f} GiB)"
            elif time.monotonic() - start > timeout:
                stopped = f"stopped by the bench after --timeout {timeout:.0f} s"
            if stopped:
                child.kill()
                child.wait()
                break
            time.sleep(0.2)
        out = child.stdout.read()
        err.write(out)  # the stages' lines too, so the log holds everything the engine reported
    stages = {}
    for line in out.splitlines():
        if line.startswith("RESULT "):
            data = json.loads(line[len("RESULT "):])
            stages[data.pop("stage")] = data
    if stopped:
        stages["error"] = {"error": stopped}
    elif child.returncode < 0 and "error" not in stages:
        why = " (SIGKILL: the kernel's OOM killer)" if child.returncode == -9 else ""
        stages["error"] = {"error": f"killed by signal {-child.returncode}{why}"}
    elif child.returncode and "error" not in stages:
        stages["error"] = {"error": f"exit code {child.returncode}; see {log}"}
    return {"stages": stages, "peak_rss_sampled": peak, "returncode": child.returncode}


def measure(engine: str, fmt: str, model: Path, w: Workload, args) -> dict:
    """One engine's row: a cold load, then the warm run, with the memory bandwidth measured around it."""
    from inferplug.selftest import memory_bandwidth

    env = dict(os.environ)
    row: dict = {"format": fmt, "engine": engine, "model": str(model)}
    target, files, home = model, files_of(model), args.dir / "inferplug-home"
    if engine == "inferplug":
        env["INFERPLUG_HOME"] = str(home)
        try:
            target, plan = inferplug_profile(model, fmt, w, env)
        except RuntimeError as exc:
            return row | {"error": str(exc)}
        row["resolve"] = {k: plan.get(k) for k in ("backend", "dtype", "weight_format", "num_kv_blocks")}
        row["resolve"]["memory"] = plan["memory"]
        row["promised_bytes"] = sum(plan["memory"][k] for k in PROMISED_PARTS)
        files += files_of(home)
    log = args.dir / f"{model.name}.{engine}.log"
    print(f"{fmt} / {engine}: cold load ...", flush=True)
    row["resident_before_cold"] = drop_page_cache(files)
    cold_start = time.time()
    row["cold"] = run_child(engine, target, w, True, env, log, args.timeout, args.max_rss_gib)
    print(f"{fmt} / {engine}: warm run ...", flush=True)
    # the model's files and the conversion entries the cold load used (a hit touches its entry, the cache's LRU
    # order; listed after the load, which may have converted and evicted others): the weights inferplug maps come
    # from those, and an entry left out of the page cache (the peer's 9 GB pushes it out) is read from disk during
    # the first prefill, which then ran 30% slower
    used = [p for p in files_of(home) if p.stat().st_mtime >= cold_start - 1] if engine == "inferplug" else []
    read_into_page_cache(files_of(model) + used)
    before = memory_bandwidth("cpu", 2.0)  # just before and after: the machine is shared, its bandwidth varies
    row["warm"] = run_child(engine, target, w, False, env, log, args.timeout, args.max_rss_gib)
    row["bandwidth_samples"] = [before, memory_bandwidth("cpu", 2.0)]
    row["loadavg_after"] = os.getloadavg()  # the machine is shared: how busy it was
    facts = row["warm"]["stages"].get("load") or row["cold"]["stages"].get("load") or {}
    row["decode_step_bytes"] = decode_bytes(model) if engine == "llama.cpp" else facts.get("decode_weight_bytes")
    errors = [r["stages"]["error"]["error"] for r in (row["cold"], row["warm"]) if "error" in r["stages"]]
    row["error"] = "; ".join(dict.fromkeys(errors)) or None
    return row


def bound_by_round(rows: list[dict]) -> None:
    """Each row's one-stream decode against the bound its step's bytes and the round's bandwidth set: the median of
    every sample the round took (two an engine), one figure for both engines. Each engine's own two samples moved
    by up to 1.4x between the engines of one round on this shared host, more than the engines' fractions differ."""
    for round_ in {r["round"] for r in rows}:
        members = [r for r in rows if r["round"] == round_]
        samples = [b for r in members for b in r.get("bandwidth_samples", ())]  # none where a row failed early
        if not samples:
            continue
        bandwidth = statistics.median(samples)
        for r in members:
            decode, step_bytes = _stage(r, "warm", "decode", "decode_tok_s"), r.get("decode_step_bytes")
            r["memory_bandwidth_bytes_per_s"] = bandwidth
            r["bandwidth_fraction"] = decode * step_bytes / bandwidth if decode and step_bytes else None


COLUMNS = [  # (title, figure of a row, format); the ratio rows are inferplug's figure / llama.cpp's
    ("load cold s", lambda r: _stage(r, "cold", "load", "load_s"), "{:.1f}"),
    ("1st token cold s", lambda r: _stage(r, "cold", "load", "first_token_s"), "{:.1f}"),
    ("load warm s", lambda r: _stage(r, "warm", "load", "load_s"), "{:.1f}"),
    ("peak RSS GiB", lambda r: _peak(r) / GIB or None, "{:.2f}"),
    ("resolve GiB", lambda r: r["promised_bytes"] / GIB if r.get("promised_bytes") else None, "{:.2f}"),
    ("prefill tok/s", lambda r: _stage(r, "warm", "prefill", "prefill_tok_s"), "{:.1f}"),
    ("decode tok/s", lambda r: _stage(r, "warm", "decode", "decode_tok_s"), "{:.2f}"),
    ("streams tok/s", lambda r: _stage(r, "warm", "streams", "throughput_tok_s"), "{:.2f}"),
    ("step GiB", lambda r: (r.get("decode_step_bytes") or 0) / GIB or None, "{:.2f}"),
    ("bw GB/s", lambda r: (r.get("memory_bandwidth_bytes_per_s") or 0) / 1e9 or None, "{:.1f}"),
    ("decode / bw", lambda r: r.get("bandwidth_fraction"), "{:.0%}"),
]


def _peak(row: dict) -> int:
    """The warm run's VmHWM: the child's own last reading, or the parent's samples where it died first."""
    warm = row.get("warm", {})
    return max(warm.get("peak_rss_sampled", 0), (_stage(row, "warm", "end", "rss") or {}).get("VmHWM", 0))


def _stage(row: dict, run: str, stage: str, key: str):
    return row.get(run, {}).get("stages", {}).get(stage, {}).get(key)


def table(rows: list[dict]) -> str:
    """Each row, and under each inferplug row its ratios to the llama.cpp row of the same round."""
    lines = ["| round | format | engine | " + " | ".join(t for t, _, _ in COLUMNS) + " | failure |",
             "|---|---|---|" + "---:|" * len(COLUMNS) + "---|"]
    for r in rows:
        cells = [("n/a" if (v := get(r)) is None else fmt.format(v)) for _, get, fmt in COLUMNS]
        lines.append(f"| {r['round']} | {r['format']} | {r['engine']} | " + " | ".join(cells) + f" | {r.get('error') or ''} |")
        if (ratios := _ratios(r, rows)) is not None:
            cells = [f"{x:.2f}x" if x else "" for x in ratios]
            lines.append(f"| {r['round']} | {r['format']} | / llama.cpp gguf | " + " | ".join(cells) + " | |")
    return "\n".join(lines)


def _ratios(row: dict, rows: list[dict]) -> list[float | None] | None:
    """An inferplug row's figures over its round's llama.cpp row's (None: a llama.cpp row, or no peer that round)."""
    peer = next((r for r in rows if r["engine"] == "llama.cpp" and r["round"] == row["round"]), None)
    if row["engine"] == "llama.cpp" or peer is None:
        return None
    return [a / b if (a := get(row)) and (b := get(peer)) and title != "bw GB/s" else None for title, get, _ in COLUMNS]


def paired_summary(rows: list[dict]) -> str:
    """Over the rounds, each ratio's median (min-max), paired within a round: this shared host's speed drifts by
    tens of percent between runs minutes apart, more than the engines differ, and a round's two rows share its
    drift. `streams / its 1` is the --streams streams' tokens over wall time against llama.cpp's one-stream decode."""
    lines = ["| format | " + " | ".join(t for t, _, _ in COLUMNS) + " | streams / its 1 |",
             "|---|" + "---:|" * (len(COLUMNS) + 1)]
    for fmt in dict.fromkeys(r["format"] for r in rows if r["engine"] != "llama.cpp"):
        per_round = []
        for row in (r for r in rows if r["engine"] != "llama.cpp" and r["format"] == fmt):
            ratios = _ratios(row, rows)
            peer = next((r for r in rows if r["engine"] == "llama.cpp" and r["round"] == row["round"]), None)
            if ratios is None or peer is None:
                continue
            streams, one = _stage(row, "warm", "streams", "throughput_tok_s"), _stage(peer, "warm", "decode", "decode_tok_s")
            per_round.append(ratios + [streams / one if streams and one else None])
        cells = []
        for column in zip(*per_round):
            values = sorted(v for v in column if v)
            cells.append(f"{statistics.median(values):.2f}x ({values[0]:.2f}-{values[-1]:.2f})" if values else "")
        lines.append(f"| {fmt} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _available_gib() -> float:
    line = next(x for x in Path("/proc/meminfo").read_text().splitlines() if x.startswith("MemAvailable"))
    return int(line.split()[1]) * 1024 / GIB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=Path("/work/tmp-realsize"))
    parser.add_argument("--geometry", choices=sorted(GEOMETRIES), default="llama-7b",
                        help="llama-7b: Llama/Mistral-7B; qwen3-8b: Qwen3-8B (QK-norm, vocabulary 151,936); "
                        "qwen3-30b-a3b, gpt-oss-20b: MoE (gpt-oss in MXFP4 and Q8_0, its files' mix)")
    parser.add_argument("--layers", type=int, default=None, help="fewer layers than the geometry's")
    parser.add_argument("--formats", default="gguf,awq,gptq")
    parser.add_argument("--gguf-mix", choices=GGUF_MIXES, default="Q4_K_M", help="the GGUF's llama.cpp mix")
    parser.add_argument("--engines", default="llama.cpp,inferplug")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--context", type=int, default=1024, help="tokens per sequence (max_model_len, n_ctx/seq)")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--prefill-tokens", type=int, default=512)
    parser.add_argument("--decode-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3, help="prefill runs (their median)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="the engines in turn this many times; ratios paired within a round, their median reported")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per engine subprocess")
    parser.add_argument("--max-rss-gib", type=float, default=None,
                        help="stop an engine whose RSS passes this (default: 85%% of the memory available as it starts)")
    parser.add_argument("--json", default="real-size-result.json")
    args = parser.parse_args()

    import torch

    from inferplug.benchmark.machine import default_model
    from inferplug.kernels.cpu import ops

    tokenizer_gguf = default_model()
    geometry = GEOMETRIES[args.geometry]
    geometry = dataclasses.replace(geometry, layers=args.layers or geometry.layers)
    w = Workload(context=args.context, threads=args.threads, vocab=geometry.vocab, prefill_tokens=args.prefill_tokens,
                 decode_tokens=args.decode_tokens, streams=args.streams, repeats=args.repeats)
    engines = args.engines.split(",")
    runs = [("llama.cpp", "gguf")] * ("llama.cpp" in engines) + [("inferplug", f) for f in args.formats.split(",")
                                                                  if f and "inferplug" in engines]
    models = {fmt: ensure_model(args.dir, fmt, geometry, tokenizer_gguf, args.gguf_mix) for fmt in dict.fromkeys(f for _, f in runs)}
    torch.set_num_threads(args.threads)  # memory_bandwidth (what `inferplug doctor --bench` measures) reads with these
    if "inferplug" in engines:
        ops()  # the C++ kernels are built now, not inside the first load
    rows: list[dict] = []
    for round_ in range(1, args.rounds + 1):  # the JSON is rewritten after each row: a stopped run keeps what it measured
        for engine, fmt in runs:
            rows.append(measure(engine, fmt, models[fmt], w, args) | {"round": round_})
            bound_by_round(rows)
            Path(args.json).write_text(json.dumps({"machine": machine(), "args": {k: str(v) for k, v in vars(args).items()},
                                                   "geometry": asdict(geometry), "workload": asdict(w), "rows": rows,
                                                   "table": table(rows), "paired": paired_summary(rows)}, indent=2))
    print(f"\n{geometry.layers} layers, {args.threads} threads, context {args.context} x {args.streams} streams\n")
    print(table(rows))
    if args.rounds > 1:
        print(f"\nPaired over {args.rounds} rounds, inferplug / llama.cpp: median (min-max)\n")
        print(paired_summary(rows))

if __name__ == "__main__":
    main()
