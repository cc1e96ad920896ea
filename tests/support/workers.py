"""Processes for integration tests: ``dflow worker`` processes (start, kill -9, stop
gracefully), a ``dflow serve`` process, the transport URLs they share, and a cluster of
workers with this process as their client."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

import dflow
from tests.integration.conftest import SECRET, kafka_test_settings

if TYPE_CHECKING:
    import pytest
    from typing_extensions import Self

ROOT = Path(__file__).resolve().parents[2]
# Group settings for worker processes: a member that dies is noticed after the session timeout.
KAFKA_GROUP = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 500, "metadata_max_age_ms": 30000}
_LISTENING = re.compile(r"listening on (http://[0-9.]+:[0-9]+)")


def streams_transport(redis_url: str, prefix: str) -> str:
    """Redis Streams under ``prefix``, a step redelivered 2 s after its worker died."""
    return f"{redis_url}?stream={prefix}:steps&redeliver_after=2"


def kafka_transport(bootstrap: str, prefix: str, **group: object) -> str:
    """Kafka topics and a consumer group named after ``prefix``, 4 partitions, the test settings
    (``group`` overrides those of ``KAFKA_GROUP``)."""
    settings = "&".join(f"{k}={v}" for k, v in {**kafka_test_settings(), **KAFKA_GROUP, **group}.items())
    return f"kafka://{bootstrap}?topic={prefix}-steps&group={prefix}-workers&partitions=4&{settings}"


def transport_for(request: pytest.FixtureRequest, redis_url: str, prefix: str) -> str:
    """The transport of a fixture parametrized over ``["redis-streams", "kafka"]``: Redis
    Streams under ``prefix``, or Kafka on the test broker (the store is Redis either way)."""
    if request.param == "kafka":
        return kafka_transport(request.getfixturevalue("kafka_bootstrap"), prefix)
    return streams_transport(redis_url, prefix)


def _pythonpath() -> str:
    """This checkout first, then what this process was given (kept for its processes)."""
    return os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)


class Workers:
    """``dflow worker`` processes serving ``module`` on ``transport``/``store``."""

    def __init__(
        self,
        module: str,
        transport: str,
        store: str,
        env: dict[str, str],
        *,
        concurrency: int = 16,
        lease: float | None = 5.0,
        grace: float = 10.0,
        args: tuple[str, ...] = (),
    ) -> None:
        self.module = module
        self.grace = grace
        self.args = args
        self.transport = transport
        self.store = store
        self.env = {**os.environ, **env, "PYTHONPATH": _pythonpath()}
        self.concurrency = concurrency
        self.lease = lease
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []
        self.killed = 0

    def start(self, n: int = 1, *, wait: bool = True) -> None:
        """Start ``n`` workers; with ``wait``, wait until every worker serves."""
        for _ in range(n):
            fd, name = tempfile.mkstemp(prefix="dflow-worker-", suffix=".log")
            log = Path(name)
            self.logs.append(log)
            with os.fdopen(fd, "wb") as out:
                self.procs.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "dflow.cli",
                            "worker",
                            self.module,
                            "--transport",
                            self.transport,
                            "--store",
                            self.store,
                            "--concurrency",
                            str(self.concurrency),
                            *(() if self.lease is None else ("--lease", str(self.lease))),
                            "--grace",
                            str(self.grace),
                            *self.args,
                        ],
                        cwd=ROOT,
                        env=self.env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    )
                )
        if wait:
            self.wait_ready()

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        for proc, log in zip(self.procs, self.logs):
            while proc.poll() is None and b"serving" not in log.read_bytes():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"worker did not start: {log.read_text()[-2000:]}")
                time.sleep(0.05)

    def alive(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in self.procs if p.poll() is None]

    def kill_one(self) -> None:
        """kill -9 the oldest live worker."""
        victim = self.alive()[0]
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        self.killed += 1

    def stop(self, timeout: float = 20) -> list[int]:
        """SIGTERM every worker and wait; returns their exit codes."""
        for p in self.alive():
            p.send_signal(signal.SIGTERM)
        codes = []
        for p in self.procs:
            try:
                codes.append(p.wait(timeout))
            except subprocess.TimeoutExpired:
                p.kill()
                codes.append(p.wait())
        self.procs = []
        return codes

    def output(self) -> str:
        return "\n".join(f"--- {log}\n{log.read_text(errors='replace')[-3000:]}" for log in self.logs)


class Serve:
    """A ``dflow serve`` process serving ``module`` (``args`` added to its command line);
    ``url`` once it listens."""

    def __init__(
        self, module: str, transport: str, store: str, env: dict[str, str], *args: str, grace: float = 2
    ) -> None:
        fd, name = tempfile.mkstemp(prefix="dflow-serve-", suffix=".log")
        self.log = Path(name)
        with os.fdopen(fd, "wb") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "dflow.cli",
                    "serve",
                    module,
                    "--transport",
                    transport,
                    "--store",
                    store,
                    "--port",
                    "0",
                    "--grace",
                    str(grace),
                    *args,
                ],
                cwd=ROOT,
                env={**os.environ, **env, "PYTHONPATH": _pythonpath()},
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 30
        while (found := _LISTENING.search(self.output())) is None:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"dflow serve did not start:\n{self.output()[-3000:]}")
            time.sleep(0.05)
        self.url = found.group(1)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> int:
        """SIGTERM and wait (kill after 20 s); the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


