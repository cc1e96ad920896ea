"""Every exception the Redis client raises, mapped onto dflow's error tree in one place:
``StoreError`` for the store's commands, ``TransportError`` for the transport's, and their
transient subclasses (``StoreUnavailableError``, ``TransportUnavailableError``) for what a
failover, a slot migration or a reconnect raises, which the same call may get past later.

What redis-py raises during those, and where it is sorted here:

- the connection: ``ConnectionError`` (refused, reset, closed by the server, ``max number of
  clients``), ``TimeoutError``, ``BusyLoadingError`` (``LOADING``: a node loading its data),
  ``MaxConnectionsError`` (a pool full): transient; ``AuthenticationError`` and
  ``AuthorizationError`` are not (a password does not come right by waiting);
- the cluster: ``ClusterDownError`` (``CLUSTERDOWN``), ``MasterDownError`` (``MASTERDOWN``),
  ``TryAgainError`` (``TRYAGAIN``: a slot migrating), ``MovedError``/``AskError`` left over
  when redirections run out, ``ClusterError`` (``TTL exhausted``: redirected again and
  again), ``SlotNotCoveredError`` and the other ``RedisClusterException`` (no node reachable,
  the slot map not loaded): transient, but for the ones a program's mistake raises
  (``CrossSlotTransactionError``, ``InvalidPipelineStack``, ``CROSSSLOT``);
- replies: ``ReadOnlyError`` (``READONLY``: a write reached a master just demoted), and the
  ``ResponseError`` whose code is ``BUSY`` (a script running), ``NOREPLICAS``, ``UNBLOCKED``
  (a blocking read cut off as its node turned replica), ``NOGROUP`` (a stream's consumer group
  gone with a failover: the transport makes it again): transient; any other reply error
  (a script's error, ``NOPERM``, ``OOM``, ``WRONGTYPE``) is a ``StoreError``;
- the client's own insides: a connection closed under a command by another task (its
  cluster pipeline, retrying, closes every connection of the client) surfaces as an
  ``AttributeError`` (``'NoneType' object has no attribute 'writelines'``), an ``OSError``
  or an ``IncompleteReadError`` raised within redis-py: transient. (``GatedCluster`` keeps
  connections in use open where redis-py would close them; this is the net under it.)

An exception raised by dflow's own code inside the block (not within redis-py) passes as it
is: a bug is not an outage.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections.abc import Iterator

import redis
import redis.exceptions as rex

from dflow.errors import (
    DFlowError,
    StoreError,
    StoreUnavailableError,
    TransportError,
    TransportUnavailableError,
)

__all__ = ["is_transient", "mapped", "store_errors", "transport_errors"]

_REDIS_DIR = os.path.dirname(redis.__file__) + os.sep

#: first words of reply errors that a failover, a migration or a busy node gives
_TRANSIENT_REPLY = re.compile(
    r"""(?:^|[('"])(?:LOADING|BUSY|TRYAGAIN|CLUSTERDOWN|MASTERDOWN|READONLY|NOREPLICAS|UNBLOCKED|NOGROUP) """
)
#: redis-py's exceptions for a mistake of the program (or the credentials): waiting does not help
_PERMANENT = (
    rex.AuthenticationError,
    rex.AuthorizationError,
    rex.ExternalAuthProviderError,
    rex.NoPermissionError,
    rex.CrossSlotTransactionError,
    rex.InvalidPipelineStack,
    rex.ClusterCrossSlotError,
    rex.DataError,
)
_TRANSIENT = (
    rex.ConnectionError,
    rex.TimeoutError,
    rex.ClusterError,
    rex.TryAgainError,
    rex.AskError,  # (and MovedError): redirections ran out while the slot map changed
    rex.ReadOnlyError,
    rex.RedisClusterException,
)
#: what redis-py's insides raise when a connection is closed under a command
_INTERNAL = (AttributeError, TypeError, OSError, EOFError, asyncio.IncompleteReadError, RuntimeError)


def _within_redis(exc: BaseException) -> bool:
    """Whether ``exc`` was raised inside redis-py (not by the code calling it)."""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.startswith(_REDIS_DIR):
            return True
        tb = tb.tb_next
    return False


def is_transient(exc: BaseException) -> bool:
    """Whether a redis-py exception is one a failover, a migration or a reconnect raises,
    that the same command may get past later."""
    if isinstance(exc, _PERMANENT):
        return False
    if isinstance(exc, rex.ResponseError) and not isinstance(exc, _TRANSIENT):
        # (a pipeline's error reads "Command # n (...) of pipeline caused error: ('BUSY ...',)")
        return _TRANSIENT_REPLY.search(str(exc)) is not None
    return isinstance(exc, (*_TRANSIENT, *_INTERNAL))


def _describe(exc: BaseException, what: str) -> str:
    if isinstance(exc, rex.AuthenticationError):
        return f"Redis refused the credentials for the {what}: {exc}"
    if isinstance(exc, (rex.ConnectionError, rex.TimeoutError, OSError, EOFError)):
        return f"cannot reach Redis for the {what}: {exc}"
    if isinstance(exc, rex.RedisClusterException) and "cannot be connected" in str(exc):
        # (the cluster client's own word when no node it knows answers: not a failover)
        return f"cannot reach Redis for the {what} (no node of the cluster answers): {exc}"
    if isinstance(exc, _INTERNAL):
        return (
            f"the Redis client lost its connection under a {what} command (a failover or a reconnect): "
            f"{type(exc).__name__}: {exc}"
        )
    if is_transient(exc):
        return f"the Redis {what} is not available for now (a failover or a slot moving): {exc}"
    return f"Redis {what} error: {exc}"


def mapped(exc: BaseException, kind: type[StoreError] | type[TransportError]) -> DFlowError | None:
    """``exc`` as the error of dflow's tree that ``kind`` (``StoreError`` or
    ``TransportError``) stands for, its transient subclass where it is transient; ``None``
    for an exception that is not the Redis client's (dflow's own, or a bug of the caller)."""
    ours = isinstance(exc, (rex.RedisError, rex.RedisClusterException))
    if not ours and not (isinstance(exc, _INTERNAL) and _within_redis(exc)):
        return None
    what = "store" if kind is StoreError else "transport"
    if is_transient(exc):
        unavailable = StoreUnavailableError if kind is StoreError else TransportUnavailableError
        return unavailable(_describe(exc, what))
    return kind(_describe(exc, what))


@contextlib.contextmanager
def store_errors() -> Iterator[None]:
    """Re-raise the Redis client's exceptions as ``StoreError`` (``StoreUnavailableError``
    where transient)."""
    try:
        yield
    except DFlowError:
        raise
    except Exception as exc:
        err = mapped(exc, StoreError)
        if err is None:
            raise
        raise err from exc


@contextlib.contextmanager
def transport_errors() -> Iterator[None]:
    """Re-raise the Redis client's exceptions as ``TransportError``
    (``TransportUnavailableError`` where transient)."""
    try:
        yield
    except DFlowError:
        raise
    except Exception as exc:
        err = mapped(exc, TransportError)
        if err is None:
            raise
        raise err from exc
