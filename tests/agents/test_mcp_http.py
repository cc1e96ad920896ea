"""MCP tools over streamable HTTP, against the SDK's own HTTP server (``mcp_server.py http``)
run as a real process on a free port: listing, calls, a ToolCallAgent, and a server killed
and started again on the same port between calls."""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import dflow
from dflow_agents import AgentStatus, McpLimits, McpServer, McpTool, ToolCallAgent
from dflow_agents.testing import ScriptedModel, call, reply

from .mcp_probe import close_sessions, run_tool

ROOT = Path(__file__).resolve().parents[2]
_names = itertools.count()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class HttpServer:
    """``mcp_server.py http PORT`` as a process that a test can kill and start again."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.agents.mcp_server", "http", str(self.port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 90
        while True:
            assert self.proc.poll() is None, "the MCP HTTP server exited at start"
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return
            except OSError:
                assert time.monotonic() < deadline, "the MCP HTTP server did not listen in 90 s"
                time.sleep(0.1)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture(scope="module")
def http_server() -> Iterator[HttpServer]:
    server = HttpServer(free_port())
    server.start()
    yield server
    server.kill()


@pytest.fixture(scope="module")
def server(http_server: HttpServer) -> McpServer:
    return McpServer.http("test-http", http_server.url, limits=McpLimits(connect_timeout=30, timeout=20))


@pytest.fixture(scope="module")
def tools(runtime: dflow.Runtime, server: McpServer) -> Iterator[dict[str, McpTool]]:
    yield {t.name: t for t in server.tools()}
    close_sessions()


def test_tools_are_listed_and_called_over_streamable_http(tools: dict[str, McpTool]) -> None:
    assert {"add", "whoami", "picture"} <= set(tools)
    assert run_tool(tools["add"], a=5, b=6)["observation"] == "11"
    assert run_tool(tools["picture"])["observation"] == "[image image/png, 70 bytes]\na dot"


def test_an_agent_calls_the_http_servers_tools(server: McpServer, tools: dict[str, McpTool]) -> None:
    model = ScriptedModel([reply(calls=[call("add", a=1, b=2)]), reply("3")])
    agent = ToolCallAgent(f"mcp-http-agent-{next(_names)}", model, [server])
    result = agent.run("add").result(120)
    assert result.status is AgentStatus.FINISHED and result.answer == "3"
    assert [m.content for m in model.requests[1].messages if m.role == "tool"] == ["3"]


def test_a_server_restarted_between_calls_is_reached_again(
    http_server: HttpServer, tools: dict[str, McpTool]
) -> None:
    before = run_tool(tools["whoami"])["output"]
    http_server.kill()
    down = run_tool(tools["add"], a=1, b=1)
    assert not down["ok"] and down["error"] in ("McpConnectionError", "McpUnavailable"), down
    assert "test-http" in str(down["observation"])
    http_server.start()
    again = run_tool(tools["whoami"])
    assert again["ok"], again["observation"]
    assert again["output"] != before, "the restarted server answered"
