"""Task queues in the flow model: the names a step may be routed by, and a pipeline's
default queue laid onto the nodes of its flow.

A node's queue (``DFlow.queue``) says which workers may run its step: those started with
``dflow worker --queues NAME``. A node without one is on ``DEFAULT_QUEUE``. How a step gets
to its queue's workers is the runtime's part (``runtime.queues``).
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

from ..errors import BuildError
from .nodes import Node, rebuilt

N = TypeVar("N", bound=Node)

__all__ = ["ALLOWED", "DEFAULT_QUEUE", "check_queue", "with_default_queue"]

#: the queue of every step whose node names none (what ``dflow worker`` serves by default)
DEFAULT_QUEUE = "default"
#: what a queue name may hold, in words (it becomes part of a stream or topic name)
ALLOWED = "letters, digits, '_' and '-', 1 to 64 of them"
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def check_queue(name: Any, what: str = "queue") -> str:
    """``name`` when it is a valid queue name, else ``BuildError`` naming it and what is allowed."""
    if not isinstance(name, str) or _NAME.fullmatch(name) is None:
        raise BuildError(f"{what} name {name!r} is not allowed: use {ALLOWED} (e.g. 'gpu')")
    return name


def with_default_queue(flow: N, queue: str) -> N:
    """``flow`` with ``queue`` on each of its nodes (and those of its zip/any branches) that
    names no queue of its own; ids, and so step keys, stay as they are."""
    return rebuilt(flow, lambda n: {} if n._queue is not None else {"_queue": queue})
