"""How a runtime lets go of its steps when it stops.

A step still running when the grace ends is cut off: its lease is given up at once
(``hand_back``), before its message goes back to the transport, so that another worker
claims it as soon as it reads the message, not when the lease would have run out. A step
run in a thread (``in_thread``) cannot be interrupted: its thread is left to finish on its
own (``threads_left``), and the worker process exits without waiting for it: its result,
if any, would come after the lease was handed back, and could not be committed.

A step that finishes within the grace commits as usual: its lease is renewed meanwhile.
A second SIGTERM or SIGINT ends the process at once (``StopSignals``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..store import Claim, Store

__all__ = ["STEP_THREAD_PREFIX", "StopSignals", "exit_now", "hand_back", "threads_left"]

log = logging.getLogger("dflow.runtime")

#: the name prefix of the threads that run ``in_thread`` steps
STEP_THREAD_PREFIX = "dflow-step"


async def hand_back(store: Store, claims: list[Claim]) -> int:
    """Give up the leases of ``claims`` (steps cut off by the grace) so that another
    worker may claim them at once; how many were handed back. A store that cannot be
    reached now keeps them leased until their leases run out (logged)."""
    if not claims:
        return 0
    try:
        await store.extend(claims, 0.0)
    except Exception as exc:
        log.warning(
            "dflow: could not hand back %d step(s) cut off by the grace (%s: %s); they run again "
            "when their leases run out",
            len(claims),
            type(exc).__name__,
            exc,
        )
        return 0
    for c in claims:
        m = c.message
        log.warning(
            "dflow: step %s of run %s (attempt %d) was cut off by the grace; handed back to the other workers",
            m.key,
            m.trace_id,
            m.attempt,
            extra={"dflow_run": m.trace_id, "dflow_step": m.key},
        )
    return len(claims)


def threads_left(timeout: float = 0.5) -> list[threading.Thread]:
    """The threads still running steps after their pool was shut down (idle ones end within
    ``timeout`` seconds; those left are busy in a step that was cut off)."""
    deadline = time.monotonic() + timeout
    busy = [t for t in threading.enumerate() if t.name.startswith(STEP_THREAD_PREFIX)]
    for t in busy:
        t.join(max(0.0, deadline - time.monotonic()))
    return [t for t in busy if t.is_alive()]


class StopSignals:
    """SIGTERM and SIGINT of a process serving steps: the first asks it to stop (``asked``
    is set: running steps get their grace); a second one exits the process at once (the
    steps running then run again elsewhere when their leases run out)."""

    def __init__(self, who: str) -> None:
        self.who = who
        self.asked = asyncio.Event()

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._received, sig)

    def _received(self, sig: int) -> None:
        if not self.asked.is_set():
            self.asked.set()
            return
        log.warning(
            "%s: a second %s: exiting now; the steps running here run again when their leases run out",
            self.who,
            signal.Signals(sig).name,
        )
        exit_now(128 + sig)


def exit_now(code: int) -> None:
    """End the process with ``code`` at once, its log lines written out first (no waiting for
    threads still running steps)."""
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
