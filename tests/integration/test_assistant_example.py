"""The assistant example (``examples/assistant``) distributed, every part its own process:
``dflow worker examples.assistant.app`` processes, ``dflow serve examples.assistant.app``,
and ``python -m examples.assistant.client`` (the browser plug-in, serving the demo shop
itself), with the scripted model, the store and the pulled jobs in Redis:

* on Redis Streams: the plan runs on the worker, the plug-in fetches the crawl's pages and
  answers the question, all over HTTP;
* a worker killed with ``kill -9`` while the question to the user is outstanding: a second
  worker takes the run on after the user answers on the plug-in's stdin;
* on Kafka: the same chat.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import IO, Any

import pytest
import redis

from tests.support.workers import ROOT, Served, kafka_transport, streams_transport

from .conftest import SECRET

APP = "examples.assistant.app"
ADMIN = "admin-token-of-the-assistant-integration-tests-0123"
SERVER_SECRET = "server-secret-of-the-assistant-integration-tests-01"
LOOKS = [
    "Striped T-shirt, Beige chinos and White canvas sneakers",
    "Striped T-shirt, Straight jeans and White canvas sneakers",
    "Linen shirt, Beige chinos and White canvas sneakers",
]
PAGES = ["", "c/top", "p/striped-tee.html"]

pytestmark = [pytest.mark.filterwarnings("ignore::ResourceWarning")]


def _env(redis_url: str, prefix: str) -> dict[str, str]:
    return {
        "DFLOW_SECRET": SECRET,
        "DFLOW_SERVER_SECRET": SERVER_SECRET,
        "DFLOW_SERVER_TOKEN": ADMIN,
        "DFLOW_AGENTS_BLOCK_NETWORK": "1",
        "OPENAI_BASE_URL": "",
        "OPENAI_MODEL": "",  # the scripted model
        "PYTHONPATH": str(ROOT),
    }


class Plugin:
    """``python -m examples.assistant.client``: the plug-in as a process; its output read as it comes."""

    def __init__(self, server: str, env: dict[str, str], *, ask: str) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "examples.assistant.client",
                "--server",
                server,
                "--admin-token",
                ADMIN,
                "--ask",
                ask,
                "--json",
                "--timeout",
                "60",
            ],
            cwd=ROOT,
            env={**os.environ, **env},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self._new: queue.Queue[str] = queue.Queue()
        assert self.proc.stdout is not None
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.lines.append(line.rstrip("\n"))
            self._new.put(line)

    def wait_for(self, text: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            left = deadline - time.monotonic()
            assert left > 0 and self.proc.poll() is None, f"no {text!r} from the plug-in:\n" + "\n".join(
                self.lines
            )
            try:
                self._new.get(timeout=min(left, 0.5))
            except queue.Empty:
                pass

    def answer(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def outcome(self, timeout: float = 60) -> dict[str, Any]:
        """The plug-in's exit, and the outcome it printed (its last line)."""
        code = self.proc.wait(timeout)
        time.sleep(0.1)  # the reader has the last lines
        output = "\n".join(self.lines)
        assert code == 0, f"the plug-in exited {code}:\n{output[-4000:]}"
        data: dict[str, Any] = json.loads(self.lines[-1])
        return data


class Cluster(Served):
    """A worker and ``dflow serve`` on one transport; the store and the jobs in Redis."""

    def __init__(self, redis_url: str, prefix: str, transport: str) -> None:
        super().__init__(
            APP, redis_url, prefix, transport, _env(redis_url, prefix), "--pipeline", "planning.assistant"
        )
        self.r = redis.Redis.from_url(redis_url, decode_responses=True)

    def plugin(self, ask: str = "first") -> Plugin:
        return Plugin(self.serve.url, self.env, ask=ask)

    def close(self) -> int:
        code = super().close()
        self.r.close()
        return code


def check_chat(c: Cluster, out: dict[str, Any], chosen: int) -> None:
    """The chat ended as planned, its jobs done by the plug-in over HTTP and kept in Redis."""
    result = out["result"]
    assert out["status"] == "done" and result["status"] == "finished", out
    assert [(s["index"], s["status"]) for s in result["steps"]] == [
        (0, "finished"),
        (1, "finished"),
        (2, "finished"),
    ]
    shop = out["jobs"][0]["arguments"]["url"]
    assert [(j["tool"], j["http"]) for j in out["jobs"]] == [("fetch_page", 200)] * 3 + [("ask_user", 200)]
    assert [j["arguments"]["url"] for j in out["jobs"][:3]] == [shop + p for p in PAGES]
    assert out["jobs"][3]["arguments"]["choices"] == LOOKS and out["jobs"][3]["report"] == {
        "result": LOOKS[chosen]
    }
    assert "The Striped T-shirt is made of organic cotton jersey" in result["steps"][1]["answer"]
    worn = LOOKS[chosen].replace(",", " and").split(" and ")
    assert result["answer"].startswith(
        f"Now wearing: {worn[0]} (top), {worn[1]} (bottom), {worn[2]} (shoes)."
    )
    jobs = [k for k in c.r.scan_iter(f"{c.prefix}:assistant-jobs:job:*")]
    assert {c.r.hget(k, "state") for k in jobs} == {"answered"} and len(jobs) >= 4, "the jobs waited in Redis"
    workers = {s["worker"] for s in out["steps"] if s["status"] == "done"}
    assert workers and all(w for w in workers), "every step of the chat ran on a worker process"


@pytest.fixture(scope="module")
def streams(redis_url: str, module_prefix: str) -> Iterator[Cluster]:
    """Redis Streams: one worker and ``dflow serve``, for the tests of this module."""
    with Cluster(redis_url, module_prefix, streams_transport(redis_url, module_prefix)) as c:
        yield c


@pytest.mark.timeout(120)
def test_a_chat_with_workers_server_and_plugin_as_processes_on_redis_streams(streams: Cluster) -> None:
    out = streams.plugin().outcome()
    check_chat(streams, out, chosen=0)


@pytest.mark.timeout(120)
def test_a_worker_killed_while_the_question_to_the_user_is_outstanding(streams: Cluster) -> None:
    plugin = streams.plugin(ask="stdin")
    plugin.wait_for(f"    3. {LOOKS[2]}")  # the question is shown: its job is pulled, not yet reported
    (victim,) = streams.workers.alive()
    streams.workers.kill_one()  # kill -9: no worker is left
    assert not streams.workers.alive() and victim.returncode == -signal.SIGKILL
    streams.workers.start(1)
    (second,) = streams.workers.alive()
    plugin.answer("2")
    out = plugin.outcome()
    check_chat(streams, out, chosen=1)
    pids = [int(s["worker"].split(":")[1]) for s in out["steps"] if s["status"] == "done"]
    assert pids[0] == victim.pid and pids[-1] == second.pid, (
        "the killed worker began the chat, the second ended it"
    )


@pytest.mark.timeout(180)
def test_a_chat_on_kafka(redis_url: str, prefix: str, kafka_bootstrap: str) -> None:
    with Cluster(redis_url, prefix, kafka_transport(kafka_bootstrap, prefix)) as c:
        out = c.plugin().outcome(timeout=120)
        check_chat(c, out, chosen=0)
