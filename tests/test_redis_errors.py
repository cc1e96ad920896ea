"""What the Redis client raises in a failover, a slot migration or a reconnect reaches dflow's
callers as dflow's errors: ``StoreUnavailableError`` / ``TransportUnavailableError`` where
the same call may get through later, ``StoreError`` / ``TransportError`` otherwise, and an
exception of dflow's own code passes as it is. (The store's and transport's entry points
under injected faults: tests/integration/test_redis_faults_mapped.py.)"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
import redis.exceptions as rex
from redis._parsers.base import BaseParser
from redis.asyncio.connection import Connection

from dflow import StoreError, StoreUnavailableError, TransportError, TransportUnavailableError
from dflow.adapters.redis.errors import mapped, store_errors, transport_errors


def _reply(text: str) -> Exception:
    """The exception redis-py makes of the error reply ``text``."""
    exc: Exception = BaseParser.parse_error(text)
    return exc


def _in_pipeline(exc: Exception) -> Exception:
    """``exc`` as redis-py's cluster pipeline re-raises it (its message rewritten)."""
    exc.args = (f"Command # 1 (EVALSHA abc 3 k1 k2 k3) of pipeline caused error: {exc.args}", *exc.args[1:])
    return exc


def _closed_writer() -> Exception:
    """What this redis-py raises when another task closed the connection under a command:
    ``AttributeError`` (``'NoneType' object has no attribute 'writelines'``) before 8.2, a
    ``ConnectionError`` since."""

    async def send() -> None:
        await Connection()._send_packed_command([b"PING\r\n"])

    try:
        asyncio.run(send())
    except (AttributeError, rex.ConnectionError) as exc:
        return exc
    raise AssertionError("a connection without a writer sent a command")


TRANSIENT: dict[str, Callable[[], Exception]] = {
    "connection reset": lambda: rex.ConnectionError(
        "Error 104 while writing to socket. Connection reset by peer."
    ),
    "connection refused": lambda: rex.ConnectionError(
        "Error 111 connecting to 127.0.0.1:7001. Connection refused."
    ),
    "closed by server": lambda: rex.ConnectionError("Connection closed by server."),
    "max clients": lambda: _reply("ERR max number of clients reached"),
    "timeout": lambda: rex.TimeoutError("Timeout reading from 127.0.0.1:7001"),
    "pool full": lambda: rex.MaxConnectionsError("Too many connections"),
    "loading": lambda: _reply("LOADING Redis is loading the dataset in memory"),
    "busy script": lambda: _reply(
        "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE."
    ),
    "cluster down": lambda: _reply("CLUSTERDOWN The cluster is down"),
    "master down": lambda: _reply(
        "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."
    ),
    "try again": lambda: _reply("TRYAGAIN Multiple keys request during rehashing of slot"),
    "moved": lambda: _reply("MOVED 3999 127.0.0.1:7002"),
    "ask": lambda: _reply("ASK 3999 127.0.0.1:7002"),
    "ttl exhausted": lambda: rex.ClusterError("TTL exhausted."),
    "read only": lambda: _reply("READONLY You can't write against a read only replica."),
    "no replicas": lambda: _reply("NOREPLICAS Not enough good replicas to write."),
    "unblocked": lambda: _reply(
        "UNBLOCKED force unblock from blocking operation, instance state changed (master -> replica?)"
    ),
    "group gone": lambda: _reply(
        "NOGROUP No such key 'steps' or consumer group 'dflow-workers' in XREADGROUP"
    ),
    "slot not covered": lambda: rex.SlotNotCoveredError(
        'Slot "3999" not covered by the cluster. "require_full_coverage=True"'
    ),
    "no node reachable": lambda: rex.RedisClusterException(
        "Redis Cluster cannot be connected. Please provide at least one reachable node"
    ),
    "busy in a pipeline": lambda: _in_pipeline(_reply("BUSY Redis is busy running a script.")),
    "cluster down in a pipeline": lambda: _in_pipeline(_reply("CLUSTERDOWN The cluster is down")),
    "writer closed under a command": _closed_writer,
}

