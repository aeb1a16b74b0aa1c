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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inferplug.errors import BackendUnavailable
from inferplug.replica_plan import LOOPBACK, check_reachable, prefix_router, require_ray, routing_choice

if TYPE_CHECKING:
    from inferplug.profile import Profile

APP_NAME = "inferplug"
# the engine queues and batches; Serve's default of 5 ongoing requests would starve its batches
MAX_ONGOING_REQUESTS = 256
# Ray's own switch for a single-node Ray on loopback (what it does on macOS and Windows): read when its processes
# start, and by ray.init through ray_constants (set there too: this process imported Ray already)
_RAY_CLUSTER_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


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
    from inferplug.server.replica_engine import HEALTH_CHECK_PERIOD_S

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
