"""A throwaway Redis Cluster of real ``redis-server`` processes, for integration tests.

    with redis_cluster(masters=3, replicas=1) as cluster:
        client = RedisCluster.from_url(...)  # or cluster.url for dflow
        cluster.kill(port); cluster.wait_failover(port)

Each node listens on a free loopback port, with its cluster bus on a second free port
(``--cluster-port``, Redis 7.0+), and keeps its files in its own folder of one temp dir.
The cluster is built with ``redis-cli --cluster create``. On exit every process is killed
(SIGKILL) and the temp dir deleted.

``reshard`` moves one chosen slot by hand (CLUSTER SETSLOT IMPORTING/MIGRATING, MIGRATE of
its keys, CLUSTER SETSLOT NODE on every master), the steps ``redis-cli --cluster reshard``
takes, because that command picks the slots to move itself.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis

SLOTS = 16384


@dataclass(frozen=True)
class NodeLine:
    """One line of CLUSTER NODES."""

    id: str
    port: int
    flags: frozenset[str]
    master_id: str | None
    slots: tuple[str, ...]

    @property
    def is_master(self) -> bool:
        return "master" in self.flags

    @property
    def failed(self) -> bool:
        return bool(self.flags & {"fail", "fail?", "noaddr", "handshake"})


def parse_nodes(text: str) -> list[NodeLine]:
    """Parse the reply of CLUSTER NODES."""
    nodes = []
    for line in text.strip().splitlines():
        parts = line.split()
        address = parts[1].split("@")[0]
        nodes.append(
            NodeLine(
                id=parts[0],
                port=int(address.rsplit(":", 1)[1]),
                flags=frozenset(parts[2].split(",")),
                master_id=None if parts[3] == "-" else parts[3],
                slots=tuple(parts[8:]),
            )
        )
    return nodes


def _free_ports(count: int) -> list[int]:
    """``count`` distinct free loopback ports (none of them 6379)."""
    with ExitStack() as stack:
        ports: list[int] = []
        while len(ports) < count:
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
            if port != 6379:
                ports.append(port)
        return ports


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"{name} is not installed (not found on PATH): a Redis Cluster needs it")
    return path


def _wait(what: str, done: Callable[[], bool], timeout: float, details: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not reached after {timeout:g} s\n{details()}")
        time.sleep(0.05)


class RedisClusterProcs:
    """The ``redis-server`` processes of one cluster and what tests do with them."""

    def __init__(self, masters: int = 3, replicas: int = 1, node_timeout_ms: int = 2000) -> None:
        self.server = _binary("redis-server")
        self.cli = _binary("redis-cli")
        self.n_masters, self.n_replicas, self.node_timeout_ms = masters, replicas, node_timeout_ms
        self.dir = Path(tempfile.mkdtemp(prefix="dflow-redis-cluster-"))
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.killed: set[int] = set()
        self.ids: dict[int, str] = {}  # port -> node id
        self._replicas_at_kill: dict[int, set[str]] = {}
        self.url = ""
        self.started_in = 0.0  # seconds from the first process to a cluster that is ok

    @property
    def ports(self) -> list[int]:
        """The ports of all nodes, killed ones included, in the order they were started."""
        return list(self.procs)

    @property
    def live_ports(self) -> list[int]:
        return [p for p in self.procs if p not in self.killed]

    # -- lifecycle ------------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> None:
        """Start the nodes, create the cluster, wait until it is ok; RuntimeError if it fails."""
        try:
            self._start(timeout)
        except (subprocess.TimeoutExpired, redis.RedisError, OSError) as exc:
            raise RuntimeError(f"the Redis Cluster did not start: {exc!r}\n{self.logs()}") from exc

    def _start(self, timeout: float) -> None:
        t0 = time.monotonic()
        for _ in range(self.n_masters * (1 + self.n_replicas)):
            self._start_node()
        create = subprocess.run(
            [
                self.cli,
                "--cluster",
                "create",
                *(f"127.0.0.1:{p}" for p in self.procs),
                "--cluster-replicas",
                str(self.n_replicas),
                "--cluster-yes",
            ],
            check=False,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        output = create.stdout + create.stderr
        if create.returncode != 0:
            raise RuntimeError(
                f"redis-cli --cluster create failed ({create.returncode}):\n{output}\n" + self.logs()
            )
        self.ids = {p: str(self._ask(p, "CLUSTER", "MYID")) for p in self.procs}
        self.wait_ok(timeout, extra=output)
        self.url = "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.masters()) + "/"
        self.started_in = time.monotonic() - t0

    def _start_node(self, attempts: int = 3) -> None:
        """Start one node and wait for its PONG; pick other ports if it dies (a port taken)."""
        failures = []
        for _ in range(attempts):
            port, bus = _free_ports(2)
            home = self.dir / str(port)
            home.mkdir()
            with open(home / "redis.log", "wb") as log:
                proc = subprocess.Popen(
                    [
                        self.server,
                        "--port",
                        str(port),
                        "--cluster-port",
                        str(bus),
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        f"nodes-{port}.conf",
                        "--cluster-node-timeout",
                        str(self.node_timeout_ms),
                        "--cluster-replica-validity-factor",
                        "0",
                        "--cluster-allow-replica-migration",
                        "no",
                        "--repl-diskless-sync-delay",
                        "0",
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                        "--dir",
                        str(home),
                        "--bind",
                        "127.0.0.1",
                        "--protected-mode",
                        "no",
                    ],
                    cwd=home,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )
            deadline = time.monotonic() + 10
            while proc.poll() is None and time.monotonic() < deadline:
                if self._pings(port):  # alive and answering: it is ours
                    self.procs[port] = proc
                    return
                time.sleep(0.02)
            proc.kill()
            proc.wait()
            failures.append((home / "redis.log").read_text(errors="replace")[-1500:])
        raise RuntimeError(f"redis-server did not start ({attempts} tries); its last log:\n{failures[-1]}")

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def logs(self, limit: int = 1500) -> str:
        """The tails of the nodes' logs (for error messages)."""
        tails = []
        for port in self.procs:
            text = (self.dir / str(port) / "redis.log").read_text(errors="replace")
            tails.append(f"--- node {port} ---\n{text[-limit:]}")
        return "\n".join(tails)

    # -- asking the nodes -----------------------------------------------------------------

    def node(self, port: int) -> redis.Redis:
        """A plain (non-cluster) client of one node, decoding replies."""
        return redis.Redis(
            host="127.0.0.1", port=port, decode_responses=True, socket_connect_timeout=1, socket_timeout=5
        )

    def _ask(self, port: int, *command: str | int) -> object:
        with self.node(port) as client:
            return client.execute_command(*command)

    def _info(self, port: int) -> tuple[dict[str, str], dict[str, object]]:
        """CLUSTER INFO and INFO replication of one node."""
        with self.node(port) as client:
            text = str(client.execute_command("CLUSTER", "INFO"))
            cluster = dict(line.split(":", 1) for line in text.split() if ":" in line)
            return cluster, client.info("replication")

    def _pings(self, port: int) -> bool:
        try:
            return bool(self._ask(port, "PING"))
        except redis.RedisError:
            return False

    def nodes(self) -> list[NodeLine]:
        """CLUSTER NODES as seen by the first live node that answers."""
        for port in self.live_ports:
            try:
                return parse_nodes(str(self._ask(port, "CLUSTER", "NODES")))
            except redis.RedisError:
                continue
        raise RuntimeError("no node of the cluster answers")

    def masters(self) -> list[int]:
        """The ports of the current masters that are alive, sorted."""
        return sorted(
            n.port for n in self.nodes() if n.is_master and not n.failed and n.port not in self.killed
        )

    def replica_of(self, port: int) -> int:
        """The port of a live replica of the master on ``port``."""
        master_id = self.ids[port]
        for n in self.nodes():
            if n.master_id == master_id and not n.failed and n.port not in self.killed:
                return n.port
        raise LookupError(f"the node on port {port} has no live replica")

    def slot_of(self, key: str) -> int:
        """The hash slot of ``key`` (asked of the cluster: CLUSTER KEYSLOT)."""
        return int(str(self._ask(self.live_ports[0], "CLUSTER", "KEYSLOT", key)))

    def owner_of(self, slot: int) -> int:
        """The port of the master that serves ``slot``."""
        for start, end, master in self._slots(self.live_ports[0]):
            if start <= slot <= end:
                return master
        raise LookupError(f"slot {slot} is not served")

    def _slots(self, port: int) -> list[tuple[int, int, int]]:
        """CLUSTER SLOTS of one node, as (first slot, last slot, master port)."""
        reply = self._ask(port, "CLUSTER", "SLOTS")
        assert isinstance(reply, list)
        return [(int(start), int(end), int(master[1])) for start, end, master, *_ in reply]

    # -- waiting --------------------------------------------------------------------------

    def is_ok(self) -> bool:
        """On every live node: cluster_state ok and all slots served; every live replica linked
        to its master; and all live nodes agree on the slots' owners and on who replicates whom."""
        try:
            views = set()
            for port in self.live_ports:
                info, role = self._info(port)
                if (
                    info.get("cluster_state") != "ok"
                    or int(info["cluster_slots_ok"]) != SLOTS
                    or int(info["cluster_slots_assigned"]) != SLOTS
                ):
                    return False
                if role["role"] == "slave" and role["master_link_status"] != "up":
                    return False
                live = [
                    n
                    for n in parse_nodes(str(self._ask(port, "CLUSTER", "NODES")))
                    if n.port not in self.killed
                ]
                if any(n.failed for n in live):
                    return False
                roles = tuple(sorted((n.port, n.is_master, n.master_id or "") for n in live))
                slots = tuple(sorted(self._slots(port)))
                views.add((roles, slots))
            return len(views) == 1
        except (redis.RedisError, KeyError):
            return False

    def wait_ok(self, timeout: float = 30.0, extra: str = "") -> None:
        """Wait until :meth:`is_ok`; RuntimeError with the nodes' views if it is not in time."""
        _wait("cluster_state:ok on every node", self.is_ok, timeout, lambda: extra + self._describe())

    def _describe(self) -> str:
        lines = []
        for port in self.live_ports:
            try:
                lines.append(f"--- CLUSTER NODES of {port} ---\n{self._ask(port, 'CLUSTER', 'NODES')}")
                info, _ = self._info(port)
                lines.append(
                    f"cluster_state:{info.get('cluster_state')} slots_ok:{info.get('cluster_slots_ok')}"
                )
            except redis.RedisError as exc:
                lines.append(f"--- {port}: {exc!r}")
        return "\n".join(lines)

    # -- faults and changes ---------------------------------------------------------------

    def kill(self, port: int) -> None:
        """kill -9 the node on ``port`` (its replicas are noted for :meth:`wait_failover`)."""
        self._replicas_at_kill[port] = {n.id for n in self.nodes() if n.master_id == self.ids[port]}
        self.procs[port].kill()
        self.procs[port].wait()
        self.killed.add(port)

    def wait_failover(self, old_master_port: int, timeout: float = 30.0) -> int:
        """Wait until a replica of the killed master is a master and the cluster is ok;
        return its port."""
        replicas = self._replicas_at_kill[old_master_port]
        promoted: list[int] = []

        def done() -> bool:
            try:
                promoted[:] = [n.port for n in self.nodes() if n.id in replicas and n.is_master]
            except RuntimeError:
                return False
            return bool(promoted) and self.is_ok()

        _wait(f"failover of the master on port {old_master_port}", done, timeout, self._describe)
        return promoted[0]

    def reshard(self, slot: int, to_port: int, timeout: float = 30.0) -> None:
        """Move ``slot`` and its keys from its owner to the master on ``to_port``, by hand
        (the steps of ``redis-cli --cluster reshard``, which cannot be told which slot)."""
        from_port = self.owner_of(slot)
        if from_port == to_port:
            raise ValueError(f"slot {slot} is already on port {to_port}")
        source, target = self.ids[from_port], self.ids[to_port]
        self._ask(to_port, "CLUSTER", "SETSLOT", slot, "IMPORTING", source)
        self._ask(from_port, "CLUSTER", "SETSLOT", slot, "MIGRATING", target)
        while True:
            keys = self._ask(from_port, "CLUSTER", "GETKEYSINSLOT", slot, 100)
            assert isinstance(keys, list)
            if not keys:
                break
            self._ask(from_port, "MIGRATE", "127.0.0.1", to_port, "", 0, 5000, "KEYS", *keys)
        for port in [to_port, from_port, *(p for p in self.masters() if p not in (to_port, from_port))]:
            self._ask(port, "CLUSTER", "SETSLOT", slot, "NODE", target)
        self.wait_ok(timeout)


@contextmanager
def redis_cluster(
    masters: int = 3, replicas: int = 1, node_timeout_ms: int = 2000, timeout: float = 30.0
) -> Iterator[RedisClusterProcs]:
    """Start a cluster, wait until it is ok, yield it; kill its processes and delete its files after.

    RuntimeError if ``redis-server``/``redis-cli`` is missing or the cluster does not come up
    within ``timeout`` seconds (the message has the redis-cli output and the nodes' views).
    """
    cluster = RedisClusterProcs(masters, replicas, node_timeout_ms)
    try:
        cluster.start(timeout)
        yield cluster
    finally:
        cluster.stop()