PERMANENT: dict[str, Callable[[], Exception]] = {
    "script error": lambda: _reply("ERR user_script:12: Script attempted to access a non local key"),
    "no script": lambda: _reply("NOSCRIPT No matching script. Please use EVAL."),
    "wrong type": lambda: _reply("WRONGTYPE Operation against a key holding the wrong kind of value"),
    "wrong password": lambda: _reply("WRONGPASS invalid username-password pair or user is disabled."),
    "no permission": lambda: _reply("NOPERM User dflow has no permissions to run the 'evalsha' command"),
    "out of memory": lambda: _reply("OOM command not allowed when used memory > 'maxmemory'."),
    "cross slot": lambda: _reply("CROSSSLOT Keys in request don't hash to the same slot"),
    "busygroup": lambda: _reply("BUSYGROUP Consumer Group name already exists"),
    "data": lambda: rex.DataError("Invalid input of type: 'dict'"),
}


@pytest.mark.parametrize("make", TRANSIENT.values(), ids=TRANSIENT.keys())
def test_what_a_failover_or_a_migration_raises_is_a_transient_store_and_transport_error(
    make: Callable[[], Exception],
) -> None:
    exc = make()
    with pytest.raises(StoreUnavailableError) as store, store_errors():
        raise exc
    assert store.value.__cause__ is exc
    assert str(exc) in str(store.value)
    with pytest.raises(TransportUnavailableError), transport_errors():
        raise make()


@pytest.mark.parametrize("make", PERMANENT.values(), ids=PERMANENT.keys())
def test_what_waiting_does_not_mend_is_a_store_error_that_is_not_transient(
    make: Callable[[], Exception],
) -> None:
    err = mapped(make(), StoreError)
    assert type(err) is StoreError, err
    terr = mapped(make(), TransportError)
    assert type(terr) is TransportError, terr


def test_the_credentials_refused_say_so() -> None:
    err = mapped(_reply("WRONGPASS invalid username-password pair or user is disabled."), StoreError)
    assert err is not None and "refused the credentials" in str(err)


def test_a_cluster_none_of_whose_nodes_answers_is_a_store_redis_cannot_reach() -> None:
    exc = rex.RedisClusterException(
        "Redis Cluster cannot be connected. Please provide at least one reachable node:"
        " Error 104 while writing to socket. Connection reset by peer."
    )
    err = mapped(exc, StoreError)
    assert isinstance(err, StoreUnavailableError)
    assert "cannot reach Redis" in str(err) and "no node of the cluster answers" in str(err)
    assert "failover" not in str(err), "no node answering is not a failover"


def _writer_gone() -> AttributeError:
    """An ``AttributeError`` raised inside redis-py's send, the form redis-py before 8.2
    gave a connection closed under a command by another task: a writer without ``writelines``."""

    class Transport:
        def is_closing(self) -> bool:
            return False

    class Gone:
        transport = Transport()

    async def send() -> None:
        connection = Connection()
        connection._writer = Gone()  # type: ignore[assignment]
        try:
            await connection._send_packed_command([b"PING\r\n"])
        finally:
            connection._writer = None  # (nothing was opened: nothing to close)

    try:
        asyncio.run(send())
    except AttributeError as exc:
        return exc
    raise AssertionError("a connection without a writer sent a command")


def test_the_writer_closed_under_a_command_names_the_lost_connection() -> None:
    err = mapped(_writer_gone(), StoreError)
    assert isinstance(err, StoreUnavailableError)
    assert "lost its connection" in str(err) and "writelines" in str(err)


def test_an_exception_of_dflows_own_code_passes_as_it_is() -> None:
    with pytest.raises(AttributeError, match="no attribute 'status'"), store_errors():
        None.status  # type: ignore[attr-defined]  # noqa: B018
    with pytest.raises(OSError, match="disk full"), transport_errors():
        raise OSError("disk full")
    assert mapped(KeyError("status"), StoreError) is None


def test_dflows_errors_raised_inside_pass_as_they_are() -> None:
    with pytest.raises(StoreUnavailableError, match="already mapped"), store_errors():
        raise StoreUnavailableError("already mapped")
