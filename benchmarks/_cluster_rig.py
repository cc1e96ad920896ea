"""The apparatus of bench_cluster.py: the Redis servers it starts (one server, clusters of
1 to 3 masters), where each bucket's keys live, what each node says in INFO (less this
script's own reads), the worker processes and their CPU time, MONITOR on every master, and
the XLEN poll that tells when every stream is empty."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from redis.crc import key_slot

from benchmarks import _procs
from benchmarks._cluster_report import redis_cli_ranges
from dflow.adapters.redis.keyspace import Keyspace
from tests.support.redis_cluster import RedisClusterProcs, redis_cluster

ROOT = Path(__file__).resolve().parents[1]
SECRET = "bench-secret-of-at-least-32-bytes-000"
HOST = "127.0.0.1"
SINGLE_DB = 15
CONCURRENCY = 64  # steps a worker runs at once (the default)
NOT_COUNTED = {"info", "monitor"}  # this script's own
LOGS: dict[int, Path] = {}  # worker pid -> its log


def resp(*args: bytes) -> bytes:
    """A command as the client sends it (RESP)."""
    return f"*{len(args)}\r\n".encode() + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


# -- where the keys are ----------------------------------------------------------------


@dataclass
class Target:
    """One server or one cluster: its nodes, dflow's URLs on it, and which node holds each bucket."""

    name: str
    masters: list[int]
    replicas: list[int]
    base: str  # the URL without dflow's settings
    cluster: bool
    streams: int
    owners: list[int] = field(default_factory=list)  # bucket -> master port
    prefix: str = "bc"
    stream: str = "bcs"
    wait: int = 0
    tag: str = "t"  # names its workers' logs

    def __post_init__(self) -> None:
        self.keyspace = Keyspace(self.streams, cluster=self.cluster)
        self.db = SINGLE_DB if not self.cluster else 0

    @property
    def transport(self) -> str:
        return f"{self.base}?stream={self.stream}&streams={self.streams}"

    @property
    def store(self) -> str:
        return f"{self.base}?prefix={self.prefix}&streams={self.streams}" + (
            f"&wait={self.wait}" if self.wait else ""
        )

    def stream_names(self) -> tuple[str, ...]:
        return self.keyspace.names(self.stream, "stream")

    def run_key(self, trace: str) -> tuple[int, str]:
        """The master that holds run ``trace`` and its record's key."""
        at = self.keyspace.index(trace)
        return self.owners[at], f"{self.keyspace.names(self.prefix, 'prefix')[at]}:r:{trace}"


def cluster_target(name: str, cluster: Any, tag: str, wait: int = 0, streams: int = 16) -> Target:
    masters = cluster.masters()
    tags = Keyspace(streams, cluster=True).tags
    owners = [cluster.owner_of(key_slot(f"{{{t}}}".encode())) for t in tags]
    replicas = [p for p in cluster.live_ports if p not in masters]
    return Target(
        name,
        masters,
        replicas,
        cluster.url,
        True,
        streams,
        owners,
        prefix=f"bc{tag}",
        stream=f"bcs{tag}",
        wait=wait,
        tag=tag,
    )


class SmallCluster(RedisClusterProcs):
    """Masters without replicas, joined by hand: ``redis-cli --cluster create`` wants 3 or more.
    Each master adds the slot range redis-cli would give it, then meets the first."""

    def _start(self, timeout: float) -> None:
        t0 = time.monotonic()
        for _ in range(self.n_masters):
            self._start_node()
        ports = list(self.procs)
        for epoch, (port, (first, last)) in enumerate(zip(ports, redis_cli_ranges(len(ports))), 1):
            self._ask(port, "CLUSTER", "ADDSLOTSRANGE", first, last)
            self._ask(port, "CLUSTER", "SET-CONFIG-EPOCH", epoch)
        with self.node(ports[0]) as first:
            bus = first.config_get("cluster-port")["cluster-port"]
        for port in ports[1:]:
            self._ask(port, "CLUSTER", "MEET", HOST, ports[0], bus)
        self.ids = {p: str(self._ask(p, "CLUSTER", "MYID")) for p in ports}
        self.wait_ok(timeout)
        self.url = "redis+cluster://" + ",".join(f"{HOST}:{p}" for p in self.masters()) + "/"
        self.started_in = time.monotonic() - t0


