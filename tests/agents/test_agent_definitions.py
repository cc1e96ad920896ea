"""Agents defined as data: stored and versioned like plan templates (in memory and in Redis),
built into agents from a process's models and tools by name, and named by a planner's steps."""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Sequence

import pytest

import dflow
from dflow_agents import (
    AgentDefinition,
    AgentDefinitionNotFoundError,
    AgentStatus,
    ChatMessage,
    InMemoryAgentDefinitions,
    PlanningFlow,
    PlanningOptions,
    RedisAgentDefinitions,
    ToolSpec,
    build_agents,
    descriptions_of,
)
from dflow_agents.testing import FunctionModel, ScriptedModel, call, reply
from tests.agents.test_planning import step_of, unique
from tests.agents.test_planning_richer import lookup
from tests.integration import conftest as integration

redis_url = integration.redis_url
prefix = integration.prefix


@pytest.mark.parametrize("kind", ["in-memory", "redis"])
def test_definitions_are_saved_by_version_and_read_back(kind: str, request: pytest.FixtureRequest) -> None:
    store: InMemoryAgentDefinitions | RedisAgentDefinitions
    if kind == "redis":
        store = RedisAgentDefinitions(
            request.getfixturevalue("redis_url"), prefix=request.getfixturevalue("prefix"), max_versions=2
        )
    else:
        store = InMemoryAgentDefinitions(max_versions=2)

    async def scenario() -> tuple[list[int], AgentDefinition, AgentDefinition, list[str]]:
        try:
            for n in range(3):
                saved = await store.save(
                    AgentDefinition(name="search", prompt=f"v{n + 1}", tools=("lookup",))
                )
                assert saved.version == n + 1
            with pytest.raises(AgentDefinitionNotFoundError, match="has no version 1; its versions are 2, 3"):
                await store.get("search", 1)
            with pytest.raises(AgentDefinitionNotFoundError, match="no agent definition named 'write'"):
                await store.get("write")
            with pytest.raises(ValueError, match="agent definition name 'a/b'"):
                await store.get("a/b")
            return (
                await store.versions("search"),
                await store.get("search"),
                await store.get("search", 2),
                await store.names(),
            )
        finally:
            if isinstance(store, RedisAgentDefinitions):
                await store.aclose()

    kept, latest, second, names = asyncio.run(scenario())
    assert (kept, names) == ([2, 3], ["search"])
    assert (latest.ref, latest.prompt, latest.tools) == ("search@3", "v3", ("lookup",))
    assert second.prompt == "v2"


def test_a_definition_builds_an_agent_or_names_what_is_missing() -> None:
    definition = AgentDefinition(
        name=unique("search"), prompt="You search.", tools=("lookup",), model="small"
    )
    model = ScriptedModel(["found it"])
    agent = definition.build(models={"small": model}, tools=[lookup])
    assert agent.name == f"{definition.name}@0" and list(agent.tools) == ["terminate", "lookup"]
    with pytest.raises(ValueError, match="names the model 'small', which is not among the models: big"):
        definition.build(models={"big": model}, tools=[lookup])
    with pytest.raises(ValueError, match="names the tools 'lookup', which are not among the tools: none"):
        definition.build(models={"small": model})
    with pytest.raises(ValueError, match="agent definition name 'a b' is not accepted"):
        AgentDefinition(name="a b")
    with pytest.raises(ValueError, match="two agent definitions are named 'x'"):
        build_agents([AgentDefinition(name="x"), AgentDefinition(name="X")], models={"default": model})
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(InMemoryAgentDefinitions())


def test_a_planner_names_agents_built_from_definitions(local: dflow.Runtime) -> None:
    def answer(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        return f"{messages[0].content} {step_of(messages)[1]}: {', '.join(t.name for t in tools)}"

    researcher, writer = unique("researcher"), unique("writer")
    definitions = [
        AgentDefinition(name=researcher, description="finds facts", prompt="I research.", tools=("lookup",)),
        AgentDefinition(name=writer, description="writes text", prompt="I write."),
    ]
    steps = [{"step": "find flights", "agent": researcher}, {"step": "write it", "agent": writer}]
    planner = ScriptedModel([reply(calls=[call("planning", command="create", title="Trip", steps=steps)])])
    flow = PlanningFlow(
        unique("defined"),
        build_agents(definitions, models={"default": FunctionModel(answer)}, tools=[lookup]),
        planner=planner,
        options=PlanningOptions(descriptions=descriptions_of(definitions)),
    )
    result = flow.run("plan a trip").result(10)

    assert result.status is AgentStatus.FINISHED
    assert [(s.executor, s.agent, s.answer) for s in result.steps] == [
        (researcher, f"{researcher}@0", "I research. find flights: terminate, lookup"),
        (writer, f"{writer}@0", "I write. write it: terminate"),
    ]
    system = planner.requests[0].messages[0].content
    assert f"[{researcher.upper()}]: finds facts (tools: terminate, lookup)" in system
    assert f"[{writer.upper()}]: writes text" in system
