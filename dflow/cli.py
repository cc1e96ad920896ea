"""The ``dflow`` command: run workers, inspect runs.

    dflow worker MODULE [MODULE ...] --transport URL --store URL [--concurrency N] [--app-dir DIR]
    dflow inspect TRACE_ID --store URL
    dflow rerun TRACE_ID --from SEQ --store URL [--transport URL]
    dflow ls --store URL [--limit N] [--status STATUS] [--pipeline NAME]
    dflow circuits --store URL [--json]
    dflow serve MODULE [MODULE ...] --transport URL --store URL [--host H] [--port P]

URLs default to the environment: ``DFLOW_TRANSPORT``, ``DFLOW_STORE``; the shared secret
that signs flows is ``DFLOW_SECRET``.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import dataclasses
import importlib
import json
import logging
import os
import re
import signal
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ._tree import safe
from .context import RunInfo, RunStatus
from .errors import ConfigurationError, DFlowError, InvalidTraceIdError

if TYPE_CHECKING:
    from .circuit import CircuitState
    from .store import Store

log = logging.getLogger("dflow.worker")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="dflow", description="Run dflow workers and inspect runs.")
    sub = ap.add_subparsers(dest="command", required=True)
    w = sub.add_parser("worker", help="run steps: import MODULEs (which build the flows) and consume")
    w.add_argument("modules", nargs="+", metavar="MODULE", help="module(s) that build the flows (import paths)")
    w.add_argument("--transport", default=os.environ.get("DFLOW_TRANSPORT"), help="redis://... or kafka://...")
    w.add_argument("--store", default=os.environ.get("DFLOW_STORE"), help="redis://...")
    w.add_argument("--concurrency", type=int, default=64, help="steps run at once (default 64)")
    w.add_argument("--lease", type=float, default=60.0,
                   help="seconds before a silent step is taken over (default 60)")
    w.add_argument("--poll-interval", type=float, default=2.0, metavar="SECONDS",
                   help="scan the store's timers and leases at least this often; they are also scanned when "
                        "they fall due (default 2: what an idle worker costs, and how late a timer set by a "
                        "worker that died may fire)")
    w.add_argument("--grace", type=float, default=30.0,
                   help="seconds to finish running steps on SIGTERM (default 30)")
    w.add_argument("--log-level", default=os.environ.get("DFLOW_LOG_LEVEL", "INFO"))
    w.add_argument("--legacy-frames", action="store_true",
                   help="also run the steps of runs started by dflow 0.1, whose frames are unsigned (only while "
                        "such runs are in flight)")
    w.add_argument("--app-dir", default=None, metavar="DIR",
                   help="look for MODULEs in DIR before installed packages (default: the current directory, "
                        "after installed packages, so that a file there cannot shadow one)")
    w.add_argument("--metrics-port", type=int, default=os.environ.get("DFLOW_METRICS_PORT", "0"), metavar="N",
                   help="serve Prometheus metrics on http://HOST:N/metrics (or DFLOW_METRICS_PORT; "
                        "default 0: none; the metrics extra)")
    w.add_argument("--metrics-host", default="127.0.0.1", metavar="HOST",
                   help="address of the metrics server (default 127.0.0.1; 0.0.0.0 for a scraper "
                        "elsewhere)")
    w.add_argument("--log-format", default=os.environ.get("DFLOW_LOG_FORMAT", "text"),
                   help="text (default) or json (or DFLOW_LOG_FORMAT): one JSON object a line, with the "
                        "run and step on the lines of a step")
    w.add_argument("--otel", action="store_true", default=os.environ.get("DFLOW_OTEL", "") in ("1", "true"),
                   help="trace runs and steps with OpenTelemetry (or DFLOW_OTEL=1): the tracer provider "
                        "the MODULEs set, else one made from the OTEL_* variables (the otel extra)")
    w.add_argument("--deadlock-interval", type=_seconds, metavar="SECONDS",
                   default=os.environ.get("DFLOW_DEADLOCK_INTERVAL", "5"),
                   help="look for runs waiting for each other this often, one worker at a time "
                        "(or DFLOW_DEADLOCK_INTERVAL; default 5; 0: never)")
    w.add_argument("--deadlock-rule", choices=["longest", "newest"], default="longest",
                   help="which wait of a deadlock to break: the one declared first (default) or last")
    i = sub.add_parser("inspect", help="print a run's step tree")
    i.add_argument("trace_id")
    i.add_argument("--store", default=os.environ.get("DFLOW_STORE"))
    c = sub.add_parser("cancel", help="cancel a run: it ends CANCELLED, with its waits, timers and branches")
    c.add_argument("trace_id")
    c.add_argument("--reason", default="cancelled from the command line", help="recorded on the run")
    c.add_argument("--store", default=os.environ.get("DFLOW_STORE"))
    c.add_argument("--transport", default=os.environ.get("DFLOW_TRANSPORT"),
                   help="to publish at once what the cancel releases (a parent's join); else the store's "
                        "outbox hands it out within its redispatch time")
    rr = sub.add_parser("rerun", help="rerun an ended run from a step: the steps before it replayed from its "
                                      "records, the rest run with the code deployed now; prints the new trace id")
    rr.add_argument("trace_id")
    rr.add_argument("--from", dest="seq", type=int, required=True, metavar="SEQ",
                    help="the step to rerun from (its seq, as dflow inspect lists the steps)")
    rr.add_argument("--store", default=os.environ.get("DFLOW_STORE"))
    rr.add_argument("--transport", default=os.environ.get("DFLOW_TRANSPORT"),
                    help="to dispatch the first step at once; else the store's outbox hands it out within its "
                         "redispatch time")
    sv = sub.add_parser(
        "serve", help="serve the HTTP API (sessions, runs, events, calls; OpenAPI docs at /docs) and the web "
                      "console (/console/)",
        description="Serve the HTTP API for the pipelines MODULEs build, and the web console at /console/. "
                    "DFLOW_SERVER_TOKEN is the admin token that creates sessions and logs in to the console "
                    "(required unless --host is a loopback address); DFLOW_SERVER_SECRET "
                    "signs session tokens (the same on every server process); DFLOW_SECRET signs flows.",
    )
    sv.add_argument("modules", nargs="+", metavar="MODULE", help="module(s) that build the flows (import paths); "
                    "each may list route providers in DFLOW_ROUTES")
    sv.add_argument("--transport", default=os.environ.get("DFLOW_TRANSPORT"), help="redis://... or kafka://...")
    sv.add_argument("--store", default=os.environ.get("DFLOW_STORE"), help="redis://...")
    sv.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    sv.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: a free one, logged)")
    sv.add_argument("--pipeline", action="append", default=[], metavar="NAME",
                    help="serve only this pipeline (repeatable; default: every pipeline the modules build)")
    sv.add_argument("--token-ttl", type=float, default=3600.0, help="seconds a session token lasts (default 3600)")
    sv.add_argument("--run-steps", action="store_true", help="also run steps in this process (default: workers do)")
    sv.add_argument("--concurrency", type=int, default=64, help="steps run at once with --run-steps (default 64)")
    sv.add_argument("--grace", type=float, default=10.0, help="seconds to finish requests on SIGTERM (default 10)")
    sv.add_argument("--log-level", default=os.environ.get("DFLOW_LOG_LEVEL", "INFO"))
    sv.add_argument("--app-dir", default=None, metavar="DIR", help="look for MODULEs in DIR first")
    ls = sub.add_parser("ls", help="list recent runs (not zip/any branches: inspect their parent)")
    ls.add_argument("--store", default=os.environ.get("DFLOW_STORE"))
    ls.add_argument("--limit", type=_count, default=20, help="runs shown at most (default 20)")
    ls.add_argument("--status", choices=[s.value for s in RunStatus], help="only runs in this status now")
    ls.add_argument("--pipeline", help="only runs started by this pipeline (its name)")
    cb = sub.add_parser("circuits", help="list the circuit breakers used within the last day, with their state")
    cb.add_argument("--store", default=os.environ.get("DFLOW_STORE"))
    cb.add_argument("--json", action="store_true", help="print JSON (times in seconds since the epoch)")
    return ap


def _count(text: str) -> int:
    """A count of 1 or more, from the command line."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of 1 or more, got {text!r}")
    return n


