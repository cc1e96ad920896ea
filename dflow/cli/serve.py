"""``dflow serve``: the HTTP API and the web console for the pipelines the app's modules build."""

from __future__ import annotations

import argparse

from ..errors import ConfigurationError
from .options import add_log_level, add_otel, add_store, add_transport, store_url, transport_url

_SERVER_EXTRA = {"fastapi", "starlette", "uvicorn"}  #: what the server extra installs for dflow serve


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sv = sub.add_parser(
        "serve",
        help="serve the HTTP API (sessions, runs, events, calls; OpenAPI docs at /docs) and the web "
        "console (/console/)",
        description="Serve the HTTP API for the pipelines MODULEs build, and the web console at /console/. "
        "DFLOW_SERVER_TOKEN is the admin token that creates sessions and logs in to the console "
        "(required unless --host is a loopback address); DFLOW_SERVER_SECRET "
        "signs session tokens (the same on every server process); DFLOW_SECRET signs flows.",
    )
    sv.add_argument(
        "modules",
        nargs="+",
        metavar="MODULE",
        help="module(s) that build the flows (import paths); each may list route providers in DFLOW_ROUTES",
    )
    add_transport(sv)
    add_store(sv)
    sv.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    sv.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: a free one, logged)")
    sv.add_argument(
        "--pipeline",
        action="append",
        default=[],
        metavar="NAME",
        help="serve only this pipeline (repeatable; default: every pipeline the modules build)",
    )
    sv.add_argument(
        "--token-ttl", type=float, default=3600.0, help="seconds a session token lasts (default 3600)"
    )
    sv.add_argument(
        "--run-steps", action="store_true", help="also run steps in this process (default: workers do)"
    )
    sv.add_argument(
        "--concurrency", type=int, default=64, help="steps run at once with --run-steps (default 64)"
    )
    sv.add_argument(
        "--grace", type=float, default=10.0, help="seconds to finish requests on SIGTERM (default 10)"
    )
    sv.add_argument("--app-dir", default=None, metavar="DIR", help="look for MODULEs in DIR first")
    add_otel(sv, "the runs the API starts (a root span each) and the steps run here")
    add_log_level(sv)


async def run(args: argparse.Namespace) -> int:
    try:
        from ..server import serve
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in _SERVER_EXTRA:
            raise
        raise ConfigurationError(
            f"dflow serve needs the server extra: pip install 'dflow-runtime[server]' ({exc})"
        ) from exc

    return await serve(
        args.modules,
        store=store_url(args),
        transport=transport_url(args),
        host=args.host,
        port=args.port,
        run_steps=args.run_steps,
        concurrency=args.concurrency,
        grace=args.grace,
        pipelines=args.pipeline,
        token_ttl=args.token_ttl,
        app_dir=args.app_dir,
        log_level=args.log_level,
        otel=args.otel,
    )
