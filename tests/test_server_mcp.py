"""The served pipelines as MCP tools (``/mcp``), over real sockets with the ``mcp`` SDK's own
client, on the in-memory runtime: listing, a call that returns the run's result, a run that
fails or outlasts the call, who may call (the admin token, a session token, none, a forged
one), both protocol generations, and an agent of ``dflow_agents`` using a dflow server's
pipelines as its tools."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

import dflow
from dflow import DFlow
from dflow.server import SESSION_KEY, ServerThread, Tokens, create_app
from dflow.server.mcp_endpoint import McpEndpoint
from dflow_agents import McpServer
from tests.support import http_api

ADMIN = "admin-token-of-the-mcp-endpoint-tests-0123456789"
SECRET = "server-secret-of-the-mcp-endpoint-tests-0123456789"


def _fail(x: Any) -> Any:
    raise ValueError(f"cannot take {x!r}")


double = DFlow.from_call("mcp-double").map(lambda x: x * 2).id("times-two").init("mcp-double")
fails = DFlow.from_call("mcp-fails").map(_fail).id("boom").init("mcp-fails")
whose = DFlow.from_call("mcp-whose").map(lambda ctx, _: ctx.get(SESSION_KEY)).id("read").init("mcp-whose")
slow = DFlow.from_call("mcp-slow").flat_map(lambda x: DFlow.delay(x, 5.0)).id("wait").init("mcp-slow")
SERVED = ["mcp-double", "mcp-fails", "mcp-whose", "mcp-slow"]


@pytest.fixture(scope="module")
def url(runtime: dflow.Runtime) -> Iterator[str]:
    app = create_app(tokens=Tokens(SECRET, ttl=600), admin_token=ADMIN, pipelines=SERVED)
    (endpoint,) = [r.endpoint for r in app.router.routes if getattr(r, "path", "") == "/mcp"]
    assert isinstance(endpoint, McpEndpoint)
    endpoint.call_timeout = 2.0  # mcp-slow outlasts it
    with ServerThread(app) as base:
        yield base


@contextlib.asynccontextmanager
async def client(url: str, token: str | None, mode: str = "auto") -> AsyncIterator[Client]:
    """The SDK's client of ``/mcp``, sending ``token``."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx2.AsyncClient(headers=headers) as http:
        transport = streamable_http_client(f"{url}/mcp", http_client=http)
        async with Client(transport, mode=mode, cache=None) as c:
            yield c


async def _listed_and_called(url: str, token: str | None, mode: str = "auto") -> tuple[list[str], Any]:
    async with client(url, token, mode) as c:
        names = [t.name for t in (await c.list_tools()).tools]
        return names, await c.call_tool("mcp-double", {"param": 21})


def test_each_served_pipeline_is_a_tool_and_a_call_returns_the_runs_result(url: str) -> None:
    names, result = asyncio.run(_listed_and_called(url, ADMIN))
    assert sorted(names) == sorted(SERVED)
    assert not result.is_error
    assert result.content[0].text == "42"
    assert result.structured_content["result"] == 42
    assert dflow.Run(result.structured_content["trace_id"]).result(5) == 42, "a real run gave it"


def test_the_2025_protocol_with_its_handshake_is_served_too(url: str) -> None:
    names, result = asyncio.run(_listed_and_called(url, ADMIN, mode="legacy"))
    assert "mcp-double" in names and result.structured_content["result"] == 42


def test_a_failed_run_is_an_error_result_naming_its_trace_id(url: str) -> None:
    async def go() -> Any:
        async with client(url, ADMIN) as c:
            return await c.call_tool("mcp-fails", {"param": 7})

    result = asyncio.run(go())
    assert result.is_error
    trace_id = result.structured_content["trace_id"]
    assert f"run {trace_id} failed" in result.content[0].text
    assert "ValueError: cannot take 7" in result.content[0].text


def test_a_run_that_outlasts_the_call_is_named_and_goes_on(url: str) -> None:
    async def go() -> Any:
        async with client(url, ADMIN) as c:
            return await c.call_tool("mcp-slow", {"param": "late"})

    result = asyncio.run(go())
    assert result.is_error and "is still going after 2 s" in result.content[0].text
    assert dflow.Run(result.structured_content["trace_id"]).result(30) == "late", "the run went on"


def test_an_unknown_tool_is_an_error_result_saying_where_the_tools_are(url: str) -> None:
    async def go() -> Any:
        async with client(url, ADMIN) as c:
            return await c.call_tool("no-such-pipeline", {})

    result = asyncio.run(go())
    assert result.is_error and "tools/list names those there are" in result.content[0].text


def test_a_session_token_starts_the_runs_in_its_session(url: str) -> None:
    with httpx.Client(base_url=url) as api:
        session = http_api.new_session(api, ADMIN)

    async def go() -> Any:
        async with client(url, session["token"]) as c:
            return await c.call_tool("mcp-whose", {})

    assert asyncio.run(go()).structured_content["result"] == session["session"]


@pytest.mark.parametrize("token", [None, "not-a-token", "dfs1.forged.token"])
def test_a_request_without_a_token_that_verifies_is_refused(url: str, token: str | None) -> None:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    answer = httpx.post(
        f"{url}/mcp",
        json=body,
        headers={**headers, "Accept": "application/json, text/event-stream"},
    )
    assert answer.status_code == 401
    assert answer.headers["www-authenticate"].startswith("Bearer")
    assert "detail" in answer.json()


def test_an_app_made_without_mcp_has_no_endpoint(runtime: dflow.Runtime) -> None:
    app = create_app(admin_token=ADMIN, pipelines=SERVED, mcp=False)
    assert not [r for r in app.router.routes if getattr(r, "path", "") == "/mcp"]


def test_an_agent_takes_a_dflow_servers_pipelines_as_its_tools(url: str) -> None:
    server = McpServer.http("dflow-itself", f"{url}/mcp", headers={"Authorization": f"Bearer {ADMIN}"})

    async def go() -> Any:
        (tool,) = [t for t in await server.list_tools() if t.remote_name == "mcp-double"]
        return tool.name, (await tool.run({"param": 5})).output

    try:
        name, output = asyncio.run(go())
    finally:
        asyncio.run(_close())
    assert name == "mcp-double"
    assert output["result"] == 10


async def _close() -> None:
    from dflow_agents._mcp_pool import close_connections

    await close_connections()