def _seconds(text: str) -> float:
    """A number of seconds, 0 or more, from the command line."""
    try:
        n = float(text)
    except ValueError:
        n = -1.0
    if not 0 <= n < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds, 0 or more, got {text!r}")
    return n


def _need(value: str | None, flag: str, env: str) -> str:
    if not value:
        raise ConfigurationError(f"{flag} is required (or set {env})")
    return value


async def _worker(args: argparse.Namespace) -> int:
    from . import client
    from ._connect import store_from_url, transport_from_url
    from ._observing import WorkerObservability
    from ._signing import Keys
    from ._urls import redact_url
    from .runtime import Runtime

    observing = WorkerObservability(metrics_port=args.metrics_port, metrics_host=args.metrics_host,
                                    log_format=args.log_format, otel=args.otel)
    observing.start_logs()
    Keys(os.environ.get("DFLOW_SECRET"))  # a worker signs and checks flows: refuse to start without a key
    if args.app_dir is not None:
        sys.path.insert(0, os.path.abspath(args.app_dir))
    else:
        sys.path.append(os.getcwd())
    for module in args.modules:
        importlib.import_module(module)
    transport = transport_from_url(_need(args.transport, "--transport", "DFLOW_TRANSPORT"))
    store = store_from_url(_need(args.store, "--store", "DFLOW_STORE"), transport=transport)
    try:
        await store.ping()
    except DFlowError as exc:
        print(f"dflow worker: cannot reach the store {redact_url(args.store)}: {exc}", file=sys.stderr)
        return 2
    try:
        await transport.ping()
    except DFlowError as exc:
        print(f"dflow worker: cannot reach the transport {redact_url(args.transport)}: {exc}", file=sys.stderr)
        return 2
    runtime = Runtime(transport, store, concurrency=args.concurrency, lease=args.lease,
                      poll_interval=args.poll_interval, legacy_frames=args.legacy_frames, deadlock_interval=args.deadlock_interval or None,
                      deadlock_rule=args.deadlock_rule)
    observing.install(runtime)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    client.attach(runtime)
    await runtime.start()
    log.info("dflow worker %s: serving %s (concurrency %d)", runtime.worker_id, ", ".join(args.modules),
             args.concurrency)
    await stop.wait()
    log.info("dflow worker %s: stopping; running steps get %.0fs", runtime.worker_id, args.grace)
    await runtime.stop(args.grace)
    client.detach()
    observing.close()
    return 0


