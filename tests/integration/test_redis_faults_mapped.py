"""Every entry point of the Redis store, transport and state backend, on one server and on a
Redis Cluster, raises dflow's errors when the client's connection fails under it the ways a
failover, a slot migration or a reconnect makes it fail (faults injected into redis-py's
connection: a writer closed by another task, a reset, a timeout, a ``CLUSTERDOWN`` reply),
never redis-py's own; waits for runs ride through a short outage; the cluster client's own
retries no longer close connections that other commands are using."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
import warnings
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from redis._parsers.base import BaseParser
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from dflow import StoreUnavailableError, TransportUnavailableError
from dflow.adapters.redis import RedisStore, RedisStreamsTransport
from dflow.adapters.redis.client import GatedCluster, connect, disconnect, ready
from dflow.adapters.redis.state import RedisStateBackend
from dflow.shared_state import CircuitConfig, Outcome, WaitEdge, Writer
from dflow.store import Finish
from dflow.testing.cases import advance, new_run, rec
from dflow.wire.values import encode


class _Writer:
    """A connection's writer that fails as ``fault`` says, else writes."""

    def __init__(self, writer: Any, fault: BaseException) -> None:
        self.writer, self.fault = writer, fault

    def writelines(self, data: Any) -> None:
        raise self.fault

    def __getattr__(self, name: str) -> Any:
        return getattr(self.writer, name)


#: a fault: where it strikes ("send": writing a command; "reply": the reply read instead
#: turns into an error reply), and the exception
FAULTS: dict[str, tuple[str, Callable[[], BaseException]]] = {
    # another task closed the connection under the command (redis-py's cluster pipeline retrying)
    "writer closed": ("send", lambda: AttributeError("'NoneType' object has no attribute 'writelines'")),
    "connection reset": ("send", lambda: ConnectionResetError(104, "Connection reset by peer")),
    "write timeout": ("send", lambda: asyncio.TimeoutError()),
    "cluster down": ("reply", lambda: BaseParser.parse_error("CLUSTERDOWN The cluster is down")),
    "loading": ("reply", lambda: BaseParser.parse_error("LOADING Redis is loading the dataset in memory")),
    "try again": (
        "reply",
        lambda: BaseParser.parse_error("TRYAGAIN Multiple keys request during rehashing of slot"),
    ),
}


class Fault:
    """Makes the commands sent on any redis-py connection fail the way ``FAULTS`` names,
    while armed (``times`` commands, or all of them), inside redis-py as a real fault would."""

    def __init__(self) -> None:
        self.fault: tuple[str, Callable[[], BaseException]] | None = None
        self.left: int | None = None
        self.raised = 0

    @contextlib.contextmanager
    def armed(self, name: str, times: int | None = None) -> Iterator[None]:
        self.fault, self.left = FAULTS[name], times
        try:
            yield
        finally:
            self.fault = None

    def strikes(self, where: str) -> BaseException | None:
        if self.fault is None or self.fault[0] != where or self.left == 0:
            return None
        if self.left is not None:
            self.left -= 1
        self.raised += 1
        return self.fault[1]()


@pytest.fixture
def fault(monkeypatch: pytest.MonkeyPatch) -> Fault:
    f = Fault()
    send, read = AbstractConnection.send_packed_command, AbstractConnection.read_response

    async def failing_send(self: AbstractConnection, command: Any, check_health: bool = True) -> None:
        exc = f.strikes("send")
        if exc is not None:
            if not self.is_connected:
                await self.connect()
            self._writer = _Writer(self._writer, exc)  # type: ignore[assignment]
        await send(self, command, check_health)

    async def failing_read(self: AbstractConnection, *args: Any, **kwargs: Any) -> Any:
        reply = await read(self, *args, **kwargs)
        exc = f.strikes("reply")
        if exc is not None:
            raise exc
        return reply

    monkeypatch.setattr(AbstractConnection, "send_packed_command", failing_send)
    monkeypatch.setattr(AbstractConnection, "read_response", failing_read)
    return f


@pytest.fixture(params=["one-server", "cluster"])
def target(request: pytest.FixtureRequest) -> tuple[str, str]:
    """(URL, key prefix) of one Redis server or of the shared cluster."""
    if request.param == "one-server":
        return request.getfixturevalue("redis_url"), request.getfixturevalue("prefix")
    return request.getfixturevalue("redis_cluster_url"), request.getfixturevalue("cluster_prefix")


NO_RETRY = {"retry": Retry(NoBackoff(), 0)}  # (redis-py's own retries would only make the test slower)


