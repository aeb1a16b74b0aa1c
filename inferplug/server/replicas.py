"""`[parallel] replicas = N`: N engines as one Ray Serve deployment, each with its own KV cache.

`inferplug serve` keeps its own HTTP server (server/replica_front.py). Each request goes through a Serve
handle to one replica, which answers it with the same app `create_app` builds (server/replica_engine.py):
one set of routes. The front reads the request before routing, so a request router sees the prompt; HTTP
through Serve's own proxy would hide the body from it. Ray is started locally unless an address is given.

A local Ray listens on loopback only (every port of its GCS, raylet, workers and agents: Ray otherwise binds them on
all interfaces), so no other host can reach it. The API key reaches the replicas through their environment
(runtime_env env_vars), never in the deployment's arguments, which Serve keeps in its controller's state.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from inferplug.errors import BackendUnavailable, ProfileError

if TYPE_CHECKING:
    from inferplug.profile import Profile

APP_NAME = "inferplug"
INSTALL = "pip install 'inferplug[ray]'"
# Where Ray keeps its prefix-aware router: the public path needs ray[llm]'s extras (pyarrow), the other not
_PREFIX_ROUTERS = ("ray.serve.llm.request_router",
                   "ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router")
# the engine queues and batches; Serve's default of 5 ongoing requests would starve its batches
MAX_ONGOING_REQUESTS = 256
HEALTH_CHECK_PERIOD_S = 1.0  # also the period replicas publish their metrics at (replica_engine.py)
LOOPBACK = "127.0.0.1"
# Ray's own switch for a single-node Ray on loopback (what it does on macOS and Windows): read when its processes
# start, and by ray.init through ray_constants (set there too: this process imported Ray already)
_RAY_CLUSTER_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


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


@dataclass
class RayConnection:
    address: str | None  # None: a local Ray this process started
    num_cpus: float  # CPUs a local Ray has for the replicas

    def close(self) -> None:
        import ray
        from ray import serve

        try:
            if self.address is None:
                serve.shutdown()
            else:  # a shared cluster: only our app goes, other Serve apps stay up
                serve.delete(APP_NAME)
        finally:
            ray.shutdown()  # a local Ray: stops every process it started; a cluster: disconnects


def connect(replicas: int, address: str | None) -> RayConnection:
    ray = require_ray(replicas)
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address == "local":  # Ray's word for "start one here"
        address = None
    quiet = dict(logging_level=logging.WARNING, log_to_driver=False)
    if address:
        check_reachable(address)
        try:
            ray.init(address=address, **quiet)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise BackendUnavailable(f"cannot join the Ray cluster at {address} ({exc}); check `ray status` "
                                     "there, or fix --ray-address / RAY_ADDRESS") from None
        return RayConnection(address, 0.0)
    cpus = os.cpu_count() or 1
    ray.init(**local_init_options(cpus), **quiet)
    return RayConnection(None, float(cpus))


def local_init_options(cpus: int) -> dict[str, Any]:
    """ray.init's options for a local Ray on loopback only, no dashboard."""
    import ray._private.ray_constants as ray_constants

    os.environ[_RAY_CLUSTER_SWITCH] = "0"  # the GCS, raylet and workers Ray starts read it from their environment
    ray_constants.ENABLE_RAY_CLUSTER = False  # ray.init's own node address: loopback
    return dict(num_cpus=cpus, include_dashboard=False, _node_ip_address=LOOPBACK)


def deployment_options(connection: RayConnection, profile: Profile, api_key: str | None) -> tuple[dict[str, Any],
                                                                                                   Profile]:
    """Serve's options for the engine deployment, and the profile each replica runs (its thread share set)."""
    n = profile.parallel.replicas
    options: dict[str, Any] = dict(name="engine", num_replicas=n, max_ongoing_requests=MAX_ONGOING_REQUESTS,
                                   health_check_period_s=HEALTH_CHECK_PERIOD_S, graceful_shutdown_timeout_s=5,
                                   ray_actor_options={})
    if connection.address is None:  # one host: share its cores out, or the replicas fight over them
        share = connection.num_cpus / n
        options["ray_actor_options"]["num_cpus"] = share
        if profile.native.num_threads is None:
            profile = profile.model_copy(deep=True)
            profile.native.num_threads = max(1, int(share))
    if api_key:  # create_app reads it from there (server/app.py API_KEY_ENV)
        from inferplug.server.app import API_KEY_ENV

        options["ray_actor_options"]["runtime_env"] = {"env_vars": {API_KEY_ENV: api_key}}
    if routing_choice(profile.parallel.routing)[0] == "prefix":
        from ray.serve.config import RequestRouterConfig

        # imbalanced_threshold: past this queue gap the router balances load instead of following the prefix
        options["request_router_config"] = RequestRouterConfig(
            request_router_class=prefix_router(), request_router_kwargs={"imbalanced_threshold": 16})
    return options, profile


def deploy(connection: RayConnection, profile: Profile, *, api_key: str | None, max_body_bytes: int) -> Any:
    """Start the replicas; returns (the Serve handle, the metrics board). Waits until every replica is up."""
    from ray import serve

    from inferplug.server.replica_engine import EngineReplica, MetricsBoard

    options, profile = deployment_options(connection, profile, api_key)
    serve.start(proxy_location="Disabled")
    board = MetricsBoard.options(name=f"{APP_NAME}-metrics", get_if_exists=True).remote()
    app = serve.deployment(EngineReplica).options(**options).bind(profile, max_body_bytes, board)
    try:
        handle = serve.run(app, name=APP_NAME, route_prefix=None)
    except RuntimeError as exc:  # a replica failed to start, e.g. its model did not load
        last = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise BackendUnavailable(f"the replicas failed to start: {last}; see the Ray logs") from None
    return handle, board
