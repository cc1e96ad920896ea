"""The processes of the benchmarks: ``dflow worker``
and ``dflow serve`` started in sessions of their own with their output in a log, waited for
until they say they are ready, and stopped."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import dflow

ROOT = Path(__file__).resolve().parent.parent


def log_path(name: str) -> Path:
    """A log file for the process ``name``, stamped with the time, under the temporary folder."""
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / "dflow-bench" / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    return logs / f"{name}-{time.strftime('%H%M%S')}.log"


def start(
    cmd: list[str],
    log: Path,
    env: dict[str, str],
    ready: str,
    timeout: float = 60,
    *,
    cwd: Path = ROOT,
    pythonpath: str | None = None,
) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``cmd`` (in ``cwd``, this repository by default, ``env`` over this process's
    environment, with ``pythonpath`` or this repository as its ``PYTHONPATH``) with its output
    in ``log``; once the log matches the pattern ``ready``, the process and the match."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env={**os.environ, **env, "PYTHONPATH": pythonpath or str(ROOT)},
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    deadline = time.monotonic() + timeout
    while (found := re.search(ready, log.read_text(errors="replace"))) is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc)
            raise RuntimeError(
                f"{' '.join(cmd[3:5])} did not start: {log.read_text(errors='replace')[-1500:]}"
            )
        time.sleep(0.05)
    return proc, found.group(0)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 15 s."""
    proc.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(15)
    if proc.poll() is None:
        proc.kill()


def worker_cmd(module: str, transport: str, store: str, concurrency: int) -> list[str]:
    """``dflow worker module`` on ``transport`` and ``store``."""
    return [
        sys.executable,
        "-m",
        "dflow.cli",
        "worker",
        module,
        "--transport",
        transport,
        "--store",
        store,
        "--concurrency",
        str(concurrency),
        "--grace",
        "5",
    ]


@contextlib.contextmanager
def one_worker(
    module: str, name: str, secret: str, concurrency: int, env: dict[str, str] | None = None
) -> Iterator[tuple[str, str]]:
    """A Redis server of this benchmark's own (:func:`benchmarks._fair.own_redis`), one
    ``dflow worker`` serving ``module`` on its Redis Streams (stream and store prefix ``name``,
    ``env`` over the environment), and this process its client; yields the transport's and the store's URLs. After
    the block, the worker and the server are stopped (nothing shared is flushed)."""
    from benchmarks._fair import own_redis

    with own_redis() as server:
        redis_url = f"{server}/0"
        transport = f"{redis_url}?stream={name}"
        store = f"{redis_url}?prefix={name}"
        worker = None
        try:
            worker, _ = start(
                worker_cmd(module, transport, store, concurrency),
                log_path(f"{name}-worker"),
                {"DFLOW_SECRET": secret, **(env or {})},
                "serving",
            )
            dflow.configure(transport, store, secret=secret, consume=False)
            yield transport, store
        finally:
            with contextlib.suppress(Exception):
                dflow.shutdown()
            if worker is not None:
                stop(worker)
