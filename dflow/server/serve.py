"""Running the app: ``dflow serve`` (the app and the runtime on one event loop, uvicorn
serving), and :class:`ServerThread` (uvicorn in a background thread, for tests and
notebooks)."""

from __future__ import annotations

import asyncio
import importlib
import ipaddress
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .. import client
from ..errors import ConfigurationError, DFlowError
from ..ops.worker_flags import WorkerObservability
from ..runtime.connect import store_from_url, transport_from_url
from ..runtime.worker import Runtime
from ..store import Store
from ..transport import Transport
from ..wire.signing import Keys
from ..wire.urls import redact_url
from .app import RouteProvider, create_app
from .tokens import Tokens

if TYPE_CHECKING:
    import uvicorn

__all__ = ["ServerThread", "is_loopback", "serve"]

log = logging.getLogger("dflow.serve")


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _routes_of(module: Any) -> list[RouteProvider]:
    found = getattr(module, "DFLOW_ROUTES", None)
    if found is None:
        return []
    if callable(found) or not isinstance(found, (list, tuple)):
        raise ConfigurationError(
            f"{module.__name__}.DFLOW_ROUTES must be a list of route providers (callables taking the "
            f"server and returning an APIRouter), got {type(found).__qualname__}"
        )
    return list(found)


async def serve(
    modules: Sequence[str],
    *,
    store: str,
    transport: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    run_steps: bool = False,
    concurrency: int = 64,
    lease: float = 15.0,
    grace: float = 10.0,
    pipelines: Sequence[str] = (),
    token_ttl: float = 3600.0,
    app_dir: str | None = None,
    log_level: str = "info",
    otel: bool = False,
) -> int:
    """Import ``modules``, connect to the store and transport, and serve the API until
    SIGTERM/SIGINT. The admin token is ``DFLOW_SERVER_TOKEN`` (required unless ``host`` is
    a loopback address), the token secret ``DFLOW_SERVER_SECRET``, the flows' signing key
    ``DFLOW_SECRET``. Steps run here only with ``run_steps``. ``otel`` traces the runs the
    API starts and the steps run here (``dflow.otel.setup``: the OTEL_* variables)."""
    try:
        import uvicorn
    except ImportError as exc:  # pragma: no cover - the server extra is missing
        raise ConfigurationError(
            f"dflow serve needs the server extra: pip install 'dflow-runtime[server]' ({exc})"
        ) from exc
    admin, tokens = _keys(host, token_ttl)
    providers = _import_modules(modules, app_dir)
    connected = await _connect(store, transport)
    if connected is None:
        return 2
    runtime = Runtime(*connected, concurrency=concurrency, lease=lease)
    observing = WorkerObservability(otel=otel, service="dflow-serve")
    observing.install(runtime)
    await runtime.start(consume=run_steps)
    client.attach(runtime)
    try:
        app = create_app(
            tokens=tokens, admin_token=admin, pipelines=list(pipelines) or None, routes=providers
        )
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level=log_level.lower(),
            lifespan="off",
            proxy_headers=False,
            server_header=False,
            timeout_graceful_shutdown=max(1, round(grace)),
        )
        what = f"{', '.join(modules)}; {'running steps' if run_steps else 'steps run on workers'}"
        return await _serve_until_stopped(uvicorn.Server(config), host, what)
    finally:
        await runtime.stop(grace)
        client.detach()
        observing.close()


def _keys(host: str, token_ttl: float) -> tuple[str | None, Tokens]:
    """The admin token and the session tokens' signer, from the environment; checks the
    flows' signing key too (the server starts runs: it signs their frames)."""
    Keys(os.environ.get("DFLOW_SECRET"))
    admin = os.environ.get("DFLOW_SERVER_TOKEN") or None
    if admin is None and not is_loopback(host):
        raise ConfigurationError(
            f"dflow serve on {host} would let anyone who reaches it create sessions: set DFLOW_SERVER_TOKEN "
            "(the admin token, 32+ bytes) or bind a loopback address (--host 127.0.0.1)"
        )
    tokens = Tokens.from_env(ttl=token_ttl, max_ttl=max(86400.0, token_ttl))
    if tokens.ephemeral:
        log.warning(
            "DFLOW_SERVER_SECRET is not set: session tokens are signed with a random key and stop "
            "working when this server stops"
        )
    return admin, tokens


def _import_modules(modules: Sequence[str], app_dir: str | None) -> list[RouteProvider]:
    """Import the served modules (from ``app_dir``, else the working directory); the route
    providers they list."""
    if app_dir is not None:
        sys.path.insert(0, os.path.abspath(app_dir))
    else:
        sys.path.append(os.getcwd())
    providers: list[RouteProvider] = []
    for name in modules:
        providers += _routes_of(importlib.import_module(name))
    return providers


async def _connect(store: str, transport: str) -> tuple[Transport, Store] | None:
    """The transport and the store of these URLs, once each answers a ping; ``None`` (said
    on stderr, with the URL redacted) when one does not."""
    transport_ = transport_from_url(transport)
    store_ = store_from_url(store, transport=transport_)
    for what, url, thing in (("store", store, store_), ("transport", transport, transport_)):
        try:
            await thing.ping()
        except DFlowError as exc:
            print(f"dflow serve: cannot reach the {what} {redact_url(url)}: {exc}", file=sys.stderr)
            return None
    return transport_, store_


async def _serve_until_stopped(server: uvicorn.Server, host: str, what: str) -> int:
    """Run the uvicorn ``server`` until SIGTERM/SIGINT; its exit code (1 when it did not start)."""

    # uvicorn stops on SIGTERM/SIGINT, then raises the signal again with the handlers it
    # found: those only ask it to stop (as they do before it has installed its own), so
    # that the runtime is stopped before this returns
    def stop(*_: object) -> None:
        server.should_exit = True

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        task = asyncio.ensure_future(server.serve())
        while not server.started and not task.done():
            await asyncio.sleep(0.02)
        if server.started:
            sock = server.servers[0].sockets[0].getsockname()
            where = f"[{host}]" if ":" in host else host  # always shown: with --port 0 it is how to find it
            print(f"dflow serve: listening on http://{where}:{sock[1]} ({what})", file=sys.stderr, flush=True)
        await task
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0 if server.started else 1


class ServerThread:
    """Serve ``app`` with uvicorn in a background thread on ``host`` (a free port by
    default): ``with ServerThread(app) as url: httpx.get(url + "/health")``."""

    def __init__(
        self, app: Any, host: str = "127.0.0.1", port: int = 0, *, log_level: str = "warning"
    ) -> None:
        import uvicorn

        self._server = uvicorn.Server(
            uvicorn.Config(
                app,
                host=host,
                port=port,
                log_level=log_level,
                lifespan="off",
                server_header=False,
                timeout_graceful_shutdown=2,
            )
        )
        self._thread = threading.Thread(target=self._server.run, name="dflow-serve", daemon=True)
        self.host = host
        self.url = ""

    def start(self, timeout: float = 10.0) -> str:
        """Start serving; the base URL."""
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start (see its log)")
            time.sleep(0.01)
        port = self._server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://{self.host}:{port}"
        return self.url

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving and wait for the thread."""
        self._server.should_exit = True
        self._thread.join(timeout)

    def __enter__(self) -> str:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
