"""agent_tool: a sub-agent as a flow tool, in a child run that leaves the caller's data alone,
nested to a limited depth."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

import dflow
from dflow_agents import (
    AgentStatus,
    ChatMessage,
    ChatResponse,
    ToolCall,
    ToolCallAgent,
    ToolSpec,
    agent_tool,
)
from dflow_agents.testing import FunctionModel, ScriptedModel, call, reply


def last_tool_result(messages: Sequence[ChatMessage]) -> str:
    return [m.content for m in messages if m.role == "tool"][-1]


researcher = ToolCallAgent(
    "researcher",
    ScriptedModel([reply("Paris has 2.1 million people.")]),
    system_prompt="You research facts.",
)
research = agent_tool(researcher, description="Ask the researcher a factual question.")


def test_the_sub_agents_answer_is_the_observation_and_its_writes_stay_its_own(local: dflow.Runtime) -> None:
    boss_model = ScriptedModel(
        [
            reply(calls=[call("researcher", query="How many people live in Paris?")]),
            reply("About 2.1 million."),
        ]
    )
    boss = ToolCallAgent("boss", boss_model, [research])
    run = boss.run("Paris population?")
    result = run.result(10)
    assert result.status is AgentStatus.FINISHED and result.answer == "About 2.1 million."
    assert last_tool_result(boss_model.requests[1].messages) == "Paris has 2.1 million people."
    sub_request = researcher.model.requests[-1]  # type: ignore[attr-defined]
    assert [m.content for m in sub_request.messages if m.role == "user"] == ["How many people live in Paris?"]
    data = run.context().as_dict()
    assert not any(k.startswith("dflow_agents/researcher") for k in data), sorted(data)
    assert "dflow_agents/depth" not in data
    assert research.spec.parameters["required"] == ["query"]


def test_a_sub_agent_that_does_not_finish_says_so(local: dflow.Runtime) -> None:
    quitter = ToolCallAgent(
        "quitter", ScriptedModel([reply(calls=[call("terminate", status="failure", conclusion="no data")])])
    )
    model = ScriptedModel([reply(calls=[call("quitter", query="x")]), reply("ok")])
    ToolCallAgent("asks-quitter", model, [agent_tool(quitter)]).run("go").result(10)
    observed = last_tool_result(model.requests[1].messages)
    assert "ended terminated" in observed and "no data" in observed


def _delegate(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ChatResponse:
    """Call the first agent tool offered, once; then answer with what came back."""
    results = [m.content for m in messages if m.role == "tool"]
    if results:
        return ChatResponse(content=f"got: {results[-1]}")
    names = [t.name for t in tools if t.name != "terminate"]
    if not names:
        return ChatResponse(content="leaf answer")
    return ChatResponse(tool_calls=[ToolCall(id="", name=names[0], arguments={"query": "deeper"})])


def test_nesting_deeper_than_max_depth_is_refused(local: dflow.Runtime) -> None:
    leaf = ToolCallAgent("nest-leaf", FunctionModel(_delegate))
    middle = ToolCallAgent("nest-middle", FunctionModel(_delegate), [agent_tool(leaf, max_depth=2)])
    top = ToolCallAgent("nest-top", FunctionModel(_delegate), [agent_tool(middle, max_depth=2)])
    assert top.run("go").result(10).answer == "got: got: leaf answer"  # two deep: allowed

    # the limit is the called tool's: a middle agent whose tool allows 1 may not call from 1 deep
    strict_middle = ToolCallAgent(
        "nest-strict-middle", FunctionModel(_delegate), [agent_tool(leaf, max_depth=1)]
    )
    strict_top = ToolCallAgent("nest-strict-top", FunctionModel(_delegate), [agent_tool(strict_middle)])
    answer = strict_top.run("go").result(10).answer
    assert answer.startswith("got: got: Error: tool 'nest-leaf' failed"), answer
    assert "AgentDepthError" in answer and "2 deep; its max_depth is 1" in answer, answer


def test_a_second_agent_of_a_name_is_flagged() -> None:
    first = ToolCallAgent("twice-named", ScriptedModel([]))
    with pytest.warns(RuntimeWarning, match="second agent named 'twice-named'"):
        ToolCallAgent("twice-named", ScriptedModel([]))
    assert first.name == "twice-named"


def test_agent_tool_refuses_what_is_not_an_agent() -> None:
    with pytest.raises(TypeError, match="takes an agent"):
        agent_tool(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_depth"):
        agent_tool(researcher, max_depth=0)
