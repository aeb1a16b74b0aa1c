"""Replica mode's exposure (issue 29): a local Ray listens on loopback only, `resolve` says so, and the API key
reaches the replicas in their environment, never in the deployment's arguments. The bind is checked on a real local
Ray (started in a subprocess, so its state and environment stay out of this process) by reading which addresses its
processes listen on from /proc."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")

from inferplug.profile import Profile  # noqa: E402
from inferplug.server.app import API_KEY_ENV  # noqa: E402
from inferplug.replica_plan import describe  # noqa: E402
from inferplug.server.replicas import RayConnection, deployment_options  # noqa: E402

KEY = "replica-secret-key"

# Runs in the subprocess: start the local Ray as `inferplug serve` does, print what its processes listen on, stop it.
LISTENERS = r'''
import json, os, sys
from pathlib import Path
from inferplug.server.replicas import connect

def descendants(root):
    parents = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                parents[int(proc.name)] = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    found, frontier = set(), {root}
    while frontier:
        found |= frontier
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
    return found

def socket_inodes(pids):
    inodes = set()
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                link = os.readlink(fd)
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        except OSError:
            pass
    return inodes

def listening(inodes):
    out = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                out.append(fields[1].split(":")[0])
    return out

connection = connect(2, "local")
try:
    print(json.dumps(listening(socket_inodes(descendants(os.getpid())))))
finally:
    connection.close()
'''
LOOPBACK_HEX = {"0100007F", "0000000000000000FFFF00000100007F", "00000000000000000000000001000000"}  # v4, v4-in-v6, ::1


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads listening sockets from Linux's /proc")
def test_a_local_ray_listens_on_loopback_only(tmp_path):
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("RAY_")}
    done = subprocess.run([sys.executable, "-c", LISTENERS], capture_output=True, text=True, timeout=240, env=env,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    addresses = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(addresses) >= 3  # the GCS, the raylet and a worker at least
    assert set(addresses) <= LOOPBACK_HEX, addresses


def test_the_api_key_goes_in_the_replicas_environment_not_their_arguments():
    from inferplug.server.replica_engine import EngineReplica

    profile = Profile(name="p", model={"path": "/m.gguf"}, parallel={"replicas": 2})
    options, replica_profile = deployment_options(RayConnection(None, 4.0), profile, KEY)
    assert options["ray_actor_options"]["runtime_env"] == {"env_vars": {API_KEY_ENV: KEY}}
    assert "api_key" not in inspect.signature(EngineReplica.__init__).parameters  # nothing to bind it to
    assert KEY not in replica_profile.model_dump_json() and replica_profile.native.num_threads == 2
    options, _ = deployment_options(RayConnection("10.0.0.1:6379", 0.0), profile, None)
    assert "runtime_env" not in options["ray_actor_options"]


def test_resolve_says_where_ray_listens(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    profile = Profile(name="p", model={"path": "/m.gguf"}, parallel={"replicas": 2})
    assert "local Ray bound to loopback (127.0.0.1) only" in describe(profile)
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert "the Ray cluster at 10.0.0.1:6379" in describe(profile)
