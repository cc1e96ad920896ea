"""A run's compensations flag, as a store keeps it (``Store.cancel`` reads it).

The saga layout (``dflow.patterns.saga``) keeps a run's compensations in its data;
``compensations_in`` turns what a commit writes into the flag, so that a store reads
neither. Importable from ``dflow.store`` too.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum

#: Data fields of the saga layout (``dflow.patterns.saga``): a run's compensations are kept
#: under ``SAGA_PREFIX``, and the field ``COMPENSATING`` marks a run running them. A store
#: reads neither: ``compensations_in`` turns what a commit writes into the run's flag.
SAGA_PREFIX = "dflow/saga/"
COMPENSATING = "dflow/compensating"


def saga_prefix(trace_id: str) -> str:
    """The prefix of the saga fields that are run ``trace_id``'s own: a zip/any branch's
    data starts as a copy of its parent's, whose entries are the parent's to run. Each
    level of branches (``/fork-index`` in the id) adds ``<fork, 12 digits>.<index, 4>/``."""
    prefix = SAGA_PREFIX
    for level in trace_id.split("/")[1:]:
        fork, _, index = level.partition("-")
        prefix += f"{int(fork):012d}.{int(index):04d}/"
    return prefix


class Compensations(str, Enum):
    """A run's compensations flag, which ``cancel`` reads: ``NONE``, it holds none of its
    own (it ends CANCELLED); ``HELD``, a step of it with a compensation committed (it is
    sent a FAIL message, on which it runs them); ``RUNNING``, it runs them (it is left as
    it is). It only moves up: NONE, HELD, RUNNING. A store keeps it as its ``value``."""

    NONE = "none"
    HELD = "held"
    RUNNING = "running"


def compensations_in(trace_id: str, changes: Mapping[str, bytes | None]) -> Compensations | None:
    """What a commit (or a new run's data) of run ``trace_id`` that writes ``changes`` sets
    its compensations flag to: ``RUNNING`` when it marks the run compensating, ``HELD``
    when it writes a compensation of the run's own (a branch's, delivered at a join,
    included), ``None`` when it leaves the flag as it is."""
    if changes.get(COMPENSATING) is not None:
        return Compensations.RUNNING
    own = saga_prefix(trace_id)
    for k, v in changes.items():
        if v is not None and k.startswith(own):
            return Compensations.HELD
    return None


def raised(flag: Compensations, to: Compensations | None) -> Compensations:
    """The flag ``flag`` after a write that sets it ``to`` (it never goes down)."""
    order = (Compensations.NONE, Compensations.HELD, Compensations.RUNNING)
    return flag if to is None or order.index(to) <= order.index(flag) else to