class Parts:
    """A store fused with its transport, and a state backend, with a run at its first step
    claimed and delivered (made before any fault)."""

    def __init__(self, url: str, prefix: str) -> None:
        self.transport = RedisStreamsTransport(url, stream=f"{prefix}:steps", redeliver_after=60, **NO_RETRY)
        self.store = RedisStore(url, prefix=prefix, transport=self.transport, **NO_RETRY)
        self.state_client = connect(url, **NO_RETRY)
        self.state = RedisStateBackend(self.state_client, prefix)

    async def setup(self) -> None:
        run = new_run()
        assert run.message is not None
        await self.store.create_run(run)
        self.trace = run.trace_id
        (self.delivery,) = await self.transport.receive(1, timeout=5)
        claim = await self.store.claim(run.message, "w", 60)
        assert claim is not None
        self.claim = claim

    async def close(self) -> None:
        await self.store.close()
        await self.transport.close()
        await disconnect(self.state_client)

    def entry_points(self) -> dict[str, Callable[[], Awaitable[Any]]]:
        s, t, st, c = self.store, self.transport, self.state, self.claim
        circuit = CircuitConfig()
        return {
            "store.create_run": lambda: s.create_run(new_run()),
            "store.claim": lambda: s.claim(c.message, "w", 60),
            "store.commit": lambda: s.commit(
                c, [rec(c.message, 2)], {}, advance(c, 2), receipt=self.delivery.tag
            ),
            "store.extend": lambda: s.extend([c], 60),
            "store.init_done": lambda: s.init_done(self.trace, 1),
            "store.park": lambda: s.park(c, "a test"),
            "store.get_run": lambda: s.get_run(self.trace),
            "store.get_data": lambda: s.get_data(self.trace),
            "store.get_steps": lambda: s.get_steps(self.trace),
            "store.watch_steps": lambda: s.watch_steps(self.trace, 5, 0.2),
            "store.wait_many": lambda: s.wait_many([self.trace], 0.3),
            "store.get_blob": lambda: s.get_blob("nothing"),
            "store.page_runs": lambda: s.page_runs(5),
            "store.count_runs": lambda: s.count_runs(),
            "store.due": lambda: s.due(time.time()),
            "store.resume": lambda: s.resume(self.trace, "approval", b"\xc0"),
            "store.cancel": lambda: s.cancel(self.trace, "a test"),
            "store.ping": lambda: s.ping(),
            "transport.publish": lambda: t.publish(b"x", self.trace),
            "transport.publish_many": lambda: t.publish_many([(b"x", self.trace)]),
            # (a second: past the 0.25 s pause of the cluster client after a CLUSTERDOWN)
            "transport.receive": lambda: t.receive(1, timeout=1.0),
            "transport.ack": lambda: t.ack(self.delivery),
            "transport.nack": lambda: t.nack(self.delivery),
            "transport.dead_letter": lambda: t.dead_letter(self.delivery, "a test"),
            "transport.dead_letters": lambda: t.dead_letters(),
            "transport.ping": lambda: t.ping(),
            "transport.lag": lambda: t.lag(),
            "state.get": lambda: st.get("s"),
            "state.cas": lambda: st.cas("s", b"v", None, Writer(), 5),
            "state.rollback": lambda: st.rollback("s", 1, Writer(), 5),
            "state.circuit_enter": lambda: st.circuit_enter("c", circuit, "tok"),
            "state.circuit_record": lambda: st.circuit_record("c", circuit, "tok", False, Outcome.SUCCESS),
            "state.waits_add": lambda: st.waits_add(self.trace, 1, "approval", ["other"]),
            "state.waits_drop": lambda: st.waits_drop([WaitEdge(self.trace, 1, "approval", "other", 0.0)]),
            "state.history": lambda: st.history("s"),
            "state.circuit_state": lambda: st.circuit_state("c", circuit),
            "state.circuit_list": lambda: st.circuit_list(),
            "state.waits_list": lambda: st.waits_list(),
            "state.waits_lease": lambda: st.waits_lease("tok", 5),
        }


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fault_name", FAULTS)
def test_every_entry_point_raises_dflows_transient_error_when_the_connection_fails_under_it(
    target: tuple[str, str], fault: Fault, fault_name: str
) -> None:
    async def body() -> None:
        parts = Parts(*target)
        await parts.setup()
        wrong: dict[str, str] = {}
        try:
            for name, call in parts.entry_points().items():
                with fault.armed(fault_name):
                    try:
                        await call()
                    except (StoreUnavailableError, TransportUnavailableError) as exc:
                        kind = (
                            TransportUnavailableError
                            if name.startswith("transport.")
                            else StoreUnavailableError
                        )
                        if not isinstance(exc, kind):
                            wrong[name] = f"{type(exc).__name__}: {exc}"
                    except BaseException as exc:
                        wrong[name] = f"{type(exc).__module__}.{type(exc).__name__}: {exc}"
                    else:
                        wrong[name] = "no error, though every command failed"
        finally:
            await parts.close()
        assert fault.raised > 0
        assert wrong == {}, "entry points that let another error through"

    asyncio.run(body())


