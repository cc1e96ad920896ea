"""MCP tools in local mode, against the small server of ``mcp_server.py`` run as a real
subprocess over stdio: listing, argument checks, results of every kind, timeouts, a server
killed between calls or dying mid-call, one that cannot start, and a ToolCallAgent that
calls them as steps and sees tools the server adds."""

from __future__ import annotations

import itertools
import os
import pickle
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import dflow
from dflow import StepStatus
from dflow_agents import AgentStatus, ConversationAgentExecutor, McpLimits, McpServer, McpTool, ToolCallAgent
from dflow_agents.testing import ScriptedModel, call, reply
from tests.support.runs import runs_of

from .mcp_probe import close_sessions, run_tool

ROOT = Path(__file__).resolve().parents[2]
_names = itertools.count()


def stdio_server(name: str, log: Path, **limits: object) -> McpServer:
    env = {"PYTHONPATH": str(ROOT), "MCP_TEST_LOG": str(log), "PATH": os.environ.get("PATH", "")}
    return McpServer.stdio(
        name,
        [sys.executable, "-m", "tests.agents.mcp_server", "stdio"],
        env=env,
        limits=McpLimits(connect_timeout=90, **limits),  # type: ignore[arg-type]
    )


def calls_in(log: Path) -> list[tuple[int, str]]:
    """The server's calls so far: the pid of the server process that ran each, and the tool."""
    if not log.exists():
        return []
    return [(int(pid), name) for pid, _, name in (line.split() for line in log.read_text().splitlines())]


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mcp") / "calls.log"


@pytest.fixture(scope="module")
def server(log: Path) -> McpServer:
    return stdio_server("test-stdio", log, tool_timeouts={"slow": 1.0}, max_output_chars=1000)


@pytest.fixture(scope="module")
def tools(runtime: dflow.Runtime, server: McpServer) -> Iterator[dict[str, McpTool]]:
    listed = {t.name: t for t in server.tools()}
    yield listed
    close_sessions()


def test_a_servers_tools_are_listed_with_their_own_input_schemas(tools: dict[str, McpTool]) -> None:
    assert {"add", "fail", "shout", "picture", "blob", "slow", "die", "grow", "whoami"} <= set(tools)
    spec = tools["add"].spec
    assert spec.description == "Add two integers."
    assert spec.parameters["properties"] == {"a": {"type": "integer"}, "b": {"type": "integer"}}
    assert spec.parameters["required"] == ["a", "b"]
    assert tools["slow"].timeout == 1.0 and tools["add"].timeout == 30.0, "each tool has its own timeout"


def test_a_call_gives_the_servers_answer(tools: dict[str, McpTool]) -> None:
    result = run_tool(tools["add"], a=2, b=40)
    assert result["ok"] and result["observation"] == "42"
    assert result["output"] == {"result": 42}


def test_arguments_that_do_not_fit_the_schema_are_refused_before_the_call(
    tools: dict[str, McpTool], log: Path
) -> None:
    before = calls_in(log)
    result = run_tool(tools["add"], a="two")
    assert not result["ok"] and result["error"] == "ValidationError"
    assert "'b' is a required property" in result["observation"]
    assert "'two' is not of type 'integer'" in result["observation"]
    assert calls_in(log) == before, "the server never saw the call"


def test_an_error_result_of_the_server_is_a_failed_result_the_model_reads(tools: dict[str, McpTool]) -> None:
    result = run_tool(tools["fail"], reason="no")
    assert not result["ok"] and result["error"] == "McpToolError"
    assert result["observation"].startswith("Error: tool 'fail' failed: ")


def test_a_request_the_server_refuses_is_a_protocol_error_the_model_reads(tools: dict[str, McpTool]) -> None:
    result = run_tool(tools["refuse"])
    assert not result["ok"] and result["error"] == "McpProtocolError"
    assert "refused the call to 'refuse'" in result["observation"]
    assert "this request is refused (JSON-RPC error -32602)" in result["observation"]


