"""A short real benchmark on a tiny model: in-process, and over HTTP against `inferplug serve`.

These assert the JSON schema and that every request completed, never a speed.
"""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from inferplug.commands import bench
from tests.benchmark.bench_helpers import free_port, parse

LATENCY_KEYS = {"mean", "median", "p90", "p99"}
TOP_KEYS = {
    "target", "num_prompts", "request_rate", "burstiness", "max_concurrency", "seed", "goodput_slos_ms",
    "completed", "failed", "duration_s", "total_input_tokens", "total_output_tokens", "request_throughput",
    "output_throughput", "total_token_throughput", "goodput", "prefix_cache_hit_rate", "ttft_ms", "tpot_ms",
    "itl_ms", "e2el_ms", "backend_stats", "input_lens", "output_lens", "ttfts", "itls", "errors",
}


def check_result(data: dict, num_prompts: int, output_len: int) -> None:
    assert TOP_KEYS <= set(data)
    assert data["completed"] == num_prompts and data["failed"] == 0 and data["errors"] == []
    assert data["output_lens"] == [output_len] * num_prompts  # --ignore-eos: exactly as asked
    assert data["total_output_tokens"] == output_len * num_prompts
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        assert set(data[key]) == LATENCY_KEYS and all(v >= 0 for v in data[key].values())
    assert data["ttft_ms"]["median"] <= data["e2el_ms"]["median"]
    assert 0.0 <= data["prefix_cache_hit_rate"] <= 1.0
    assert len(data["ttfts"]) == len(data["itls"]) == num_prompts


def test_in_process_bench(tiny_profile, tmp_path):
    out = tmp_path / "result.json"
    argv = [tiny_profile, "--num-prompts", "6", "--random-input-len", "24", "--random-output-len", "8",
            "--random-prefix-len", "32", "--ignore-eos", "--request-rate", "40", "--burstiness", "0.5",
            "--max-concurrency", "4", "--goodput", "ttft:600000", "--save-result", str(out), "--no-progress"]
    assert bench.run(parse(*argv)) == 0
    data = json.loads(out.read_text())
    check_result(data, 6, 8)
    assert data["request_rate"] == 40 and data["max_concurrency"] == 4
    assert data["input_lens"] == [56] * 6  # 32 shared + 24 own tokens, sent as token ids
    assert data["goodput"] == pytest.approx(data["request_throughput"])  # a 10-minute TTFT SLO: all good


def test_rate_sweep_writes_json_and_plot(tiny_profile, tmp_path):
    out = tmp_path / "sweep.json"
    argv = [tiny_profile, "--num-prompts", "3", "--random-input-len", "8", "--random-output-len", "4",
            "--ignore-eos", "--sweep-rates", "20,inf", "--save-result", str(out), "--no-progress"]
    assert bench.run(parse(*argv)) == 0
    sweep = json.loads(out.read_text())["sweep"]
    assert [run["request_rate"] for run in sweep] == [20, "inf"]
    for run in sweep:
        check_result(run, 3, 4)
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"


def wait_for_port(port: int, proc: subprocess.Popen, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"inferplug serve exited: {proc.stdout.read()}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError("inferplug serve did not start")


def test_url_bench_against_inferplug_serve(tiny_profile, tiny_llama_dir, tmp_path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "inferplug.cli", "serve", tiny_profile, "--port", str(port),
                             "--log-level", "warning"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=os.environ.copy())
    try:
        wait_for_port(port, proc)
        out = tmp_path / "url.json"
        argv = ["--url", f"http://127.0.0.1:{port}", "--tokenizer", str(tiny_llama_dir), "--num-prompts", "4",
                "--random-input-len", "16", "--random-output-len", "6", "--ignore-eos", "--save-result", str(out),
                "--no-progress"]
        assert bench.run(parse(*argv)) == 0
        data = json.loads(out.read_text())
        check_result(data, 4, 6)
        assert data["target"] == f"openai:tiny@http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
