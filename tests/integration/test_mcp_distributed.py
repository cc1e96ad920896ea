"""MCP on real processes over Redis Streams: a worker starts the stdio server of an agent's
MCP tools (its session is per process), commits the calls as tool steps, and starts the
server again after it was killed between runs; ``dflow serve`` offers the pipelines as MCP
tools whose calls run on the worker."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from dflow_agents import AgentStatus
from tests.integration.conftest import SECRET
from tests.support.runs import committed_tool_calls, wait_for, worker_pids
from tests.support.workers import Cluster, Served, streams_transport


def logged(log: Path) -> list[tuple[int, int, str]]:
    """The server's calls: (server pid, its parent's pid, tool)."""
    if not log.exists():
        return []
    return [(int(a), int(b), name) for a, b, name in (line.split() for line in log.read_text().splitlines())]


@pytest.fixture
def cluster(redis_url: str, prefix: str, tmp_path: Path) -> Iterator[Cluster]:
    env = {"MCP_TEST_LOG": str(tmp_path / "calls.log")}
    url = streams_transport(redis_url, prefix)
    with Cluster("tests.integration.apps.mcp_app", redis_url, prefix, transport_url=url, env=env) as c:
        yield c


@pytest.mark.timeout(300)
def test_mcp_calls_run_as_tool_steps_on_the_worker_and_survive_a_killed_server(
    cluster: Cluster, tmp_path: Path
) -> None:
    from .apps import mcp_app as app

    log = tmp_path / "calls.log"
    cluster.connect()
    cluster.workers.start(1)
    worker = cluster.workers.procs[0].pid
    run = app.asker.run("who serves, and what is 2 + 3?")
    first = run.result(180)
    assert first.status is AgentStatus.FINISHED
    calls = logged(log)
    assert sorted(name for _, _, name in calls) == ["add", "whoami"]
    (server_pid,) = {pid for pid, _, _ in calls}
    assert {parent for _, parent, _ in calls} == {worker}, "the worker process started the server"
    assert first.answer == f"server {server_pid}, sum 5"
    assert committed_tool_calls(run.trace_id) == {"add": 1, "whoami": 1}
    assert worker_pids(run.trace_id) == {worker}

    os.kill(server_pid, signal.SIGKILL)  # between runs: the worker's session drops
    second = app.asker.run("again?").result(180)
    assert second.status is AgentStatus.FINISHED
    new_pids = {pid for pid, _, _ in logged(log)[len(calls) :]}
    assert len(new_pids) == 1 and server_pid not in new_pids, "a new server answered"
    assert second.answer == f"server {new_pids.pop()}, sum 5"


@pytest.mark.timeout(300)
def test_a_worker_killed_during_an_mcp_call_is_taken_over_with_a_server_of_its_own(
    cluster: Cluster, tmp_path: Path
) -> None:
    from .apps import mcp_app as app

    log = tmp_path / "calls.log"
    cluster.connect()
    cluster.workers.start(1)
    first = cluster.workers.procs[0].pid
    run = app.sleeper.run("sleep, then tell")
    wait_for("the first call to reach the server", lambda: [n for _, _, n in logged(log)] == ["slow"], 120)
    cluster.workers.kill_one()
    cluster.workers.start(1)
    second = cluster.workers.procs[-1].pid
    result = run.result(180)
    assert result.status is AgentStatus.FINISHED and result.answer == "the server said woke"
    calls = logged(log)
    assert [n for _, _, n in calls] == ["slow", "slow"], (
        f"the call in flight at the kill ran again: {calls} (workers {first}, {second})"
    )
    assert [parent for _, parent, _ in calls] == [first, second], "each worker started its own server"
    assert worker_pids(run.trace_id) >= {second}


@pytest.mark.timeout(300)
def test_dflow_serve_offers_the_pipelines_as_mcp_tools_that_run_on_the_worker(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    import asyncio

    from mcp import Client

    transport = streams_transport(redis_url, prefix)
    env = {"DFLOW_SECRET": SECRET, "DFLOW_AGENTS_BLOCK_NETWORK": "1", "MCP_TEST_LOG": str(tmp_path / "log")}
    with Served("tests.integration.apps.mcp_app", redis_url, prefix, transport, env) as served:

        async def go() -> tuple[list[str], object]:
            async with Client(f"{served.serve.url}/mcp", cache=None) as client:
                names = [t.name for t in (await client.list_tools()).tools]
                return names, await client.call_tool("mcp-double", {"param": 21}, read_timeout_seconds=120)

        names, result = asyncio.run(go())
    assert {"mcp-double", "agent.mcp-asker"} <= set(names)
    assert not result.is_error, result  # type: ignore[attr-defined]
    assert result.structured_content["result"] == 42  # type: ignore[attr-defined]