def test_a_huge_text_is_cut_and_says_how_much_was_cut(tools: dict[str, McpTool]) -> None:
    result = run_tool(tools["shout"], size=200_000)
    assert result["ok"]
    assert result["observation"].startswith("A" * 1000)
    assert result["observation"].endswith("[... 199000 more characters cut]")
    assert len(result["output"]) < 1100, "the step keeps the cut text, not 200,000 characters"


def test_images_and_binary_resources_are_described_and_their_bytes_not_kept(
    tools: dict[str, McpTool],
) -> None:
    picture = run_tool(tools["picture"])
    assert picture["observation"] == "[image image/png, 70 bytes]\na dot"
    assert picture["output"][0] == {"type": "image", "mime_type": "image/png", "bytes": 70}
    blob = run_tool(tools["blob"])
    assert blob["observation"] == "[binary resource file:///data.bin (application/octet-stream), 1024 bytes]"
    assert "blob" not in str(blob["output"]) and blob["output"][0]["bytes"] == 1024


def test_a_call_past_the_tools_own_timeout_is_abandoned(tools: dict[str, McpTool]) -> None:
    t0 = time.monotonic()
    result = run_tool(tools["slow"], seconds=30)
    assert result["error"] == "TimeoutError"
    assert "did not finish within 1 seconds" in result["observation"]
    assert time.monotonic() - t0 < 10
    assert run_tool(tools["add"], a=1, b=1)["observation"] == "2", "the session still serves calls"


def test_tools_of_one_server_name_share_one_session_in_the_process(tools: dict[str, McpTool]) -> None:
    # (a tool unpickled from a step's chain is a new object with the same server: it must not
    # start a server process of its own)
    copy = pickle.loads(pickle.dumps(tools["whoami"]))
    first = run_tool(tools["whoami"])["output"]["result"]
    assert run_tool(copy)["output"]["result"] == first, "the unpickled copy used the same session"
    assert run_tool(tools["add"], a=1, b=2)["ok"]
    assert run_tool(tools["whoami"])["output"]["result"] == first, "one server process for every call"


def test_a_server_killed_between_calls_is_started_again_by_the_next_call(tools: dict[str, McpTool]) -> None:
    first = run_tool(tools["whoami"])["output"]["result"]
    os.kill(first, signal.SIGKILL)
    time.sleep(0.5)
    again = run_tool(tools["whoami"])
    assert again["ok"], again["observation"]
    assert again["output"]["result"] != first, "a new server process answered"


def test_a_server_dying_mid_call_is_a_connection_error_and_the_next_call_works(
    tools: dict[str, McpTool], log: Path
) -> None:
    result = run_tool(tools["die"])
    assert not result["ok"] and result["error"] == "McpConnectionError"
    assert "closed the connection during the call to 'die'" in result["observation"]
    assert [name for _, name in calls_in(log)].count("die") == 2, "sent once more on a new connection"
    assert run_tool(tools["add"], a=3, b=4)["observation"] == "7"


def test_a_server_that_cannot_start_is_reported_as_unavailable(runtime: dflow.Runtime) -> None:
    broken = McpServer.stdio(
        "no-such-server", ["/nonexistent/mcp-server"], limits=McpLimits(connect_timeout=20)
    )
    tool = McpTool(broken, _listed("ghost"))  # type: ignore[arg-type]
    result = run_tool(tool)
    assert not result["ok"] and result["error"] == "McpUnavailable"
    assert "cannot reach the MCP server 'no-such-server'" in result["observation"]


def test_a_server_that_never_answers_is_given_up_at_the_connect_timeout(runtime: dflow.Runtime) -> None:
    mute = McpServer.stdio(
        "mute-server",
        [sys.executable, "-c", "import time; time.sleep(120)"],
        limits=McpLimits(connect_timeout=3),
    )
    t0 = time.monotonic()
    result = run_tool(McpTool(mute, _listed("ghost")))  # type: ignore[arg-type]
    assert time.monotonic() - t0 < 20
    assert not result["ok"] and result["error"] == "McpUnavailable"
    assert "TimeoutError" in result["observation"]


def test_a_servers_long_description_is_cut_before_it_reaches_prompts() -> None:
    from dflow_agents._mcp_pool import listed_tool

    listed = listed_tool(
        {"name": "chatty", "description": "blah " * 10_000, "inputSchema": {"type": "object"}}
    )
    tool = McpTool(McpServer.stdio("chatty-server", ["true"]), listed)
    assert len(tool.spec.description) <= 2003 and tool.spec.description.endswith("...")