@contextlib.contextmanager
def cluster_of(masters: int, replicas: int = 0) -> Iterator[RedisClusterProcs]:
    """A cluster of this script's own (made by hand below 3 masters), stopped after the block."""
    if masters >= 3:
        with redis_cluster(masters=masters, replicas=replicas) as c:
            yield c
        return
    assert replicas == 0
    c = SmallCluster(masters, 0)
    try:
        c.start()
        yield c
    finally:
        c.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def one_server() -> Iterator[Target]:
    """A plain ``redis-server`` with the cluster nodes' settings (no saving, no AOF)."""
    home = Path(tempfile.mkdtemp(prefix="dflow-bench-redis-"))
    port = free_port()
    with open(home / "redis.log", "wb") as out:
        proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(home),
                "--bind",
                HOST,
                "--protected-mode",
                "no",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        r = redis.Redis(host=HOST, port=port)
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(redis.ConnectionError):
                if r.ping():
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start: {(home / 'redis.log').read_text()[-1000:]}")
            time.sleep(0.02)
        r.close()
        yield Target(
            "one redis-server (redis://, db 15)",
            [port],
            [],
            f"redis://{HOST}:{port}/{SINGLE_DB}",
            False,
            1,
            [port],
            tag="single",
        )
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(home, ignore_errors=True)


# -- INFO of each node -----------------------------------------------------------------


@dataclass
class Info:
    """INFO commandstats, stats and cpu of one node, and the size of the request and its reply."""

    calls: dict[str, int]
    usec: dict[str, int]
    net_in: int
    net_out: int
    repl_in: int
    repl_out: int
    errors: int
    connections: int
    cpu: float
    sent: int
    got: int


_INFO = resp(b"INFO", b"commandstats", b"stats", b"cpu")


def info(port: int) -> Info:
    """Read on a connection of its own, so that its bytes are known exactly."""
    with socket.create_connection((HOST, port), timeout=10) as s:
        s.sendall(_INFO)
        buf = b""
        while b"\r\n" not in buf:
            buf += s.recv(1 << 16)
        head, _, body = buf.partition(b"\r\n")
        size = int(head[1:])
        while len(body) < size + 2:
            body += s.recv(1 << 16)
    fields = dict(line.split(":", 1) for line in body[:size].decode().splitlines() if ":" in line)
    calls, usec = {}, {}
    for k, v in fields.items():
        if k.startswith("cmdstat_"):
            stat = dict(part.split("=", 1) for part in v.split(","))
            calls[k.removeprefix("cmdstat_")] = int(stat["calls"])
            usec[k.removeprefix("cmdstat_")] = int(stat["usec"])
    total = {
        k: int(fields[f"total_{k}"])
        for k in (
            "net_input_bytes",
            "net_output_bytes",
            "net_repl_input_bytes",
            "net_repl_output_bytes",
            "error_replies",
            "connections_received",
        )
    }
    return Info(
        calls,
        usec,
        net_in=total["net_input_bytes"],
        net_out=total["net_output_bytes"],
        repl_in=total["net_repl_input_bytes"],
        repl_out=total["net_repl_output_bytes"],
        errors=total["error_replies"],
        connections=total["connections_received"],
        cpu=float(fields["used_cpu_user"]) + float(fields["used_cpu_sys"]),
        sent=len(_INFO),
        got=len(head) + size + 4,
    )


def info_all(ports: list[int]) -> dict[int, Info]:
    return {p: info(p) for p in ports}


def delta(a: Info, b: Info) -> dict[str, Any]:
    """What a node did between two reads, less the reads themselves (the first one's reply
    and the second one's request fall in between). ``net_in``/``net_out``: with clients;
    ``repl_in``/``repl_out``: with the other end of replication (Redis 7.0 counts those in
    the totals too)."""
    calls = Counter({k: n - a.calls.get(k, 0) for k, n in b.calls.items() if k not in NOT_COUNTED})
    usec = {k: n - a.usec.get(k, 0) for k, n in b.usec.items() if k not in NOT_COUNTED}
    repl_in, repl_out = b.repl_in - a.repl_in, b.repl_out - a.repl_out
    return {
        "calls": +calls,
        "usec": usec,
        "net_in": b.net_in - a.net_in - b.sent - repl_in,
        "net_out": b.net_out - a.net_out - a.got - repl_out,
        "repl_in": repl_in,
        "repl_out": repl_out,
        "error_replies": b.errors - a.errors,
        "connections": b.connections - a.connections - 1,
        "cpu_s": b.cpu - a.cpu,
    }


