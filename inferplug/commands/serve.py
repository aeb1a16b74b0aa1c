"""`inferplug serve PROFILE`: an OpenAI-compatible HTTP server for one profile (FastAPI + uvicorn)."""

from __future__ import annotations

import argparse
import os
import socket

from inferplug.commands import add_context_flag, add_profile_argument, load_with_context, whole_number


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("serve", help="serve a profile over an OpenAI-compatible HTTP API")
    add_profile_argument(p)
    add_context_flag(p)
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1, this machine only; 0.0.0.0 exposes it)")
    p.add_argument("--port", type=port_number, default=8000, help="port (default 8000; 0: any free one)")
    p.add_argument("--api-key", default=None, metavar="KEY",
                   help="require 'Authorization: Bearer KEY' on /v1/* (default: $INFERPLUG_API_KEY, else none)")
    p.add_argument("--max-body-bytes", type=int, default=None, metavar="BYTES",
                   help="largest request body accepted (default 8 MiB)")
    p.add_argument("--replicas", type=whole_number, default=None, metavar="N",
                   help="engines behind the server, on Ray Serve (default: the profile's [parallel] replicas)")
    p.add_argument("--ray-address", default=None, metavar="ADDRESS",
                   help="the Ray cluster for the replicas (default: $RAY_ADDRESS, else a local Ray started here)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="the server log's level (default info)")
    for key, kind, what in _LIMIT_FLAGS:
        p.add_argument(f"--{key.replace('_', '-')}", type=kind, default=None, dest=f"server_{key}",
                       metavar=_METAVARS[kind], help=f"{what} (default: the profile's [server] {key})")
    p.add_argument("--allowed-host", action="append", default=None, dest="server_allowed_hosts", metavar="HOST",
                   help="a Host header to accept on loopback without an API key (repeat; '*': any)")
    p.set_defaults(func=run)


# the [server] keys (profile_server.py) with a flag of their own
_LIMIT_FLAGS = [
    ("max_prompts", whole_number, "prompts in one /v1/completions request"),
    ("max_n", whole_number, "choices per prompt"),
    ("max_messages", whole_number, "messages in one chat request"),
    ("max_tools", int, "tools offered in one chat request"),
    ("max_schema_bytes", int, "bytes of a response_format schema or of the tools' JSON"),
    ("max_schema_properties", int, "properties of all objects in a response_format schema or in the tools"),
    ("max_json_depth", whole_number, "how deep a request body's JSON may nest"),
    ("max_stop", int, "stop strings and stop_token_ids per request"),
    ("max_stop_chars", whole_number, "characters of the longest stop string"),
    ("max_logit_bias", int, "tokens one logit_bias names"),
    ("max_prompt_tokens", whole_number, "tokens of one prompt; unset, the context length"),
    ("max_total_tokens", whole_number, "prompts x n x max_tokens of one request"),
    ("max_json_values", whole_number, "JSON values (commas) in one request body; more get 413 before parsing"),
    ("max_waiting", whole_number, "requests waiting for their first token; more get 429"),
    ("max_waiting_per_client", whole_number, "the same for one client (its tenant header, else its address)"),
    ("max_in_flight_per_client", whole_number, "requests of one client in flight (waiting or streaming); more get 429"),
    ("queue_timeout_s", float, "seconds a request may wait for its first token; then 503"),
    ("body_read_timeout_s", float, "seconds a request body may take to arrive; then 408"),
    ("stream_send_timeout_s", float, "seconds a stream may wait for its client to read; then it is cut off"),
    ("shutdown_grace_s", float, "seconds in-flight requests get after SIGTERM before they are aborted"),
    ("tenant_header", str, "the header naming a request's tenant: tenants never share cached prompts"),
]

_METAVARS = {whole_number: "N", int: "N", float: "SECONDS", str: "NAME"}


def apply_server_flags(profile, args: argparse.Namespace) -> None:  # noqa: ANN001 - a Profile
    """The [server] values the flags give, over the profile's."""
    for key in [k for k, _, _ in _LIMIT_FLAGS] + ["allowed_hosts"]:
        value = getattr(args, f"server_{key}", None)
        if value is not None:
            setattr(profile.server, key, value)


def run(args: argparse.Namespace) -> int:
    from inferplug.errors import BackendUnavailable

    try:
        import uvicorn

        from inferplug.server.app import DEFAULT_MAX_BODY_BYTES, create_app
    except ImportError as exc:
        raise BackendUnavailable(f"serving needs FastAPI and uvicorn ({exc}); pip install 'inferplug[serve]'") from exc
    profile = load_with_context(args)
    if args.replicas is not None:
        profile.parallel.replicas = args.replicas
    apply_server_flags(profile, args)
    max_body = args.max_body_bytes or DEFAULT_MAX_BODY_BYTES
    sockets = listening_sockets(args.host, args.port)
    args.port = sockets[0].getsockname()[1]  # --port 0 took a free one
    if profile.parallel.replicas > 1 or args.ray_address:
        return _serve_replicas(profile, args, max_body, sockets)
    from inferplug.backends.registry import close_all, get_backend
    from inferplug.chat_template import chat_template_text

    backend = get_backend(profile)
    app = create_app(backend, api_key=args.api_key, max_body_bytes=max_body)
    print(f"inferplug: serving {backend.announced_name} ({backend.name}) at http://{args.host}:{args.port}/v1",
          flush=True)
    if backend.tokenizer is not None and chat_template_text(profile, backend.tokenizer) is None:
        print("inferplug: this model has no chat template (a base model's file carries none): /v1/chat/completions "
              "answers 400, /v1/completions takes plain prompts", flush=True)
    try:
        # SIGTERM: in-flight requests get the grace, then are cancelled (and so aborted); close_all frees the rest
        config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                timeout_graceful_shutdown=profile.server.shutdown_grace_s)
        uvicorn.Server(config).run(sockets=sockets)
    finally:
        close_all()
    return 0


