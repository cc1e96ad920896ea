"""What the side-by-side benchmarks share (bench_peers.py, bench_agents.py, bench_hiredis.py,
bench_compare.py): a Redis server of their own, rounds that take the systems in turn, the
median of per-round ratios, the machine's load while they ran, and a table with its caveats.

A benchmark never touches a Redis it did not start: :func:`own_redis` starts a
``redis-server`` on a free loopback port, without persistence, and stops it afterwards, so
nothing is flushed and nobody else's keys are read or counted.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

_CLK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    """A TCP port on the loopback interface that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def own_redis() -> Iterator[str]:
    """A ``redis-server`` of this benchmark's own on a free port (no snapshots, no append-only
    file, in a temporary folder); yields its URL without a db (``redis://127.0.0.1:PORT``)."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("redis-server is not on PATH: install Redis (e.g. apt-get install redis-server)")
    port = free_port()
    folder = tempfile.mkdtemp(prefix="dflow-bench-redis-")
    cmd = [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen(
        [*cmd, "--dir", folder], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        _wait_for_port(port, proc)
        yield f"redis://127.0.0.1:{port}"
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        if proc.poll() is None:
            proc.kill()
        shutil.rmtree(folder, ignore_errors=True)


def _wait_for_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server on port {port} exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"redis-server did not listen on port {port} within {timeout:.0f} s")


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of the process ``pid`` so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLK


def group_cpu(pgid: int) -> float:
    """User + system CPU seconds so far of the live processes of the process group ``pgid``."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid:
                total += (int(fields[11]) + int(fields[12])) / _CLK
    return total


def rounds(
    systems: Mapping[str, Callable[[], float]], count: int, *, load: Load | None = None
) -> dict[str, list[float]]:
    """Run every system once per round, ``count`` rounds, starting each round one system
    further on (so that none always runs first, after a pause, or last); each call returns
    one figure. The load average is sampled into ``load`` after each round. The figures by
    system, in round order."""
    names = list(systems)
    seen: dict[str, list[float]] = {n: [] for n in names}
    for i in range(count):
        order = names[i % len(names) :] + names[: i % len(names)]
        for name in order:
            seen[name].append(systems[name]())
        if load is not None:
            load.sample()
        print(f"  round {i + 1}/{count} done, load average {os.getloadavg()[0]:.2f}", flush=True)
    return seen


def ratio(seen: Mapping[str, Sequence[float]], name: str, base: str) -> float:
    """The median over rounds of ``name``'s figure divided by ``base``'s of the same round."""
    return statistics.median(a / b for a, b in zip(seen[name], seen[base], strict=True))


def spread(xs: Sequence[float]) -> str:
    """The lowest and highest of ``xs`` relative to their median, as ``-a% / +b%``."""
    mid = statistics.median(xs)
    return f"-{(1 - min(xs) / mid) * 100:.0f}% / +{(max(xs) / mid - 1) * 100:.0f}%"


class Load:
    """The load average (1 minute) seen before, during (sampled by :meth:`sample`) and after a run."""

    def __init__(self) -> None:
        self.samples = [os.getloadavg()[0]]

    def sample(self) -> None:
        self.samples.append(os.getloadavg()[0])

    def summary(self) -> dict[str, float]:
        self.sample()
        return {
            "before": self.samples[0],
            "max": max(self.samples),
            "after": self.samples[-1],
            "cores": float(os.cpu_count() or 0),
        }

    @staticmethod
    def text(load: Mapping[str, float]) -> str:
        return (
            f"load average (1 min) {load['before']:.2f} before, up to {load['max']:.2f} during, "
            f"{load['after']:.2f} after, on {load['cores']:.0f} cores"
        )


NOISE = (
    "The machine was shared with other work while this ran: absolute times move from run to run, "
    "so compare the ratios, each the median of per-round ratios (every round runs each system once, "
    "in turn)."
)


def table(header: Sequence[str], rows: Sequence[Sequence[Any]], *, right_from: int = 1) -> list[str]:
    """A markdown table: ``header``, then ``rows`` (cells as given), columns from ``right_from`` on
    aligned right."""
    align = ["---" if i < right_from else "---:" for i in range(len(header))]
    return [
        "| " + " | ".join(header) + " |",
        "| " + " | ".join(align) + " |",
        *("| " + " | ".join(str(c) for c in row) + " |" for row in rows),
    ]


def ms(seconds: float) -> str:
    """A duration in ms (µs under 1 ms)."""
    return f"{seconds * 1e3:.2f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.0f} µs"
