"""Prefill speed: time to first token (TTFT) and prefill tok/s for long prompts, ours against llama.cpp and OpenVINO
GenAI in the same run, one-stream decode, and the TPOT of running streams while a long prompt prefills.

Each engine gets the same random token-id prompts of --lengths tokens and generates one token (max_tokens=1), so
TTFT is the prefill. Every run changes the prompt's first token, so nothing comes from a prefix cache (ours,
OpenVINO's) or a kept context (llama.cpp, reset between runs too); a warm-up run of the shortest length goes first.
Then one greedy stream decodes --decode-tokens tokens (EOS ignored) after a 32-token prompt: decode tok/s is the
tokens after the first over the time after the first. --rounds runs every engine again, in the same order, so a
shared host's load falls on all of them. The table gives the best of --repeats runs and each row's rate over
llama.cpp's and OpenVINO's in the same round. Every engine runs --threads threads. Peers (--peers):
  ours       inferplug's in-process backend, one row per --profiles entry (default: fp16 weights, and int4)
  llama.cpp  llama-cpp-python on the same GGUF file, n_batch 512
  openvino   OpenVINO GenAI's LLMPipeline on --openvino-model, run by --openvino-python (bench/openvino_peer.py)

--streams N adds: N greedy streams decoding alone (their median TPOT), then the same with a
--stream-prompt-tokens prompt arriving among them (their mean TPOT while it prefills, and their longest gap: one
prefill chunk's step), for each --chunks size (the profile's limits.max_num_batched_tokens, set through
INFERPLUG_LIMITS__MAX_NUM_BATCHED_TOKENS) and each --caps value (limits.max_prefill_tokens_while_decoding: the
prefill tokens a step may carry beside decode rows; 0 none).

    .venv/bin/python bench/prefill.py --lengths 512,2048,8000 --json prefill-result.json
    .venv/bin/python bench/prefill.py --threads 2 --rounds 2 --repeats 1 --peers llama.cpp,openvino \
        --openvino-python /work/venv-ov/bin/python --openvino-model /work/tmp/smollm2-ov-int4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import time
from pathlib import Path

from inferplug.benchmark.machine import machine
from inferplug.benchmark.prefill_runs import ours_runner, prompt

THREADS = os.cpu_count() or 1
CHUNK_ENV = "INFERPLUG_LIMITS__MAX_NUM_BATCHED_TOKENS"  # the profile's limits.max_num_batched_tokens
CAP_ENV = "INFERPLUG_LIMITS__MAX_PREFILL_TOKENS_WHILE_DECODING"
THREADS_ENV = "INFERPLUG_NATIVE__NUM_THREADS"  # ours: the profile's native.num_threads
CONTEXT_ENV = "INFERPLUG_LIMITS__MAX_MODEL_LEN"  # ours: the default context (4096) is below the longest prompt
DECODE_PROMPT_TOKENS = 32
PEERS = ("llama.cpp", "openvino")
PEER_NAMES = {"llama_cpp": "llama.cpp", "openvino": "OpenVINO"}  # JSON key: engine names' prefix (and header)


class OpenVINOPeer:
    """The bench's side of OpenVINO GenAI: bench/openvino_peer.py (the protocol) running under `python` (the OpenVINO
    venv's) on `model_dir`. Started as a child process, not imported: it runs in that venv."""

    def __init__(self, python: str, model_dir: str, threads: int) -> None:
        worker = Path(__file__).with_name("openvino_peer.py")
        self.child = subprocess.Popen([python, str(worker), model_dir, str(threads)], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True)
        self.versions = self._reply()

    def generate(self, ids: list[int], max_tokens: int) -> tuple[list[float], int]:
        """Greedy, EOS ignored: each token's time (s) from the call's start, and the prompt tokens OpenVINO saw."""
        self.child.stdin.write(json.dumps({"ids": ids, "max_tokens": max_tokens}) + "\n")
        self.child.stdin.flush()
        reply = self._reply()
        return reply["times"], reply["prompt_tokens"]

    def close(self) -> None:
        self.child.stdin.close()  # the child's loop ends at EOF
        self.child.wait(timeout=60)

    def _reply(self) -> dict:
        line = self.child.stdout.readline()
        if not line:
            raise RuntimeError(f"the OpenVINO peer exited with code {self.child.wait()}: its stderr above says why")
        return json.loads(line)


