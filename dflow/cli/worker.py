"""``dflow worker``: import the app's modules, then run their steps until a signal."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from .options import add_log_level, add_otel, add_store, add_transport, seconds, store_url, transport_url

log = logging.getLogger("dflow.worker")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    w = sub.add_parser(
        "worker",
        help="run steps: import MODULEs (which build the flows) and consume",
        description="Run steps: import MODULEs (which build the flows), then take the steps of "
        "their runs from the transport until SIGTERM or SIGINT. DFLOW_SECRET is the shared "
        "secret that signs flows (the same on every worker and client).",
    )
    w.add_argument(
        "modules", nargs="+", metavar="MODULE", help="module(s) that build the flows (import paths)"
    )
    add_transport(w)
    add_store(w)
    w.add_argument("--concurrency", type=int, default=64, help="steps run at once (default 64)")
    w.add_argument(
        "--queues",
        default=os.environ.get("DFLOW_QUEUES", "default"),
        metavar="NAMES",
        help="run the steps of these task queues, comma-separated: those of nodes marked .queue(NAME); "
        "'default' is every other step (default: $DFLOW_QUEUES, else default)",
    )
    w.add_argument(
        "--lease",
        type=float,
        default=15.0,
        help="seconds before a silent step is taken over (default 15; renewed every few seconds while it runs)",
    )
    w.add_argument(
        "--poll-interval",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="scan the store's timers and leases at least this often; they are also scanned when "
        "they fall due (default 2: what an idle worker costs, and how late a timer set by a "
        "worker that died may fire)",
    )
    w.add_argument(
        "--grace", type=float, default=30.0, help="seconds to finish running steps on SIGTERM (default 30)"
    )
    w.add_argument(
        "--legacy-frames",
        action="store_true",
        help="also run the steps of runs started by dflow 0.1, whose frames are unsigned (only while "
        "such runs are in flight)",
    )
    w.add_argument(
        "--app-dir",
        default=None,
        metavar="DIR",
        help="look for MODULEs in DIR before installed packages (default: the current directory, "
        "after installed packages, so that a file there cannot shadow one)",
    )
    w.add_argument(
        "--metrics-port",
        type=int,
        default=os.environ.get("DFLOW_METRICS_PORT", "0"),
        metavar="N",
        help="serve Prometheus metrics on http://HOST:N/metrics (the metrics extra; "
        "default: $DFLOW_METRICS_PORT, else 0: none)",
    )
    w.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        metavar="HOST",
        help="address of the metrics server (default 127.0.0.1; 0.0.0.0 for a scraper elsewhere)",
    )
    w.add_argument(
        "--log-format",
        default=os.environ.get("DFLOW_LOG_FORMAT", "text"),
        help="text, or json: one JSON object a line, with the run and step on the lines of a "
        "step (default: $DFLOW_LOG_FORMAT, else text)",
    )
    add_otel(w, "runs and steps (the tracer provider the MODULEs set, else one of its own)")
    w.add_argument(
        "--deadlock-interval",
        type=seconds,
        metavar="SECONDS",
        default=os.environ.get("DFLOW_DEADLOCK_INTERVAL", "5"),
        help="look for runs waiting for each other this often, one worker at a time "
        "(default: $DFLOW_DEADLOCK_INTERVAL, else 5; 0: never)",
    )
    w.add_argument(
        "--deadlock-rule",
        choices=["longest", "newest"],
        default="longest",
        help="which wait of a deadlock to break: the one declared first (default) or last",
    )
    add_log_level(w)


async def run(args: argparse.Namespace) -> int:
    from .. import client
    from ..ops.app_modules import import_app_modules
    from ..ops.worker_flags import WorkerObservability
    from ..runtime.connect import check_reachable, queue_transport_from_url, store_from_url
    from ..runtime.queues import parse_queues
    from ..runtime.shutdown import StopSignals, exit_now, threads_left
    from ..runtime.worker import Runtime
    from ..wire.signing import Keys

    observing = WorkerObservability(
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        log_format=args.log_format,
        otel=args.otel,
    )
    observing.start_logs()
    Keys(os.environ.get("DFLOW_SECRET"))  # a worker signs and checks flows: refuse to start without a key
    queues = parse_queues(args.queues)
    if args.app_dir is not None:
        sys.path.insert(0, os.path.abspath(args.app_dir))
    else:
        sys.path.append(os.getcwd())
    import_app_modules(args.modules, args.app_dir)
    transport = queue_transport_from_url(transport_url(args), queues)
    # a Redis store writes step messages itself only onto the default queue's stream
    fused = transport.consumed if queues == ["default"] else None
    store = store_from_url(store_url(args), transport=fused)
    await check_reachable(transport, store, transport_url=args.transport, store_url=args.store)
    runtime = Runtime(
        transport,
        store,
        concurrency=args.concurrency,
        lease=args.lease,
        poll_interval=args.poll_interval,
        legacy_frames=args.legacy_frames,
        deadlock_interval=args.deadlock_interval or None,
        deadlock_rule=args.deadlock_rule,
    )
    observing.install(runtime)
    signals = StopSignals("dflow worker")
    signals.install(asyncio.get_running_loop())
    client.attach(runtime)
    await runtime.start()
    log.info(
        "dflow worker %s: serving %s on queues %s (concurrency %d)",
        runtime.worker_id,
        ", ".join(args.modules),
        ",".join(queues),
        args.concurrency,
    )
    await signals.asked.wait()
    log.info(
        "dflow worker %s: stopping; running steps get %.0fs (a second signal exits now)",
        runtime.worker_id,
        args.grace,
    )
    await runtime.stop(args.grace)
    client.detach()
    observing.close()
    left = threads_left()
    if left:  # steps cut off in their threads: their leases are handed back, do not wait for them
        log.warning(
            "dflow worker %s: leaving %d step thread(s) cut off by the grace", runtime.worker_id, len(left)
        )
        exit_now(0)
    return 0
