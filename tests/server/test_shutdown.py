"""SIGTERM stops `inferplug serve` within its grace, however much work is in flight: the requests still running
after [server] shutdown_grace_s are aborted (their blocks freed) and the process exits."""

from __future__ import annotations

import contextlib
import signal
import threading
import time

import httpx
import pytest

from inferplug.server.launch import start_serve

pytestmark = pytest.mark.slow


def test_sigterm_with_a_huge_request_in_flight_exits_within_the_grace(tmp_path, tiny_llama_dir):
    profile = tmp_path / "tiny.toml"
    profile.write_text(f'name = "tiny"\nbackend = "native"\ndtype = "float32"\n[model]\npath = "{tiny_llama_dir}"\n'
                       'served_name = "tiny"\n')
    proc, base = start_serve(str(profile), "--max-prompts", "2000", "--max-total-tokens", "100000000",
                             "--shutdown-grace-s", "1")
    try:
        huge = {"model": "tiny", "prompt": [[1, 2, 3]] * 2000, "max_tokens": 400, "ignore_eos": True}
        def send() -> None:
            with contextlib.suppress(httpx.TransportError):  # the server goes away under it: that is the test
                httpx.post(base + "/v1/completions", json=huge, timeout=600)

        thread = threading.Thread(target=send, daemon=True)
        thread.start()
        deadline = time.monotonic() + 60
        while "inferplug_num_requests_running 0.0" in httpx.get(base + "/metrics").text:
            assert time.monotonic() < deadline, "the huge request never started"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        output = proc.communicate(timeout=90)[0]  # a bound for a hang: 800k tokens were still to generate
    finally:
        if proc.poll() is None:
            proc.kill()
    print(f"\nexited {time.monotonic() - stopped:.1f} s after SIGTERM")
    assert proc.returncode is not None and "graceful shutdown exceeded" in output