def llama_cpp_runner(gguf, context: int, threads: int):
    """llama.cpp in this process, every call in a passing thread: its ggml shares torch's OpenMP runtime, and a pool
    left in this thread would slow our step thread's parallel regions (backends/passing_thread.py)."""
    from llama_cpp import Llama

    from inferplug.backends.passing_thread import in_a_passing_thread

    llm = in_a_passing_thread(lambda: Llama(model_path=str(gguf), n_ctx=context, n_threads=threads,
                                            n_threads_batch=threads, n_batch=512, verbose=False))

    def run(ids: list[int], max_tokens: int) -> tuple[list[float], int]:
        llm.reset()
        start, times = time.perf_counter(), []
        for _ in llm.generate(ids, temp=0.0):  # greedy; generate() itself never stops at EOS
            times.append(time.perf_counter() - start)
            if len(times) == max_tokens:
                break
        return times, llm.n_tokens - (max_tokens - 1)  # the last token was sampled, not evaluated

    return (lambda ids, max_tokens: in_a_passing_thread(lambda: run(ids, max_tokens))), llm.close


def measure(name: str, generate, lengths: list[int], repeats: int, decode_tokens: int, vocab: int, run0: int,
            round_: int) -> tuple[list[dict], list[dict]]:
    """Prefill rows (TTFT of a 1-token generation, best of `repeats`) and the one-stream decode row."""
    generate(prompt(min(lengths), run0, vocab), 1)  # warm-up: kernels built, pools touched
    rows, decode = [], []
    for length in lengths:
        runs = [generate(prompt(length, run0 + 1 + r, vocab), 1) for r in range(repeats)]
        times = [t[0] for t, _ in runs]
        best = min(times)
        rows.append({"engine": name, "round": round_, "prompt_tokens": length, "engine_prompt_tokens": runs[0][1],
                     "ttft_s": best, "ttft_s_all": times, "prefill_tok_s": length / best})
        print(f"{name:>28} {length:>6} tokens (engine counted {runs[0][1]}): TTFT {best:7.2f} s, "
              f"{length / best:7.1f} tok/s", flush=True)
    if decode_tokens:
        times, _ = generate(prompt(DECODE_PROMPT_TOKENS, run0 + 1 + repeats, vocab), decode_tokens)
        rate = (len(times) - 1) / (times[-1] - times[0])
        decode.append({"engine": name, "round": round_, "tokens": len(times), "decode_tok_s": rate})
        print(f"{name:>28} one-stream decode of {len(times)} tokens: {rate:7.1f} tok/s", flush=True)
    return rows, decode


def with_ratios(rows: list[dict], rate: str) -> list[dict]:
    """Each row's `rate` over llama.cpp's and OpenVINO's in the same round (and prompt length, for prefill)."""
    key = lambda r: (r["round"], r.get("prompt_tokens"))  # noqa: E731
    for peer, prefix in PEER_NAMES.items():
        base = {key(r): r[rate] for r in rows if r["engine"].startswith(prefix)}
        for r in rows:
            r[f"vs_{peer}"] = r[rate] / base[key(r)] if key(r) in base else None
    return rows


def table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """A markdown table of `columns` (header, key, format) plus the ratio columns."""
    ratio = lambda x: f"{x:.2f}x" if x else "n/a"  # noqa: E731
    lines = ["| " + " | ".join([h for h, _, _ in columns] + [f"/ {p}" for p in PEER_NAMES.values()]) + " |",
             "|---|" + "---:|" * (len(columns) - 1 + len(PEER_NAMES))]
    for r in rows:
        cells = ["n/a" if r[k] is None else format(r[k], f) for _, k, f in columns]
        lines.append("| " + " | ".join(cells + [ratio(r[f"vs_{p}"]) for p in PEER_NAMES]) + " |")
    return "\n".join(lines)


