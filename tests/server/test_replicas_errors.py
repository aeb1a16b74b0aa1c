"""Bad input for `serve --replicas`: each a one-line error and exit code 2, before any model loads."""

from __future__ import annotations

import json
import subprocess
import sys

from inferplug.server.launch import free_port


def serve(*args: str, hide_ray: bool = False) -> subprocess.CompletedProcess:
    # hide_ray: an install without the extra, simulated by making `import ray` fail in that process
    hide = "sys.modules['ray'] = None; " if hide_ray else ""
    code = f"import sys; {hide}from inferplug.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, "serve", *args], capture_output=True, text=True, timeout=120)


def one_line_error(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("inferplug: error: "), result.stderr
    return lines[0]


def test_replicas_without_ray_name_the_extra():
    error = one_line_error(serve("--replicas", "2", hide_ray=True))
    assert "replicas = 2 runs on Ray Serve, which is not installed" in error and "pip install 'inferplug[ray]'" in error


def test_unreachable_ray_address():
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    error = one_line_error(serve("--replicas", "2", "--ray-address", address))
    assert f"cannot reach the Ray cluster at {address}" in error and "ray start --head" in error
    error = one_line_error(serve("--replicas", "2", "--ray-address", "not an address"))
    assert "is not host:port" in error


def test_replicas_must_be_positive():
    result = serve("--replicas", "0")
    assert result.returncode == 2 and "'0' is not a whole number >= 1" in result.stderr


def test_routing_text_is_what_a_prefix_is_matched_on():
    from inferplug.server.replica_front import routing_text

    chat = {"messages": [{"role": "system", "content": "be brief"},
                         {"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    assert routing_text(json.dumps(chat).encode()) == "be briefhi"
    assert routing_text(b'{"prompt": "once upon"}') == "once upon"
    assert routing_text(b'{"prompt": [[1, 2, 3], [4]]}') == "1 2 3"
    assert routing_text(b"not json") == routing_text(b"[1]") == ""
    assert routing_text(b'{"messages": ' + b"[" * 50_000) == ""  # too deep to parse: the replica answers 400
