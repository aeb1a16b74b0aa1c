"""`inferplug serve PROFILE`: an OpenAI-compatible HTTP server for one profile (FastAPI + uvicorn)."""

from __future__ import annotations

import argparse

from inferplug.commands import add_profile_argument


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("serve", help="serve a profile over an OpenAI-compatible HTTP API")
    add_profile_argument(p)
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1, this machine only; 0.0.0.0 exposes it)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on /v1/* (default: $INFERPLUG_API_KEY, else none)")
    p.add_argument("--max-body-bytes", type=int, default=None, help="largest request body accepted (default 8 MiB)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from inferplug.errors import BackendUnavailable

    try:
        import uvicorn

        from inferplug.server.app import DEFAULT_MAX_BODY_BYTES, create_app
    except ImportError as exc:
        raise BackendUnavailable(f"serving needs FastAPI and uvicorn ({exc}); pip install 'inferplug[serve]'") from exc
    from inferplug.backends.registry import close_all, get_backend

    backend = get_backend(args.profile)
    app = create_app(backend, api_key=args.api_key, max_body_bytes=args.max_body_bytes or DEFAULT_MAX_BODY_BYTES)
    print(f"inferplug: serving {backend.model_name} ({backend.name}) at http://{args.host}:{args.port}/v1", flush=True)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    finally:
        close_all()
    return 0
