"""`inferplug serve PROFILE` as a user runs it: a subprocess on loopback, with and without a key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from inferplug.server.launch import start_serve

pytestmark = pytest.mark.slow


def write_profile(tmp_path: Path, model_dir: Path) -> Path:
    path = tmp_path / "tiny-ct2.toml"
    path.write_text(
        'backend = "ctranslate2"\n'
        f'[model]\npath = "{model_dir}"\nserved_name = "tiny"\n'
        '[ctranslate2]\ncompute_type = "float32"\ndevice = "cpu"\n'
    )
    return path


def serve(profile: Path, *args: str) -> tuple[subprocess.Popen, str]:
    return start_serve(str(profile), *args)


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


def test_a_taken_port_is_a_one_line_error_before_the_model_loads(tmp_path, tiny_llama_dir):
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        result = subprocess.run([sys.executable, "-m", "inferplug.cli", "serve",
                                 str(write_profile(tmp_path, tiny_llama_dir)), "--port", str(port)],
                                capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in result.stderr
    assert "--port" in result.stderr and "serving" not in result.stdout  # it never announced an address


def test_a_port_claimed_by_a_server_still_loading_is_refused_too():
    """Bound and listening at once: a second serve started beside one still loading its model fails at once."""
    from inferplug.commands.serve import listening_sockets
    from inferplug.errors import ServeError

    first = listening_sockets("127.0.0.1", 0)
    try:
        with pytest.raises(ServeError, match="pick another with --port"):
            listening_sockets("127.0.0.1", first[0].getsockname()[1])
    finally:
        for sock in first:
            sock.close()
    result = subprocess.run([sys.executable, "-m", "inferplug.cli", "serve", "--port", "70000"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "70000 is not a port: use 0 to 65535" in result.stderr