async def _inspect(args: argparse.Namespace) -> int:
    from ._connect import store_from_url
    from ._ids import check_trace_id, is_run_id
    from ._tree import render

    if not is_run_id(args.trace_id):
        check_trace_id(args.trace_id)  # says what is wrong with it
    store = store_from_url(_need(args.store, "--store", "DFLOW_STORE"))
    try:
        print(await render(store, args.trace_id))
        for line in await _circuit_notes(store, args.trace_id):
            print(line)
        return 0 if await store.get_run(args.trace_id) is not None else 1
    finally:
        await store.close()


#: what a step that a circuit refused recorded: the type and the start of the message
_OPEN_ERROR = "dflow.errors.CircuitOpenError"
_OPEN_MESSAGE = re.compile(r"circuit ('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\") is (open|a probe is out)")


async def _failed_fast(store: Store, trace_id: str, found: dict[str, list[str]], depth: int = 0) -> None:
    """Add to ``found`` the steps of run ``trace_id`` (and of its branches) that a circuit
    refused: by circuit name, the state each found it in."""
    from ._tree import branch_runs

    for rec in await store.get_steps(trace_id):
        error = rec.error or {}
        match = _OPEN_MESSAGE.match(str(error.get("message", ""))) if error.get("type") == _OPEN_ERROR else None
        try:
            name = ast.literal_eval(match.group(1)) if match is not None else None
        except (ValueError, SyntaxError):  # (not a message of ours)
            name = None
        if match is not None and isinstance(name, str):
            found.setdefault(name, []).append("open" if match.group(2) == "open" else "half-open (a probe out)")
        if depth < 8:
            for child in branch_runs(rec):
                await _failed_fast(store, child, found, depth + 1)


