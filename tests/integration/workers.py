"""Worker processes for integration tests: start, kill -9, stop gracefully."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class Workers:
    """``dflow worker`` processes serving ``module`` on ``transport``/``store``."""

    def __init__(self, module: str, transport: str, store: str, env: dict[str, str], *, concurrency: int = 16,
                 lease: float = 5.0) -> None:
        self.module = module
        self.transport = transport
        self.store = store
        self.env = {**os.environ, **env, "PYTHONPATH": str(ROOT)}
        self.concurrency = concurrency
        self.lease = lease
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []
        self.killed = 0

    def start(self, n: int = 1) -> None:
        for _ in range(n):
            fd, name = tempfile.mkstemp(prefix="dflow-worker-", suffix=".log")
            log = Path(name)
            self.logs.append(log)
            with os.fdopen(fd, "wb") as out:
                self.procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "dflow.cli", "worker", self.module, "--transport", self.transport,
                         "--store", self.store, "--concurrency", str(self.concurrency), "--lease",
                         str(self.lease), "--grace", "10"],
                        cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                    )
                )
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