# -- processes -------------------------------------------------------------------------


def proc_cpu(pids: list[int]) -> float:
    """CPU seconds (user + system) the processes ``pids`` used so far."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{pid}/stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def workers(n: int, t: Target, tag: str) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``n`` dflow workers on ``t``, started side by side; stopped after the block."""
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[Path] = []
    cmd = _procs.worker_cmd("benchmarks._bench_flows", t.transport, t.store, CONCURRENCY)
    env = {**os.environ, "DFLOW_SECRET": SECRET, "PYTHONPATH": str(ROOT)}
    try:
        for i in range(n):
            logs.append(_procs.log_path(f"cluster-{tag}-{i}"))
            with open(logs[-1], "wb") as out:
                procs.append(
                    subprocess.Popen(
                        cmd,
                        cwd=ROOT,
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                    )
                )
        LOGS.update((p.pid, path) for p, path in zip(procs, logs))
        deadline = time.monotonic() + 60 + 3 * n
        for proc, path in zip(procs, logs):
            while "serving" not in path.read_text(errors="replace"):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"a worker did not start: {path.read_text(errors='replace')[-1500:]}")
                time.sleep(0.05)
        yield procs
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
        for proc in procs:
            _procs.stop(proc)


def log_problems(pids: list[int]) -> list[str]:
    """The warnings and errors the workers ``pids`` logged."""
    found = []
    for pid in pids:
        for line in LOGS[pid].read_text(errors="replace").splitlines():
            if re.search(r"^\S+ \S+ (WARNING|ERROR|CRITICAL) ", line):
                found.append(line.strip()[:300])
    return found


# -- MONITOR ---------------------------------------------------------------------------

_MON = re.compile(r'^\d+\.\d+ \[\d+ ([^\]]+)\] "([^"]+)"')


@contextlib.contextmanager
def monitors(ports: list[int]) -> Iterator[dict[int, Path]]:
    """``redis-cli monitor`` on each node for the block; the files they wrote."""
    paths = {p: _procs.log_path(f"cluster-monitor-{p}") for p in ports}
    procs = []
    try:
        for port, path in paths.items():
            with open(path, "wb") as out:
                procs.append(
                    subprocess.Popen(
                        ["redis-cli", "-h", HOST, "-p", str(port), "monitor"],
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                    )
                )
        deadline = time.monotonic() + 10
        for path in paths.values():
            while b"OK" not in path.read_bytes()[:10]:
                if time.monotonic() > deadline:
                    raise RuntimeError("redis-cli monitor did not start")
                time.sleep(0.02)
        yield paths
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(5)


def monitored(paths: dict[int, Path]) -> tuple[Counter[str], Counter[str]]:
    """The commands clients sent, and those scripts ran, from MONITOR files."""
    sent: Counter[str] = Counter()
    inner: Counter[str] = Counter()
    for path in paths.values():
        for line in path.read_text(errors="replace").splitlines():
            m = _MON.match(line)
            if m and m.group(2).lower() not in NOT_COUNTED:
                (inner if m.group(1) == "lua" else sent)[m.group(2).lower()] += 1
        path.unlink()
    return sent, inner


# -- the end of a round ----------------------------------------------------------------


class StreamPoll:
    """XLEN of every stream on the master that holds it, counting what that sends each node."""

    def __init__(self, t: Target) -> None:
        self.nodes = {p: redis.Redis(host=HOST, port=p, db=t.db) for p in t.masters}
        self.by_node: dict[int, list[str]] = {p: [] for p in t.masters}
        for name, port in zip(t.stream_names(), t.owners):
            self.by_node[port].append(name)
        self.sent: Counter[int] = Counter()  # bytes
        self.got: Counter[int] = Counter()
        self.calls: Counter[int] = Counter()

    def left(self) -> int:
        total = 0
        for port, names in self.by_node.items():
            if not names:
                continue
            pipe = self.nodes[port].pipeline(transaction=False)
            for s in names:
                pipe.xlen(s)
            lengths = pipe.execute()
            self.calls[port] += len(names)
            self.sent[port] += sum(len(resp(b"XLEN", s.encode())) for s in names)
            self.got[port] += sum(len(f":{n}\r\n") for n in lengths)
            total += sum(lengths)
        return total

    def reset(self) -> None:
        self.sent, self.got, self.calls = Counter(), Counter(), Counter()

    def close(self) -> None:
        for r in self.nodes.values():
            r.close()
