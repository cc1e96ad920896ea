"""A redis-server of the test's own, on a free port, to stop, kill and start again
(the shared Redis of the other tests is never taken down)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from .conftest import require


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class OwnRedis:
    """``redis-server`` with its append-only file on, in ``workdir``; ``url`` of its db 0."""

    def __init__(self, workdir: Path) -> None:
        self.port = _free_port()
        self.dir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--appendonly",
                "yes",
                "--save",
                "",
                "--dir",
                str(self.dir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.05)
        client.close()

    def stop(self) -> None:
        """A clean shutdown (SIGTERM): Redis flushes its append-only file."""
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None

    def kill(self) -> None:
        """kill -9: connections drop at once (what it acknowledged is in its append-only file)."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    require("redis-server", shutil.which("redis-server") is not None)
    r = OwnRedis(tmp_path)
    r.start()
    yield r
    r.stop()