def listening_sockets(host: str, port: int) -> list[socket.socket]:
    """Sockets listening on host:port, one per address it names (as asyncio binds a host: 'localhost' may be ::1 and
    127.0.0.1; '' is every interface), or a ServeError naming the fix. Bound and listening before the model loads: a
    taken port (another server, one still loading too) fails in a second rather than after minutes of loading."""
    from inferplug.errors import ServeError

    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ServeError(f"--host {host!r} is not an address this machine can bind ({exc.strerror}): use 127.0.0.1, "
                         "0.0.0.0 or one of its own addresses") from None
    sockets: list[socket.socket] = []
    try:
        for family, address in dict.fromkeys((info[0], info[4]) for info in infos):
            sock = socket.socket(family, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a restart takes the port at once
            if family == socket.AF_INET6:  # its own family only, as asyncio binds it: IPv4 has its own socket
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(2048)  # uvicorn's backlog: connections made while the model loads wait here
    except OSError as exc:
        for sock in sockets:
            sock.close()
        raise ServeError(f"cannot listen on {host}:{port} ({exc.strerror}): another process holds the port, or the "
                         "address is not this machine's; pick another with --port (or --host), or stop what holds it"
                         ) from None
    return sockets


def port_number(text: str) -> int:
    """--port: 0 (any free port) to 65535."""
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port: use 0 to 65535 (0: any free one)")
    return value


def _serve_replicas(profile, args: argparse.Namespace, max_body: int,  # noqa: ANN001 - a Profile
                    sockets: list[socket.socket]) -> int:
    import uvicorn

    from inferplug.server import replicas
    from inferplug.server.app import API_KEY_ENV

    connection = replicas.connect(profile.parallel.replicas, args.ray_address)  # first: it checks Ray is there
    try:
        from inferplug.server.guard import parse_api_keys
        from inferplug.server.replica_front import create_front

        api_key = args.api_key or os.environ.get(API_KEY_ENV) or None  # read here: a remote node has its own env
        handle, board = replicas.deploy(connection, profile, api_key=api_key, max_body_bytes=max_body)
        where = connection.address or "a local Ray"
        print(f"inferplug: serving {profile.name} on {profile.parallel.replicas} replicas ({where}) at "
              f"http://{args.host}:{args.port}/v1", flush=True)
        front = create_front(handle, board, max_body, parse_api_keys(api_key), profile.server)
        uvicorn.Server(uvicorn.Config(front, host=args.host, port=args.port, log_level=args.log_level)).run(
            sockets=sockets)
    finally:
        connection.close()
    return 0