async def _circuit_notes(store: Store, trace_id: str) -> list[str]:
    """For ``dflow inspect``: the circuits that refused steps of the run, and their state now."""
    from .circuit import _known_circuits
    from .shared_state import backend_for

    found: dict[str, list[str]] = {}
    await _failed_fast(store, trace_id, found)
    if not found:
        return []
    try:
        now: dict[str, CircuitState] | None = {c.name: c for c in await _known_circuits(backend_for(store))}
    except DFlowError:  # a store without circuits, or it failed: the records still say what happened
        now = None
    lines = ["circuits that failed steps fast (the call was refused, the dependency not called):"]
    for name, states in sorted(found.items()):
        seen = " or ".join(sorted(set(states)))
        state = "unknown" if now is None else _circuit_now(now.get(name), time.time())
        lines.append(f"  {safe(name)}: {len(states)} step{'s' if len(states) > 1 else ''} refused while {seen}; "
                     f"now {state}")
    return lines


def _circuit_now(c: CircuitState | None, now: float) -> str:
    if c is None:
        return "not used within the last day"
    window = f" in {c.config.window:g}s" if c.config else ""
    if c.state == "closed":
        return f"closed ({c.failures}{'/' + str(c.config.failures) if c.config else ''} failures{window})"
    if c.state == "open":
        return f"open (a probe may go in {max(0.0, c.retry_at - now):.1f}s)"
    return "half-open (a probe is out)" if c.probing else "half-open (the next call is the probe)"


async def _circuits(args: argparse.Namespace) -> int:
    from ._connect import store_from_url
    from ._urls import redact_url
    from .circuit import _known_circuits
    from .shared_state import backend_for

    store = store_from_url(_need(args.store, "--store", "DFLOW_STORE"))
    try:
        circuits = await _known_circuits(backend_for(store))
    except ConfigurationError:
        raise
    except DFlowError as exc:
        print(f"dflow circuits: cannot read the circuits of {redact_url(args.store)}: {safe(exc)}", file=sys.stderr)
        return 2
    finally:
        await store.close()
    if args.json:
        print(json.dumps([dataclasses.asdict(c) for c in circuits], indent=2))
        return 0
    if not circuits:
        print("no circuit breaker was used with this store within the last day")
        return 0
    now = time.time()
    width = min(40, max(7, *(len(safe(c.name)) for c in circuits)))
    print(f"{'CIRCUIT':<{width}} {'STATE':<9} {'FAILURES':<14} {'OPENED':<19}  PROBE")
    for c in circuits:
        name = safe(c.name)
        name = name if len(name) <= width else name[:width - 1] + "~"
        failures = f"{c.failures}/{c.config.failures} in {c.config.window:g}s" if c.config else str(c.failures)
        opened = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(c.opened_at)) if c.opened_at else "-"
        if c.state == "open":
            probe = f"may go in {max(0.0, c.retry_at - now):.1f}s"
        elif c.state == "half_open":
            probe = f"out (lease {max(0.0, c.retry_at - now):.1f}s)" if c.probing else "may go now"
        else:
            probe = "-"
        state = "half-open" if c.state == "half_open" else c.state
        print(f"{name:<{width}} {state:<9} {failures:<14} {opened:<19}  {probe}")
    return 0


async def _cancel(args: argparse.Namespace) -> int:
    from ._connect import store_from_url, transport_from_url
    from ._dispatch import route as _route
    from ._ids import check_trace_id, is_run_id

    if not is_run_id(args.trace_id):
        check_trace_id(args.trace_id)  # says what is wrong with it
    store = store_from_url(_need(args.store, "--store", "DFLOW_STORE"))
    try:
        info, publish = await store.cancel(args.trace_id, args.reason)
        if info is None:
            print(f"dflow cancel: no run {safe(args.trace_id)} in this store", file=sys.stderr)
            return 1
        if publish and args.transport and not store.fused:
            transport = transport_from_url(args.transport)
            try:
                await transport.publish_many([(m.encode(), _route(m)) for m in publish])
            finally:
                await transport.close()
        print(f"{safe(args.trace_id)}: {info.status.value}")
        return 0
    finally:
        await store.close()