def decode_under_prefill(backend, profile: str, chunk: int, cap: int, args, vocab: int, run0: int) -> dict:
    alone = backend.run_sync(stream_tpot(backend, args.streams, args.stream_output_len, None, vocab))
    long_prompt = prompt(args.stream_prompt_tokens, run0 + chunk, vocab)
    busy = backend.run_sync(stream_tpot(backend, args.streams, args.stream_output_len, long_prompt, vocab))
    ratio = (busy["mean_during_prefill_ms"] or 0) / alone["median_ms"]
    print(f"{profile}, {chunk}-token chunks, {cap} beside decodes: {args.streams} streams' TPOT {alone['median_ms']:.1f} ms alone; while a "
          f"{args.stream_prompt_tokens}-token prompt prefills (TTFT {busy['prefill_s']:.2f} s): mean "
          f"{busy['mean_during_prefill_ms'] or 0:.1f} ms ({ratio:.2f}x), longest gap {busy['max_ms']:.1f} ms", flush=True)
    return {"profile": profile, "chunk_tokens": chunk, "prefill_cap_while_decoding": cap, "streams": args.streams,
            "prefill_tokens": args.stream_prompt_tokens, "alone": alone, "under_prefill": busy, "tpot_ratio": ratio}


async def stream_tpot(backend, streams: int, output_len: int, long_prompt: list[int] | None, vocab: int) -> dict:
    """The inter-token gaps (ms) of `streams` greedy streams after their first decode step: their median and max;
    with long_prompt, which arrives once they all decode, the mean of the gaps that end while it prefills."""
    from inferplug.types import Request, SamplingParams

    decoding = asyncio.Event()
    started, window = 0, []

    async def stream(i: int) -> list[tuple[float, float]]:
        nonlocal started
        request = Request(prompt=prompt(32, 10_000 + i, vocab), request_id=f"s{i}",
                          params=SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True))
        times = []
        async for event in backend.generate(request):
            if event.token_ids:
                times.append(time.perf_counter())
                started += len(times) == 2
                if started == streams:
                    decoding.set()
        return [(b, (b - a) * 1000) for a, b in zip(times[1:], times[2:])]

    async def long_request():
        await decoding.wait()
        window.append(time.perf_counter())
        request = Request(prompt=long_prompt, request_id="long", params=SamplingParams(temperature=0.0, max_tokens=1))
        async for _ in backend.generate(request):
            pass
        window.append(time.perf_counter())

    results = await asyncio.gather(*[stream(i) for i in range(streams)], *([long_request()] if long_prompt else []))
    gaps = [g for per in results[:streams] for g in per]
    during = [ms for end, ms in gaps if window and window[0] < end <= window[1] + 1e-3]
    return {"median_ms": statistics.median(ms for _, ms in gaps), "max_ms": max(ms for _, ms in gaps),
            "mean_during_prefill_ms": statistics.mean(during) if during else None,
            "prefill_s": window[1] - window[0] if window else None}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profiles", default="smollm2-135m,smollm2-135m-int4")
    parser.add_argument("--lengths", default="512,2048,8000", help="prompt lengths in tokens (SmolLM2's context: 8192)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1, help="run every engine this many times, in turn")
    parser.add_argument("--decode-tokens", type=int, default=128, help="one-stream decode length; 0 skips it")
    parser.add_argument("--threads", type=int, default=THREADS, help="every engine's threads")
    parser.add_argument("--peers", default="llama.cpp", help="comma-separated: llama.cpp, openvino; '' for ours alone")
    parser.add_argument("--openvino-python", help="the python of a venv with openvino-genai (bench/openvino_peer.py)")
    parser.add_argument("--openvino-model", help="the model exported by `optimum-cli export openvino`")
    parser.add_argument("--streams", type=int, default=0, help="also measure TPOT of N streams under a long prefill")
    parser.add_argument("--stream-prompt-tokens", type=int, default=4000)
    parser.add_argument("--chunks", default="512", help="prefill chunk sizes (tokens a step) for --streams")
    parser.add_argument("--caps", default="32", help="prefill tokens a step may carry beside decodes, for --streams")
    parser.add_argument("--stream-output-len", type=int, default=48)
    parser.add_argument("--json", default="prefill-result.json")
    args = parser.parse_args(argv)
    args.peers = [p for p in args.peers.split(",") if p]
    if unknown := sorted(set(args.peers) - set(PEERS)):
        parser.error(f"--peers: unknown {', '.join(unknown)}; choose from {', '.join(PEERS)}")
    try:
        args.lengths = [int(n) for n in args.lengths.split(",")]
    except ValueError:
        parser.error(f"--lengths {args.lengths!r}: give comma-separated token counts, e.g. 512,2048,8000")
    for flag, value, least in (("--lengths", min(args.lengths), 1), ("--repeats", args.repeats, 1),
                               ("--rounds", args.rounds, 1), ("--threads", args.threads, 1)):
        if value < least:
            parser.error(f"{flag} {value}: must be at least {least}")
    if args.decode_tokens == 1 or args.decode_tokens < 0:
        parser.error(f"--decode-tokens {args.decode_tokens}: a rate needs at least 2 tokens (0 skips decode)")
    if "openvino" in args.peers:
        if not (args.openvino_python and os.access(args.openvino_python, os.X_OK)):
            parser.error(f"--peers openvino needs --openvino-python: the python of a venv with openvino-genai "
                         f"(got {args.openvino_python!r}; bench/openvino_peer.py says how to make it)")
        if not (args.openvino_model and os.path.isfile(os.path.join(args.openvino_model, "openvino_model.xml"))):
            parser.error(f"--peers openvino needs --openvino-model: a dir with openvino_model.xml from "
                         f"`optimum-cli export openvino` (got {args.openvino_model!r})")
    return args


def context(args) -> int:
    """Every engine's context: the longest prompt, the decode's tokens and a margin."""
    return max(args.lengths) + args.decode_tokens + 16


def engines(args, gguf) -> list:
    """One opener per engine, in run order; each loads its engine and gives (name, generate, close)."""
    from inferplug.backends.registry import close_backend, get_backend
    from inferplug.benchmark.machine import version_of

    def ours(profile):  # closed and forgotten: the next get_backend loads afresh
        return lambda: (f"inferplug {profile}", ours_runner(get_backend(profile)), lambda: close_backend(profile))

    def llama_cpp():
        return (f"llama.cpp (llama-cpp-python {version_of('llama_cpp_python')})",
                *llama_cpp_runner(gguf, context(args), args.threads))

    def openvino():
        peer = OpenVINOPeer(args.openvino_python, args.openvino_model, args.threads)
        return f"OpenVINO GenAI {peer.versions['openvino_genai'].split('-')[0]}", peer.generate, peer.close

    openers = {"llama.cpp": llama_cpp, "openvino": openvino}
    return [ours(p) for p in args.profiles.split(",")] + [openers[p] for p in PEERS if p in args.peers]


def main() -> None:
    args = parse_args()
    os.environ[THREADS_ENV], os.environ[CONTEXT_ENV] = str(args.threads), str(context(args))

    from inferplug.backends.registry import close_backend, get_backend
    from inferplug.models.loader import load_tokenizer
    from inferplug.profile import load_profile
    from inferplug.sources import ensure_local

    gguf = ensure_local(load_profile(args.profiles.split(",")[0]).model)
    vocab = len(load_tokenizer(gguf))
    run0 = int(time.time()) % 10_000  # another first token than earlier runs of this bench, too
    results, decode, tpot = [], [], []
    for round_ in range(args.rounds):
        for open_engine in engines(args, gguf):
            name, generate, close = open_engine()
            try:
                rows, decoded = measure(name, generate, args.lengths, args.repeats, args.decode_tokens, vocab,
                                        run0 + 100 * round_, round_ + 1)
            finally:
                close()
            results += rows
            decode += decoded
    settings = [(int(c), int(k)) for c in args.chunks.split(",") if c for k in args.caps.split(",") if k]
    for profile in args.profiles.split(",") if args.streams else []:
        for chunk, cap in settings:
            os.environ[CHUNK_ENV], os.environ[CAP_ENV] = str(chunk), str(cap)
            backend = get_backend(profile)
            tpot.append(decode_under_prefill(backend, profile, chunk, cap, args, vocab, run0))
            close_backend(profile)
            del os.environ[CHUNK_ENV], os.environ[CAP_ENV]

    print("\n" + table(with_ratios(results, "prefill_tok_s"),
                       [("engine", "engine", ""), ("round", "round", "d"), ("prompt tokens", "prompt_tokens", "d"),
                        ("engine's count", "engine_prompt_tokens", ""), ("TTFT (s)", "ttft_s", ".2f"),
                        ("prefill tok/s", "prefill_tok_s", ".1f")]))
    if decode:
        print("\n" + table(with_ratios(decode, "decode_tok_s"),
                           [("engine", "engine", ""), ("round", "round", "d"), ("tokens", "tokens", "d"),
                            ("decode tok/s", "decode_tok_s", ".1f")]))
    with open(args.json, "w") as f:
        json.dump({"machine": machine(), "args": vars(args), "results": results, "decode": decode,
                   "tpot_under_prefill": tpot}, f, indent=2)


if __name__ == "__main__":
    main()