def test_a_wait_for_a_run_rides_through_a_short_outage(target: tuple[str, str], fault: Fault) -> None:
    """The first commands of a wait fail (a failover): it reads again, and returns the run."""

    async def body() -> None:
        parts = Parts(*target)
        await parts.setup()
        try:
            c = parts.claim
            await parts.store.commit(c, [rec(c.message, 2)], {}, _finish(), receipt=parts.delivery.tag)
            with fault.armed("writer closed", times=4):
                (info,) = await parts.store.wait_many([parts.trace], 10)
            assert fault.raised == 4
            assert info.status.finished and info.result == 7
        finally:
            await parts.close()

    asyncio.run(body())


def test_a_wait_through_an_outage_longer_than_its_timeout_raises_store_unavailable_in_time(
    target: tuple[str, str], fault: Fault
) -> None:
    async def body() -> None:
        parts = Parts(*target)
        await parts.setup()
        try:
            with fault.armed("connection reset"):
                t0 = time.monotonic()
                with pytest.raises(StoreUnavailableError, match="cannot reach Redis"):
                    await parts.store.wait_many([parts.trace], 1.0)
                took = time.monotonic() - t0
            assert fault.raised > 2, "it read again meanwhile"
            assert took < 2.5, f"it gave up {took:.1f}s after a 1s timeout"
        finally:
            await parts.close()

    asyncio.run(body())


def _finish() -> Finish:
    return Finish(encode(7))


# -- the cluster client's retries and the connections of other commands -----------------------


def test_a_retry_inside_the_cluster_client_leaves_the_commands_of_others_running(
    redis_cluster_url: str,
) -> None:
    """redis-py's cluster pipeline and command retries close the whole client to read the
    slot map again; a command another task had in flight then failed inside the client
    (``'NoneType' object has no attribute 'writelines'``). ``GatedCluster.aclose`` from
    inside a command only reads the slot map again: the other command completes."""

    async def body() -> None:
        client = connect(redis_cluster_url)
        assert isinstance(client, GatedCluster)
        key = "{t-no-such}list"
        try:
            await client.initialize()
            node = client.get_node_from_key(key)
            assert node is not None

            async def in_use() -> Any:
                await asyncio.sleep(0.1)  # the BLPOP is on its connection, waiting
                (conn,) = [c for c in node._connections if c not in node._free]
                assert conn.is_connected
                return conn

            blocked = asyncio.ensure_future(client.execute_command("BLPOP", key, 0.5))
            conn = await in_use()
            async with client.gated():
                await client.aclose()  # as a retry inside a pipeline does
            assert conn.is_connected, "the connection in use was left to its command"
            assert conn.should_reconnect(), "... and closes once the command is through"
            assert await blocked is None, "the other command ran to its end"
            assert await client.execute_command("PING") is True, "and the client goes on, slot map read again"
            # The control: redis-py's own aclose closes the connection under the command.
            blocked = asyncio.ensure_future(client.execute_command("BLPOP", key, 0.5))
            conn = await in_use()
            await RedisCluster.aclose(client)
            assert not conn.is_connected
            await asyncio.gather(blocked, return_exceptions=True)
        finally:
            await disconnect(client)

    asyncio.run(body())


def test_closing_a_cluster_client_closes_the_connections_of_a_client_that_lost_its_slot_map(
    redis_cluster_url: str,
) -> None:
    """redis-py's cluster ``aclose`` closes nothing once the client holds no slot map (it
    was closed before, and a read of the slot map in a failover failed, leaving open the
    connections it made): their sockets were left to the garbage collector, whose warnings
    failed whichever later test happened to collect them."""

    async def body() -> None:
        client = connect(redis_cluster_url)
        await ready(client)
        await RedisCluster.aclose(client)  # no slot map any more
        node = next(iter(client.nodes_manager.startup_nodes.values()))
        assert await node.execute_command("PING") is True  # as the failed read of the slot map left it
        await disconnect(client)
        assert [c for c in node._connections if c.is_connected] == []

    asyncio.run(body())
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        gc.collect()
    assert [str(w.message) for w in seen if issubclass(w.category, ResourceWarning)] == []