async def _rerun(args: argparse.Namespace) -> int:
    from ._connect import store_from_url, transport_from_url
    from ._dispatch import route as _route
    from ._durable import ChainCodec
    from ._ids import check_trace_id, is_run_id
    from ._rerun import start_rerun
    from .errors import RunError

    if not is_run_id(args.trace_id):
        check_trace_id(args.trace_id)  # says what is wrong with it
    chains = ChainCodec(os.environ.get("DFLOW_SECRET"))  # the new run's frames are signed: the workers' secret
    transport = transport_from_url(args.transport) if args.transport else None
    store = store_from_url(_need(args.store, "--store", "DFLOW_STORE"), transport=transport)
    try:
        try:
            trace_id, publish = await start_rerun(store, chains, args.trace_id, args.seq)
        except RunError as exc:
            print(f"dflow rerun: {safe(exc)}", file=sys.stderr)
            return 1
        if publish and transport is not None and not store.fused:
            await transport.publish_many([(m.encode(), _route(m)) for m in publish])
        print(trace_id)
        return 0
    finally:
        await store.close()
        if transport is not None:
            await transport.close()


async def _serve(args: argparse.Namespace) -> int:
    from .server import serve

    return await serve(
        args.modules, store=_need(args.store, "--store", "DFLOW_STORE"),
        transport=_need(args.transport, "--transport", "DFLOW_TRANSPORT"), host=args.host, port=args.port,
        run_steps=args.run_steps, concurrency=args.concurrency, grace=args.grace, pipelines=args.pipeline,
        token_ttl=args.token_ttl, app_dir=args.app_dir, log_level=args.log_level,
    )


async def _ls(args: argparse.Namespace) -> int:
    from ._connect import store_from_url

    store = store_from_url(_need(args.store, "--store", "DFLOW_STORE"))
    runs: list[RunInfo] = []
    try:
        cursor: str | None = None
        status = RunStatus(args.status) if args.status else None
        while len(runs) < args.limit:
            page = await store.page_runs(min(args.limit - len(runs), 1000), status=status,
                                         pipeline=args.pipeline or None, cursor=cursor)
            runs += page.runs
            if page.cursor is None:
                break
            cursor = page.cursor
    finally:
        await store.close()
    # STEP: the run's step sequence number, how many steps it has taken (its position)
    print(f"{'TRACE ID':<40} {'STATUS':<9} {'PIPELINE':<24} {'STEP':>5} {'STARTED':<19} {'AGE':>8}  NOTE")
    now = time.time()
    for r in runs:
        note = r.waiting_for and f"waiting for {r.waiting_for}" or ""
        if r.extra.get("parked"):
            note = f"parked x{r.extra.get('park_count')}: {r.extra['parked']}"
        elif r.error:
            note = f"{r.error.get('type')}: {r.error.get('message')}"
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.created))
        pipeline = safe(r.pipeline or "-")
        pipeline = pipeline if len(pipeline) <= 24 else pipeline[:23] + "~"
        print(f"{safe(r.trace_id):<40} {r.status.value:<9} {pipeline:<24} {r.seq:>5} {started:<19} "
              f"{now - r.created:>7.0f}s  {safe(note[:80])}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dflow`` console script."""
    args = _parser().parse_args(argv)
    level = getattr(args, "log_level", "WARNING")
    logging.basicConfig(level=str(level).upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    command = {"worker": _worker, "inspect": _inspect, "ls": _ls, "cancel": _cancel, "serve": _serve,
               "rerun": _rerun, "circuits": _circuits}[args.command]
    try:
        return asyncio.run(command(args))
    except (ConfigurationError, InvalidTraceIdError, ImportError) as exc:
        print(f"dflow {args.command}: {safe(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # pragma: no cover
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