def test_an_mcp_tool_pickles_with_its_server_and_schema(tools: dict[str, McpTool]) -> None:
    copy = pickle.loads(pickle.dumps(tools["add"]))
    assert copy.spec == tools["add"].spec and copy.server == tools["add"].server


def test_the_config_is_checked_when_made() -> None:
    with pytest.raises(TypeError, match="argv list"):
        McpServer.stdio("x", "python server.py")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="http:// or https://"):
        McpServer.http("x", "ftp://host/mcp")
    with pytest.raises(ValueError, match="timeout must be a number of seconds"):
        McpLimits(timeout=0)


def test_a_tool_call_agent_calls_mcp_tools_in_the_turns_tool_step(tools: dict[str, McpTool]) -> None:
    model = ScriptedModel(
        [
            reply(calls=[call("add", a=20, b=22), call("picture")]),
            reply(calls=[call("terminate", status="success", conclusion="42 and a dot")]),
        ]
    )
    agent = ToolCallAgent(f"mcp-agent-{next(_names)}", model, [tools["add"], tools["picture"]])
    run = agent.run("add and draw")
    assert run.result(120).status is AgentStatus.FINISHED
    seen = [m.content for m in model.requests[1].messages if m.role == "tool"]
    assert seen == ["42", "[image image/png, 70 bytes]\na dot"]
    tool_steps = [
        s
        for steps in runs_of(run.trace_id)
        for s in steps
        if s.key.split(">")[0].split("/")[0] == "tool" and s.status is StepStatus.DONE
    ]
    assert [[r["name"] for r in s.output] for s in tool_steps] == [["add", "picture"], ["terminate"]], (
        "each turn's calls, MCP or not, are committed in the turn's tool step"
    )


def test_an_agent_given_the_server_sees_the_tools_it_adds(
    server: McpServer, tools: dict[str, McpTool]
) -> None:
    model = ScriptedModel(
        [
            reply(calls=[call("grow")]),
            reply(calls=[call("multiply", a=6, b=7)]),
            reply("42"),
        ]
    )
    agent = ToolCallAgent(f"mcp-agent-{next(_names)}", model, [server])
    result = agent.run("grow, then multiply").result(120)
    assert result.status is AgentStatus.FINISHED and result.answer == "42"
    offered = [{s.name for s in r.tools} for r in model.requests]
    assert "multiply" not in offered[0] and "multiply" in offered[1], "the list was refreshed"
    assert [m.content for m in model.requests[2].messages if m.role == "tool"][-1] == "42"


def test_a_call_naming_a_tool_the_last_listing_lacked_lists_again(server: McpServer) -> None:
    model = ScriptedModel(
        [reply(calls=[call("grow_quietly")]), reply(calls=[call("divide", a=1, b=4)]), reply("0.25")]
    )
    agent = ToolCallAgent(f"mcp-agent-{next(_names)}", model, [server])
    result = agent.run("grow quietly, then divide").result(120)
    assert result.status is AgentStatus.FINISHED
    assert "divide" not in {s.name for s in model.requests[1].tools}, "the server said nothing"
    assert [m.content for m in model.requests[2].messages if m.role == "tool"][-1] == "0.25"


def test_the_react_executor_takes_the_listed_tools(tools: dict[str, McpTool]) -> None:
    model = ScriptedModel(
        [
            'I need the sum.\nAction: add\nAction Input: {"a": 19, "b": 23}',
            "I now know the final answer.\nFinal Answer: 42",
        ]
    )
    react = ConversationAgentExecutor(f"mcp-react-{next(_names)}", model, [tools["add"]], mode="completion")
    result = react.run("19 + 23?").result(120)
    assert (result.status, result.answer) == (AgentStatus.FINISHED, "42")
    assert "Observation: 42" in (model.requests[-1].prompt or "")


def _listed(name: str) -> object:
    from dflow_agents._mcp_pool import listed_tool

    return listed_tool({"name": name, "inputSchema": {"type": "object", "properties": {}}})
