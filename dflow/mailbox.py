"""Early calls: a run's *mailbox*.

A call (``DFlow.call``) may reach a run before the run waits for it: the step before its
``from_call`` is still running, or the run waits for another call first. Such a call is
kept in the run's mailbox, in arrival order, and delivered when the run reaches a
``from_call`` of its type (the oldest of that type first). The mailbox is bounded per run
and per call type (``Mailbox``); a call over a bound is refused with ``MailboxFullError``
and nothing changes. It goes with the run: a finished run's mailbox expires with it, and a
call to a finished or unknown run raises as before.

A store is told the bounds with each call it should keep (``Store.resume(..., keep=)``),
so they are the caller's setting, not the store's.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ConfigurationError, MailboxFullError

__all__ = ["DEFAULT_MAILBOX", "Mailbox", "MailboxEntry", "keep_mail", "mailbox_full", "take_mail"]

#: One kept call in an in-process mailbox: its call type, payload and whether it is an error.
MailboxEntry = tuple[str, bytes, bool]


@dataclass(frozen=True, slots=True)
class Mailbox:
    """The bounds of a run's mailbox: at most ``per_run`` early calls in all, and at most
    ``per_type`` of one call type."""

    per_run: int = 100
    per_type: int = 20

    def __post_init__(self) -> None:
        for name in ("per_run", "per_type"):
            n = getattr(self, name)
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ConfigurationError(f"Mailbox({name}=...) is a whole number of at least 1, got {n!r}")
        if self.per_type > self.per_run:
            raise ConfigurationError(
                f"Mailbox(per_type={self.per_type}) is more than per_run={self.per_run}: a run could never "
                "hold that many calls of one type; make per_type at most per_run"
            )


#: The bounds ``DFlow.call`` keeps early calls within unless told otherwise.
DEFAULT_MAILBOX = Mailbox()


def mailbox_full(trace_id: str, call_type: str, bounds: Mailbox, held: int, held_of_type: int) -> str | None:
    """Why the mailbox of run ``trace_id``, holding ``held`` calls (``held_of_type`` of
    ``call_type``), takes no more of ``call_type`` within ``bounds``; ``None`` when it does."""
    if held_of_type >= bounds.per_type:
        return (
            f"run {trace_id!r} is not waiting for call {call_type!r} and its mailbox already holds "
            f"{held_of_type} early calls of that type, the limit per call type (Mailbox.per_type={bounds.per_type}); "
            "the call was not kept: send it again once the run has taken one, or raise the bound"
        )
    if held >= bounds.per_run:
        return (
            f"run {trace_id!r} is not waiting for call {call_type!r} and its mailbox already holds {held} "
            f"early calls, the limit per run (Mailbox.per_run={bounds.per_run}); the call was not kept: send it "
            "again once the run has taken some, or raise the bound"
        )
    return None


def keep_mail(entries: list[MailboxEntry], trace_id: str, entry: MailboxEntry, bounds: Mailbox) -> None:
    """Add ``entry`` to the in-process mailbox ``entries`` of run ``trace_id``, or raise
    ``MailboxFullError`` (``entries`` unchanged)."""
    of_type = sum(1 for e in entries if e[0] == entry[0])
    why = mailbox_full(trace_id, entry[0], bounds, len(entries), of_type)
    if why is not None:
        raise MailboxFullError(why, trace_id=trace_id)
    entries.append(entry)


def take_mail(entries: list[MailboxEntry] | None, call_type: str) -> MailboxEntry | None:
    """Take the oldest call of ``call_type`` out of ``entries``; ``None`` when there is none."""
    if entries:
        for i, e in enumerate(entries):
            if e[0] == call_type:
                del entries[i]
                return e
    return None
