"""Riding out an outage of the store or the transport quietly: capped exponential backoff
in the loops that call them, one log line when an outage starts (with its cause), one when
it ends (with how long it lasted), and nothing in between.

``Outage`` is shared by every loop of a runtime that calls one dependency (the consumers'
receives, the timer scan, the lease renewal): the first failure after a success starts an
outage and logs it at WARNING; the failures that follow are only counted (their tracebacks at
DEBUG, at most one per ``Backoff`` step); the first success after them ends it, logged at
WARNING with its duration. Each loop keeps a ``Backoff`` of its own, the pause before its
next try: ``base``, doubling with each failure of that loop, at most ``cap`` (with a little
jitter, so that loops and workers do not try all at once), back to ``base`` after a success.
"""

from __future__ import annotations

import logging
import random

from ..clock import SYSTEM_CLOCK, Clock
from ..errors import StoreError, TransportError

__all__ = ["Backoff", "Outage", "Outages", "cause"]

log = logging.getLogger("dflow.runtime")

_jitter = random.Random()  # its own: the global one may be a test's


def cause(exc: BaseException) -> str:
    """``Type: message`` of ``exc`` on one line (what it says first, a few hundred characters)."""
    text = " ".join(str(exc).split())
    text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text if len(text) <= 300 else text[:299] + "~"


class Backoff:
    """The pause of one loop before it tries again (see the module)."""

    __slots__ = ("base", "cap", "failures")

    def __init__(self, base: float = 0.1, cap: float = 5.0) -> None:
        self.base = base
        self.cap = cap
        self.failures = 0  #: in a row

    def next(self) -> float:
        """The pause after one more failure."""
        self.failures += 1
        pause = min(self.cap, self.base * 2 ** min(self.failures - 1, 30))
        return float(pause * _jitter.uniform(0.8, 1.0))

    def reset(self) -> None:
        self.failures = 0


class Outage:
    """The outages of one dependency (``what``: "the store", "the transport"), as this
    process sees them (see the module)."""

    def __init__(self, what: str, clock: Clock = SYSTEM_CLOCK) -> None:
        self.what = what
        self.clock = clock
        self.since: float | None = None  #: when the current outage started (monotonic)
        self.failures = 0  #: failed calls in the current outage
        self.first: str = ""  #: the cause of the current outage

    @property
    def down(self) -> bool:
        return self.since is not None

    def failed(self, exc: BaseException, backoff: Backoff, doing: str) -> float:
        """A call ``doing`` something failed with ``exc``: the pause before ``backoff``'s
        loop tries again. Logs the start of an outage."""
        pause = backoff.next()
        self.failures += 1
        if self.since is None:
            self.since = self.clock.monotonic()
            self.first = cause(exc)
            log.warning(
                "dflow: %s failed (%s: %s); retrying with backoff (up to %.0fs), quietly until it works again",
                self.what,
                doing,
                self.first,
                backoff.cap,
            )
        if log.isEnabledFor(logging.DEBUG):
            log.debug("dflow: %s failed (%s), again in %.2fs", self.what, doing, pause, exc_info=exc)
        return pause

    def ok(self, backoff: Backoff | None = None) -> None:
        """A call succeeded: the end of the outage, if there was one (logged)."""
        if backoff is not None and backoff.failures:
            backoff.reset()
        if self.since is None:
            return
        lasted = self.clock.monotonic() - self.since
        log.warning(
            "dflow: %s works again after %.1fs (%d failed calls; it failed with %s)",
            self.what,
            lasted,
            self.failures,
            self.first,
        )
        self.since = None
        self.failures = 0
        self.first = ""


class Outages:
    """The outages of a runtime's store and transport (see the module)."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self.store = Outage("the store", clock)
        self.transport = Outage("the transport", clock)
        #: the backoff of the steps handed back for an outage (shared by the consumers)
        self.steps = Backoff()

    def of(self, exc: BaseException) -> Outage | None:
        """The outage ``exc`` tells of: a ``StoreError`` the store's, a ``TransportError``
        the transport's; ``None`` for another error (a bug, to be logged in full)."""
        if isinstance(exc, StoreError):
            return self.store
        if isinstance(exc, TransportError):
            return self.transport
        return None
