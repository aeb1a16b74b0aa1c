"""`inferplug serve PROFILE` as a user runs it: a subprocess on loopback, with and without a key."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_profile(tmp_path: Path, model_dir: Path) -> Path:
    path = tmp_path / "tiny-ct2.toml"
    path.write_text(
        'backend = "ctranslate2"\n'
        f'[model]\npath = "{model_dir}"\nserved_name = "tiny"\n'
        '[ctranslate2]\ncompute_type = "float32"\ndevice = "cpu"\n'
    )
    return path


def serve(profile: Path, *args: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "inferplug.cli", "serve", str(profile), "--port", str(port), *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=os.environ.copy())
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(base + "/health", timeout=1).status_code == 200:
                return proc, base
        except httpx.TransportError:
            time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"inferplug serve did not come up:\n{proc.communicate()[0]}")


def stop(proc: subprocess.Popen) -> str:
    proc.terminate()
    return proc.communicate(timeout=60)[0]


def test_serve_binds_loopback_and_answers(tmp_path, tiny_llama_dir):
    proc, base = serve(write_profile(tmp_path, tiny_llama_dir))
    try:
        assert httpx.get(base + "/v1/models").json()["data"][0]["id"] == "tiny"
        reply = httpx.post(base + "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 3,
                                                          "temperature": 0, "ignore_eos": True}, timeout=60).json()
        # ignore_eos: exactly max_tokens come back, so a server that generates nothing fails here
        assert reply["usage"]["completion_tokens"] == 3 and reply["choices"][0]["finish_reason"] == "length"
        assert reply["usage"]["prompt_tokens"] == 2 and "prompt_tokens_details" in reply["usage"]  # "h", "i" bytes
    finally:
        output = stop(proc)
    assert "http://127.0.0.1:" in output


def test_serve_with_api_key(tmp_path, tiny_llama_dir):
    proc, base = serve(write_profile(tmp_path, tiny_llama_dir), "--api-key", "let-me-in")
    try:
        assert httpx.get(base + "/v1/models").status_code == 401
        ok = httpx.get(base + "/v1/models", headers={"Authorization": "Bearer let-me-in"})
        assert ok.status_code == 200
    finally:
        output = stop(proc)
    assert "let-me-in" not in output


def test_unknown_profile_is_a_one_line_error():
    result = subprocess.run([sys.executable, "-m", "inferplug.cli", "serve", "no-such-profile"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "unknown profile" in result.stderr