class Served:
    """One ``dflow worker`` and ``dflow serve`` (``serve_args`` added to its command line),
    both serving ``module`` on ``transport``, the store in Redis under ``prefix``. Left as a
    context, it stops both, and ``dflow serve`` must have exited cleanly (unless the block
    raised)."""

    def __init__(
        self, module: str, redis_url: str, prefix: str, transport: str, env: dict[str, str], *serve_args: str
    ) -> None:
        self.prefix = prefix
        self.redis_url = redis_url
        self.env = env
        store = f"{redis_url}?prefix={prefix}&redispatch_after=2"
        self.workers = Workers(module, transport, store, env, lease=2.0)
        self.workers.start(1)
        try:
            self.serve = Serve(module, transport, store, env, *serve_args)
        except BaseException:
            self.workers.stop()
            raise

    def close(self) -> int:
        """Stop everything; the exit code of ``dflow serve``."""
        code = self.serve.stop()
        self.workers.stop()
        return code

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        code = self.close()
        if exc is None:
            assert code == 0, f"dflow serve exits cleanly on SIGTERM:\n{self.serve.output()[-3000:]}"


class Cluster:
    """``dflow worker`` processes serving ``module`` (none started yet) on ``transport_url``
    (Redis Streams under ``prefix`` unless given), the Redis store under ``prefix``, and this
    process as their client once :meth:`connect` ed. ``env`` adds to the workers' environment
    (the secret, and no network model); ``lease``: seconds before the step of a killed worker
    is taken over."""

    def __init__(
        self,
        module: str,
        redis_url: str,
        prefix: str,
        *,
        transport_url: str | None = None,
        env: dict[str, str] | None = None,
        lease: float = 2.0,
    ) -> None:
        import redis

        self.redis_url = redis_url
        self.prefix = prefix
        self.transport_url = transport_url or streams_transport(redis_url, prefix)
        self.store_url = f"{redis_url}?prefix={prefix}&redispatch_after=2"
        self.workers = Workers(
            module,
            self.transport_url,
            self.store_url,
            {"DFLOW_SECRET": SECRET, "DFLOW_AGENTS_BLOCK_NETWORK": "1", **(env or {})},
            lease=lease,
        )
        self.r = redis.Redis.from_url(redis_url, decode_responses=True)

    def connect(self) -> None:
        """Make this process a client of the workers (it runs no step itself)."""
        dflow.configure(self.transport_url, self.store_url, secret=SECRET, consume=False)

    def counts(self, key: str) -> dict[str, int]:
        """The Redis hash ``key``, its values as numbers."""
        return {str(k): int(v) for k, v in self.r.hgetall(key).items()}

    def close(self) -> None:
        self.workers.stop()
        dflow.shutdown()
        self.r.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def deadlines_key(c: Cluster) -> str:
    """The Redis key of the deadline timers of ``c``'s store (one bucket on one server: its
    prefix is the store's)."""
    keys = [str(k) for k in c.r.scan_iter(f"{c.prefix}*:deadlines")]
    assert len(keys) <= 1, keys
    return keys[0] if keys else f"{c.prefix}:deadlines"
