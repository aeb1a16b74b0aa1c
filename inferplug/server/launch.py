"""`inferplug serve` as a child process on a free loopback port, handed back once it answers /health: what the
serving tests and the bench/ scripts start."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_serve(profile: str, *args: str, env: Mapping[str, str] | None = None,
                timeout: float = 180.0) -> tuple[subprocess.Popen, str]:
    """(the process, its base URL). Its output is piped (text); RuntimeError with that output if it never answers."""
    import httpx

    port = free_port()
    cmd = [sys.executable, "-m", "inferplug.cli", "serve", profile, "--port", str(port), *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(env if env is not None else os.environ))
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return proc, base
        except httpx.TransportError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"inferplug serve {profile} {' '.join(args)} did not come up:\n{proc.communicate()[0]}")
