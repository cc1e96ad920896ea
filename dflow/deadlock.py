"""Finding and breaking runs that wait for each other: the public home of what
``dflow.patterns.deadlock`` offers (see there)."""

from __future__ import annotations

from .patterns.deadlock import (
    MAX_RUNS,
    BreakRule,
    Deadlock,
    DeadlockDetector,
    WaitEdge,
    declare,
    longest_waiting,
    newest_waiting,
    rule_of,
)

__all__ = [
    "MAX_RUNS",
    "BreakRule",
    "Deadlock",
    "DeadlockDetector",
    "WaitEdge",
    "declare",
    "longest_waiting",
    "newest_waiting",
    "rule_of",
]
