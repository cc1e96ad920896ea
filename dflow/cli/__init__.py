"""The ``dflow`` command: run workers and the server, look at runs and act on them.

    dflow worker MODULE [MODULE ...] --transport URL --store URL [--concurrency N] [--app-dir DIR]
    dflow serve MODULE [MODULE ...] --transport URL --store URL [--host H] [--port P]
    dflow ls --store URL [--limit N] [--status STATUS] [--pipeline NAME] [--json]
    dflow inspect TRACE_ID --store URL [--requests] [--json]
    dflow cancel TRACE_ID --store URL [--reason TEXT]
    dflow rerun TRACE_ID --from SEQ [--again] --store URL [--transport URL]
    dflow call TRACE_ID CALL_TYPE [JSON] --store URL [--transport URL]
    dflow circuits --store URL [--json]
    dflow schedule add NAME --pipeline P (--cron EXPR | --every SPAN) [--param JSON] --store URL
    dflow schedule ls|pause|resume|rm [NAME] --store URL

URLs default to the environment: ``DFLOW_TRANSPORT``, ``DFLOW_STORE``; the shared secret
that signs flows is ``DFLOW_SECRET``. Each command is a module here with its ``register``
(its options) and the coroutine that runs it.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from ..errors import (
    ConfigurationError,
    InvalidTraceIdError,
    ScheduleError,
    StoreUnavailableError,
    TransportUnavailableError,
)
from ..ops.tree import safe
from . import circuits, control, runs, schedules, serve, worker
from .options import LOG_LEVELS, version

__all__ = ["main"]

Command = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]

#: the commands: how each adds its options, and what runs it
_COMMANDS: dict[
    str, tuple[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None], Command]
] = {
    "worker": (worker.register, worker.run),
    "inspect": (runs.register_inspect, runs.inspect),
    "cancel": (control.register_cancel, control.cancel),
    "rerun": (control.register_rerun, control.rerun),
    "call": (control.register_call, control.call),
    "serve": (serve.register, serve.run),
    "ls": (runs.register_ls, runs.ls),
    "circuits": (circuits.register, circuits.run),
    "schedule": (schedules.register, schedules.run),
}


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="dflow",
        description="Run dflow workers and inspect runs.",
        epilog="Environment: DFLOW_STORE and DFLOW_TRANSPORT (the default --store and --transport), "
        "DFLOW_SECRET (the shared secret that signs flows), DFLOW_LOG_LEVEL. "
        "`dflow COMMAND --help` tells each command's own.",
    )
    ap.add_argument("--version", action="version", version=f"dflow {version()}")
    sub = ap.add_subparsers(dest="command", required=True)
    for register, _ in _COMMANDS.values():
        register(sub)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dflow`` console script."""
    args = _parser().parse_args(argv)
    level = str(getattr(args, "log_level", "WARNING")).upper()
    if level not in LOG_LEVELS:  # (from DFLOW_LOG_LEVEL: argparse checks only what is given)
        print(
            f"dflow {args.command}: the log level is one of {', '.join(LOG_LEVELS)}, got {level!r}",
            file=sys.stderr,
        )
        return 2
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return asyncio.run(_COMMANDS[args.command][1](args))
    except (ConfigurationError, InvalidTraceIdError, ScheduleError, ImportError) as exc:
        print(f"dflow {args.command}: {safe(exc)}", file=sys.stderr)
        return 2
    except (StoreUnavailableError, TransportUnavailableError) as exc:
        print(f"dflow {args.command}: {_unreachable(args, exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # pragma: no cover
        return 130


def _unreachable(args: argparse.Namespace, exc: Exception) -> str:
    """One line: which service could not be reached (its URL without its password), and why."""
    from ..wire.urls import redact_url

    if isinstance(exc, StoreUnavailableError):
        what, url = "store", getattr(args, "store", None)
    else:
        what, url = "transport", getattr(args, "transport", None)
    where = f" {redact_url(url)}" if url else ""
    return f"cannot reach the {what}{where}: {safe(exc)}"
