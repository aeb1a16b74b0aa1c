"""What the resolver and `inferplug doctor` say about [parallel] replicas > 1 without starting Ray: is Ray
Serve installed, which request router it offers, is a cluster address reachable. The serving itself is
server/replicas.py's.
"""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from inferplug.errors import BackendUnavailable, ProfileError

if TYPE_CHECKING:
    from inferplug.profile import Profile

INSTALL = "pip install 'inferplug[ray]'"
# Where Ray keeps its prefix-aware router: the public path needs ray[llm]'s extras (pyarrow), the other not
_PREFIX_ROUTERS = ("ray.serve.llm.request_router",
                   "ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router")
LOOPBACK = "127.0.0.1"  # the only address a local Ray listens on (server/replicas.py)


def require_ray(replicas: int) -> Any:
    try:
        import ray
        from ray import serve  # noqa: F401
    except ImportError as exc:
        raise BackendUnavailable(f"replicas = {replicas} runs on Ray Serve, which is not installed ({exc}); "
                                 f"{INSTALL}, or set replicas = 1") from None
    return ray


def prefix_router() -> type | None:
    """Ray's prefix-cache-aware request router, or None where this Ray lacks it."""
    import importlib

    for path in _PREFIX_ROUTERS:
        try:
            return importlib.import_module(path).PrefixCacheAffinityRouter
        except (ImportError, AttributeError):
            continue
    return None


def routing_choice(choice: str) -> tuple[str, str]:
    """("prefix" | "power_of_two", why) for `[parallel] routing`."""
    if choice == "power_of_two":
        return "power_of_two", "routing power of two: pinned by the profile (the shorter queue of two replicas)"
    if prefix_router() is not None:
        return "prefix", ("routing prefix-cache-aware (Ray Serve's PrefixCacheAffinityRouter): a prompt goes to "
                          "the replica that served its prefix, so its KV blocks are cached there")
    if choice == "prefix":
        raise ProfileError("routing = \"prefix\" needs Ray Serve's PrefixCacheAffinityRouter, which this Ray "
                           "lacks; install a Ray whose Serve has it (2.60 does), or set routing = \"power_of_two\"")
    return "power_of_two", "routing power of two: this Ray has no prefix-aware router (Ray 2.60 has one)"


def describe(profile: Profile) -> str:
    """The resolver's line for replicas > 1 (without starting Ray)."""
    n = profile.parallel.replicas
    try:
        require_ray(n)
        _, why = routing_choice(profile.parallel.routing)
    except (BackendUnavailable, ProfileError) as exc:
        return f"replicas {n}: {exc}"
    address = os.environ.get("RAY_ADDRESS")
    ray_where = (f"on the Ray cluster at {address} (RAY_ADDRESS; its own network setup applies)"
                 if address and address != "local" else
                 f"on a local Ray bound to loopback ({LOOPBACK}) only, unless serve --ray-address names a cluster")
    return (f"replicas {n}: one Ray Serve deployment {ray_where}, each replica its own engine and KV cache; the API "
            f"key goes to the replicas in their environment, not in deployment arguments; {why}")


def check_reachable(address: str, timeout: float = 3.0) -> None:
    """A one-line error now, rather than ray.init retrying an address nobody answers."""
    if address in ("auto", "local"):  # auto: ray.init finds this host's cluster or says there is none
        return
    parts = urlsplit(address if "://" in address else f"ray://{address}")
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        host = port = None
    if not host or not port:
        raise BackendUnavailable(f"the Ray address {address!r} is not host:port (or ray://host:port); give the head "
                                 "node's address as `ray start --head` printed it")
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        raise BackendUnavailable(f"cannot reach the Ray cluster at {address} ({exc.strerror or exc}); start it with "
                                 "`ray start --head`, or fix --ray-address / RAY_ADDRESS") from None
