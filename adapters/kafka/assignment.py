"""Whether a consumer has held a partition lately: a worker that holds none for long says so.

A member of a consumer group gets no partition when the group has more members than the topic
has partitions (it stands by, as it should), or when the group never settles: a broker that
keeps it rebalancing, a member that joins and leaves over and over. Either way the worker runs
nothing, and nothing else says why. ``AssignmentWatch`` tells the consumer thread when to log
it: once, after ``after`` seconds without a partition, and once more when one comes.
"""

from __future__ import annotations

import logging

__all__ = ["AssignmentWatch"]


class AssignmentWatch:
    """When a consumer of ``topic`` (``partitions`` of them) last held a partition."""

    __slots__ = ("after", "partitions", "since", "told", "topic")

    def __init__(self, topic: str, partitions: int, now: float, after: float = 60.0) -> None:
        self.topic = topic
        self.partitions = partitions
        self.after = after
        self.since: float | None = now  #: since when it has held none (``None``: it holds some)
        self.told = False

    def look(self, held: int, now: float, log: logging.Logger) -> None:
        """``seen``, logged: a warning when the worker has held none for long, then a line
        when it holds some again."""
        said = self.seen(held, now)
        if said is not None:
            log.log(logging.WARNING if self.told else logging.INFO, "dflow: %s", said)

    def seen(self, held: int, now: float) -> str | None:
        """``held`` partitions at ``now``: the line to log, if one is due."""
        if held:
            self.since = None
            if self.told:
                self.told = False
                return f"this worker holds {held} partition(s) of topic {self.topic!r} again"
            return None
        if self.since is None:
            self.since = now
        if self.told or now - self.since < self.after:
            return None
        self.told = True
        return (
            f"this worker has held no partition of topic {self.topic!r} for {now - self.since:.0f} s, so it "
            f"runs none of its steps: the group has more members than the topic's {self.partitions} "
            "partitions (it stands by: add partitions to use it), or the group does not settle (see the "
            "broker's group coordinator, and whether members keep joining and leaving)"
        )
