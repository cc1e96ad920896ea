"""Richer plans, with scripted models in local mode.

* the planner may answer at once, without a plan (``PlanningOptions(direct_answer=True)``);
* a plan's step may name the agent that carries it out and the tools it should use; a plan
  naming an agent or a tool the flow does not have goes back to the planner as an error;
* consecutive steps marked ``parallel`` run together, their results back in plan order.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

import dflow
from dflow import ContextStack, DFlow
from dflow_agents import AgentStatus, ChatMessage, ChatResponse, ToolCall, ToolCallAgent, ToolSpec, tool
from dflow_agents.planning import DIRECT_ANSWER_PROMPT, PlanningFlow, PlanningOptions
from dflow_agents.plans import PlanBook, PlanDraft, PlanningError, PlanStepStatus, StepDetail
from dflow_agents.testing import FunctionModel, ScriptedModel, call, reply
from tests.agents.test_planning import executor, step_of, steps_run, unique


@tool
def lookup(query: str) -> str:
    """Look something up.

    Args:
        query: what to look up.
    """
    return f"found {query}"


def searcher() -> tuple[ToolCallAgent, FunctionModel]:
    def answer(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        return f"search did {step_of(messages)[1]}"

    model = FunctionModel(answer, name="search")
    return ToolCallAgent(unique("search"), model, tools=[lookup]), model


def create(steps: list[object], title: str = "Trip") -> object:
    return reply(calls=[call("planning", command="create", title=title, steps=steps)])


# -- the direct answer -------------------------------------------------------------------------


def test_a_planner_allowed_to_answer_directly_answers_with_one_call_and_no_plan(local: dflow.Runtime) -> None:
    doer, doer_model = executor("doer")
    planner = ScriptedModel([reply("Hello! How can I help?")])
    flow = PlanningFlow(unique("direct"), doer, planner, options=PlanningOptions(direct_answer=True))
    result = flow.run("hi").result(10)

    assert (result.status, result.source, result.answer) == (
        AgentStatus.FINISHED,
        "direct",
        "Hello! How can I help?",
    )
    assert result.plan is None and result.steps == [] and "needed no plan" in result.reason
    assert len(planner.requests) == 1, "one model call: no finalizer"
    assert doer_model.requests == [], "no step ran"
    assert DIRECT_ANSWER_PROMPT in planner.requests[0].messages[0].content


def test_a_planner_allowed_to_answer_directly_still_plans_when_it_calls_the_tool(
    local: dflow.Runtime,
) -> None:
    doer, doer_model = executor("doer")
    planner = ScriptedModel([create(["book"])])
    flow = PlanningFlow(unique("direct"), doer, planner=planner, options=PlanningOptions(direct_answer=True))
    result = flow.run("plan a trip").result(10)
    assert (result.source, result.status) == ("model", AgentStatus.FINISHED)
    assert steps_run(doer_model) == [0]


def test_an_empty_reply_is_no_direct_answer_and_gets_the_default_plan(local: dflow.Runtime) -> None:
    doer, _ = executor("doer")
    flow = PlanningFlow(
        unique("empty"),
        doer,
        planner=ScriptedModel([reply("  ")]),
        options=PlanningOptions(direct_answer=True),
    )
    assert flow.run("hi").result(10).source == "default"
    with pytest.raises(TypeError, match="direct_answer is True or False"):
        PlanningOptions(direct_answer="yes")  # type: ignore[arg-type]


# -- the agent and tools of a step --------------------------------------------------------------


def test_a_step_naming_its_agent_and_tools_goes_to_that_agent_told_the_tools(local: dflow.Runtime) -> None:
    search, search_model = searcher()
    write, write_model = executor("write")
    steps = [{"step": "find flights", "agent": "SEARCH", "tools": ["lookup"]}, "[SEARCH] draft it"]
    planner = ScriptedModel([create(steps)])
    flow = PlanningFlow(unique("named"), {"write": write, "search": search}, planner=planner)
    result = flow.run("plan a trip").result(10)

    assert [(s.index, s.executor) for s in result.steps] == [(0, "search"), (1, "search")]
    assert steps_run(search_model) == [0, 1] and write_model.requests == []
    first = search_model.requests[0].messages[-1].content
    assert "Use these tools for it: lookup." in first
    assert "Use these tools" not in search_model.requests[1].messages[-1].content
    assert result.plan is not None
    assert result.plan.step_details == [StepDetail(agent="SEARCH", tools=("lookup",)), StepDetail()]
    assert "0. [✓] find flights (agent: SEARCH; tools: lookup)\n" in result.plan_text
    system = planner.requests[0].messages[0].content
    assert "[SEARCH]: the " in system and "(tools: terminate, lookup)" in system


@tool
def book(flight: str) -> str:
    """Book a flight.

    Args:
        flight: the flight to book.
    """
    BOOKED.append(flight)
    return f"booked {flight}"


@tool
def hold(flight: str) -> DFlow[str]:
    """Hold a seat on a flight, as a flow."""
    BOOKED.append(f"held {flight}")
    return DFlow.just(flight).map(str.upper).id("held")


BOOKED: list[str] = []


def _calls(*calls: tuple[str, dict[str, object]]) -> ChatResponse:
    return ChatResponse(tool_calls=[ToolCall(id="", name=n, arguments=a) for n, a in calls])


def test_the_executor_of_a_step_naming_its_tools_is_offered_and_may_call_only_those(
    local: dflow.Runtime,
) -> None:
    BOOKED.clear()
    turns: dict[int, list[ChatResponse | str]] = {
        # step 0 names lookup: book (a plain tool) and hold (a flow tool) are refused, lookup runs
        0: [
            _calls(("book", {"flight": "TP1"}), ("lookup", {"query": "flights"}), ("hold", {"flight": "TP1"}))
        ]
        + [_calls(("book", {"flight": "TP2"})), "found the flights"],  # refused alone too
        1: [_calls(("book", {"flight": "TP3"})), "booked"],  # step 1 names no tools: all of them
    }

    def act(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ChatResponse | str:
        return turns[step_of(messages)[0]][sum(m.role == "assistant" for m in messages)]

    doer_model = FunctionModel(act, name="doer")
    doer = ToolCallAgent(unique("doer"), doer_model, tools=[lookup, book, hold])
    steps = [{"step": "find flights", "tools": ["lookup"]}, "book the flight"]
    flow = PlanningFlow(unique("enforced"), doer, planner=ScriptedModel([create(steps)]))
    result = flow.run("plan a trip").result(10)

    assert [s.status for s in result.steps] == [AgentStatus.FINISHED, AgentStatus.FINISHED]
    assert BOOKED == ["TP3"], "a tool the step does not name is never run"
    offered = [[t.name for t in r.tools] for r in doer_model.requests]
    assert offered[:3] == [["terminate", "lookup"]] * 3
    assert offered[3] == ["terminate", "lookup", "book", "hold"]
    observed = [m for m in doer_model.requests[1].messages if m.role == "tool"]
    assert [m.content for m in observed][1] == "found flights"
    for refused in (observed[0], observed[2]):
        assert refused.content == (
            f"Error: the tool {refused.name!r} may not be used here. The tools you may use are: terminate, lookup."
        )
    again = [m for m in doer_model.requests[2].messages if m.role == "tool"][-1]
    assert again.name == "book" and "may not be used here" in again.content


def test_an_agent_given_tools_it_does_not_have_is_refused_with_its_tools() -> None:
    doer = ToolCallAgent(unique("doer"), ScriptedModel([]), tools=[lookup])
    with pytest.raises(ValueError, match="has no tool named 'book': its tools are terminate, lookup"):
        doer.flow("go", tools=["book"])
    with pytest.raises(TypeError, match="tools is a list of tool names"):
        doer.flow("go", tools="lookup")


def test_a_plan_naming_an_unknown_agent_or_tool_goes_back_to_the_planner(local: dflow.Runtime) -> None:
    search, search_model = searcher()
    write, _ = executor("write")
    planner = ScriptedModel(
        [
            create([{"step": "find flights", "agent": "booker"}]),
            create([{"step": "find flights", "agent": "search", "tools": ["web", "lookup"]}]),
            create([{"step": "find flights", "agent": "search", "tools": ["lookup"]}]),
        ]
    )
    flow = PlanningFlow(unique("unknown"), {"write": write, "search": search}, planner=planner)
    result = flow.run("plan a trip").result(10)

    assert (result.status, result.source) == (AgentStatus.FINISHED, "model")
    assert steps_run(search_model) == [0]
    second, third = (r.messages[-1].content for r in planner.requests[1:3])
    assert second.startswith("Error: step 0 ('find flights') names the agent 'booker'")
    assert "not one of the agents: write, search" in second
    assert "names the tools 'web', which the agent 'search' does not have" in third
    assert "its tools are terminate, lookup" in third


def test_a_planner_that_keeps_naming_unknown_agents_gets_the_default_plan(local: dflow.Runtime) -> None:
    doer, doer_model = executor("doer")
    planner = ScriptedModel([create([{"step": "x", "agent": "ghost"}])] * 2)
    flow = PlanningFlow(unique("ghost"), doer, planner=planner, options=PlanningOptions(plan_attempts=2))
    result = flow.run("do x").result(10)
    assert result.source == "default" and "names the agent 'ghost'" in result.reason
    assert steps_run(doer_model) == [0, 1, 2]


def test_step_objects_that_are_wrong_are_refused_with_what_to_change() -> None:
    book = PlanBook(ContextStack("t"))
    with pytest.raises(PlanningError, match="step 0 has the keys who, which a step does not take"):
        book.create("p", "t", [{"step": "a", "who": "me"}])
    with pytest.raises(PlanningError, match="the tools of step 1 are 'lookup': give a list of tool names"):
        book.create("p", "t", ["a", {"step": "b", "tools": "lookup"}])
    with pytest.raises(PlanningError, match="step 0 is not accepted .parallel"):
        book.create("p", "t", [{"step": "a", "parallel": "sometimes"}])
    with pytest.raises(PlanningError, match="step 0 is None; every step is a non-empty text"):
        book.create("p", "t", [{"agent": "a"}])
    assert book.ids() == []
    plan = book.create("p", "t", [{"step": "a", "parallel": True}, "b"])
    updated = book.update("p", None, ["a", {"step": "b", "agent": "x"}])
    assert plan.step_details[0].parallel and updated.step_details == [StepDetail(), StepDetail(agent="x")]


# -- parallel steps ----------------------------------------------------------------------------


def test_consecutive_parallel_steps_run_together_and_their_results_come_back_in_plan_order(
    local: dflow.Runtime,
) -> None:
    search, search_model = searcher()
    write, write_model = executor("write")
    steps = [
        {"step": "find flights", "agent": "search", "parallel": True},
        {"step": "find hotels", "agent": "write", "parallel": True},
        {"step": "find trains", "agent": "search", "parallel": True},
        "summarise",
        {"step": "alone", "parallel": True},
    ]
    flow = PlanningFlow(
        unique("zip"), {"write": write, "search": search}, planner=ScriptedModel([create(steps)])
    )
    run = flow.run("plan a trip")
    result = run.result(10)

    assert result.status is AgentStatus.FINISHED
    assert [(s.index, s.executor, s.answer) for s in result.steps] == [
        (0, "search", "search did find flights"),
        (1, "write", "write did find hotels"),
        (2, "search", "search did find trains"),
        (3, "write", "write did summarise"),
        (4, "write", "write did alone"),
    ]
    assert result.plan is not None and result.plan.step_statuses == [PlanStepStatus.COMPLETED] * 5
    # the three were given out at once: each executor saw all three in progress
    for request in [*search_model.requests, write_model.requests[0]]:
        if step_of(request.messages)[0] < 3:
            shown = request.messages[-1].content
            assert "0. [→] find flights" in shown and "2. [→] find trains" in shown
    later = write_model.requests[1].messages[-1].content
    assert "2. [✓] find trains" in later and "3. [→] summarise" in later
    assert any("executors" in s.key for s in run.context().steps), "the parallel steps ran as one zip"


def test_a_parallel_step_that_gives_up_aborts_the_plan_after_its_group_is_recorded(
    local: dflow.Runtime,
) -> None:
    first, first_model = executor("first")

    def quits(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ChatResponse:
        return ChatResponse(tool_calls=[call("terminate", status="failure", conclusion="no way")])

    quitter = ToolCallAgent(unique("quitter"), FunctionModel(quits))
    steps = ["[QUIT] book", "[FIRST] look", "[FIRST] pack"]
    draft = PlanDraft(title="t", steps=steps)
    flow = PlanningFlow(unique("zipquit"), {"first": first, "quit": quitter})
    book_run = flow.run(draft)
    assert book_run.result(10).status is AgentStatus.TERMINATED  # the plain plan: step 1 never runs
    assert steps_run(first_model) == []

    planner = ScriptedModel([create([{"step": s, "parallel": i < 2} for i, s in enumerate(steps)])])
    flow = PlanningFlow(unique("zipquit"), {"first": first, "quit": quitter}, planner=planner)
    result = flow.run("go").result(10)
    assert result.status is AgentStatus.TERMINATED and "aborted at step 0" in result.reason
    assert [(s.index, s.status) for s in result.steps] == [
        (0, AgentStatus.TERMINATED),
        (1, AgentStatus.FINISHED),
    ]
    assert steps_run(first_model) == [1], "its parallel neighbour ran; the step after the group did not"
    assert result.plan is not None and result.plan.step_statuses[2] is PlanStepStatus.NOT_STARTED
