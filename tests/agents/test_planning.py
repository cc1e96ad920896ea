"""PlanningFlow, the planning tool and plan templates, with scripted models in local mode.

* a plan's steps go to the executors their ``[TYPE]`` tags name, each marked as it goes, the
  executors shown the plan as it stands, the finalizer called once with every result;
* a TERMINATED executor aborts the plan; an ERROR one (or one whose run fails) does not;
* a planner that calls no tool gets the default plan; a wrong planning call is answered with
  an error observation that the planner then corrects;
* every command of the planning tool, and what it says when a call is wrong;
* two runs keep their plans apart;
* a plan saved as a template (in memory and in Redis) runs again with new parameters.
* bad, boolean and huge step indexes and plans, Unicode, plan ids across runs and a planner
  naming its own plan id; template names and format-string look-alikes in templates.
"""

from __future__ import annotations

import asyncio
import pickle
import re
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import cloudpickle
import pytest

import dflow
from dflow import ContextStack, DFlow
from dflow_agents import (
    AgentLimits,
    AgentStatus,
    AIFunction,
    ChatMessage,
    ChatResponse,
    ModelCalls,
    ModelTimeoutError,
    ToolCall,
    ToolCallAgent,
    ToolSpec,
)
from dflow_agents.plan_tool import planning_tool
from dflow_agents.planning import PlanningFlow, PlanningOptions, default_step_prompt
from dflow_agents.plans import (
    MAX_PLAN_STEPS,
    Plan,
    PlanBook,
    PlanDraft,
    PlanningError,
    PlanningResult,
    PlanStepStatus,
    StepResult,
    format_plan,
    step_tag,
)
from dflow_agents.templates import (
    InMemoryPlanTemplates,
    PlanTemplate,
    PlanTemplateNotFoundError,
    PlanTemplates,
    RedisPlanTemplates,
)
from dflow_agents.testing import FunctionModel, ScriptedModel, call, reply
from tests.integration import conftest as integration

redis_url = integration.redis_url
prefix = integration.prefix


def unique(name: str) -> str:
    """Agents and flows are named once per process: a fresh name per test."""
    return f"{name}-{uuid.uuid4().hex[:8]}"


_STEP = re.compile(r"working on step (\d+): \"(.*)\"")


def step_of(messages: Sequence[ChatMessage]) -> tuple[int, str]:
    """The step an executor was given, from its task."""
    task = next(m.content for m in messages if m.role == "user")
    found = _STEP.search(task)
    assert found is not None, task
    return int(found.group(1)), found.group(2)


def worker(label: str) -> Callable[[Sequence[ChatMessage], Sequence[ToolSpec]], str]:
    """An executor's model: answers '<label> did <step text>'."""

    def answer(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        return f"{label} did {step_of(messages)[1]}"

    return answer


def executor(label: str, **options: Any) -> tuple[ToolCallAgent, FunctionModel]:
    model = FunctionModel(worker(label), name=label)
    return ToolCallAgent(unique(label), model, **options), model


def steps_run(model: FunctionModel | ScriptedModel) -> list[int]:
    return [step_of(r.messages)[0] for r in model.requests]


PLAN_STEPS = ["[SEARCH] find flights to Lisbon", "[WRITE] draft the itinerary", "compare the hotel prices"]


# -- the plan's steps and their executors ----------------------------------------------------


def test_a_three_step_plan_runs_each_step_on_the_executor_its_tag_names(local: dflow.Runtime) -> None:
    search, search_model = executor("search")
    write, write_model = executor("write")
    planner = ScriptedModel(
        [
            reply(
                calls=[
                    call(
                        "planning", command="create", plan_id="ignored", title="Lisbon trip", steps=PLAN_STEPS
                    )
                ]
            )
        ]
    )
    finalizer = ScriptedModel([reply("The trip is planned.", expect="Step 2 (finished, by write)")])
    flow = PlanningFlow(
        unique("trip"),
        {"SEARCH": search, "write": write},
        planner=planner,
        finalizer=finalizer,
        options=PlanningOptions(default_executor="write", descriptions={"search": "searches the web"}),
    )
    run = flow.run("Plan a trip to Lisbon")
    result = run.result(10)

    assert result.status is AgentStatus.FINISHED and result.ok
    assert result.answer == "The trip is planned."
    assert [(s.index, s.executor, s.status) for s in result.steps] == [
        (0, "search", AgentStatus.FINISHED),
        (1, "write", AgentStatus.FINISHED),
        (2, "write", AgentStatus.FINISHED),
    ], "tagged steps go to their executor, the untagged one to the default executor"
    assert steps_run(search_model) == [0] and steps_run(write_model) == [1, 2]
    assert result.plan is not None and result.source == "model"
    assert result.plan.plan_id != "ignored", "the planner's plan_id is replaced by the run's own"
    assert result.plan.step_statuses == [PlanStepStatus.COMPLETED] * 3
    assert result.plan.step_notes == [
        "search did find flights to Lisbon",
        "write did draft the itinerary",
        "write did compare the hotel prices",
    ]
    assert result.plan_text == format_plan(result.plan)
    assert "Progress: 3/3 steps completed (100.0%)" in result.plan_text
    assert (
        "0. [✓] [SEARCH] find flights to Lisbon\n   Notes: search did find flights to Lisbon"
        in result.plan_text
    )
    # the plan is in the run's data; the executors' child runs left nothing of theirs there
    data = run.context()
    assert PlanBook(data).get(result.plan.plan_id) == result.plan
    assert not [
        k for k in data.keys() if k.startswith((f"dflow_agents/{search.name}", f"dflow_agents/{write.name}"))
    ]

    # the planner was told the tags; each executor saw the plan as it stood at its step
    system = planner.requests[0].messages[0].content
    assert "[SEARCH]: searches the web" in system and "a step without a tag goes to [WRITE]" in system
    assert [t.name for t in planner.requests[0].tools] == ["planning"]
    second = write_model.requests[0].messages[-1].content
    assert (
        "0. [✓] [SEARCH] find flights to Lisbon" in second and "1. [→] [WRITE] draft the itinerary" in second
    )
    assert "2. [ ] compare the hotel prices" in second and "Plan a trip to Lisbon" in second
    assert "Progress: 1/3 steps completed (33.3%)" in second
    # the finalizer was asked once, with the plan and every result
    assert len(finalizer.requests) == 1
    summary_request = finalizer.requests[0].messages[-1].content
    assert "Step 0 (finished, by search): search did find flights to Lisbon" in summary_request
    assert "3/3 steps completed" in summary_request


def test_a_terminated_step_aborts_the_plan(local: dflow.Runtime) -> None:
    first, first_model = executor("first")
    quitter_model = ScriptedModel(
        [reply(calls=[call("terminate", status="failure", conclusion="no flights at all")])]
    )
    quitter = ToolCallAgent(unique("quitter"), quitter_model)
    finalizer = ScriptedModel([])  # asking it would fail the test
    draft = PlanDraft(title="Trip", steps=["[FIRST] look", "[QUIT] book the flight", "[FIRST] pack"])
    flow = PlanningFlow(unique("abort"), {"first": first, "quit": quitter}, finalizer=finalizer)
    result = flow.run(draft).result(10)

    assert result.status is AgentStatus.TERMINATED and not result.ok
    assert result.answer == "no flights at all"
    assert (
        "aborted at step 1" in result.reason and "gave up" in result.reason and quitter.name in result.reason
    )
    assert steps_run(first_model) == [0], "the step after the terminated one never ran"
    assert result.plan is not None
    assert result.plan.step_statuses == [
        PlanStepStatus.COMPLETED,
        PlanStepStatus.BLOCKED,
        PlanStepStatus.NOT_STARTED,
    ]
    assert (
        "terminated: terminate was called with status failure. no flights at all" in result.plan.step_notes[1]
    )
    assert [s.status for s in result.steps] == [AgentStatus.FINISHED, AgentStatus.TERMINATED]
    assert finalizer.requests == [], "an aborted plan is not summarised"
    assert "1. [!] [QUIT] book the flight" in result.plan_text and "2. [ ] [FIRST] pack" in result.plan_text


class BrokenMemory:
    """A session memory that cannot be read: the executor's run fails before its first turn."""

    async def load(self, session: str) -> list[ChatMessage]:
        raise ConnectionError("the memory is down")

    async def append(self, session: str, messages: Any, *, key: str) -> bool:
        raise ConnectionError("the memory is down")

    async def clear(self, session: str) -> None:
        raise ConnectionError("the memory is down")


def test_an_executor_that_errs_or_fails_does_not_stop_the_plan(local: dflow.Runtime) -> None:
    def loops(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ChatResponse:
        return ChatResponse(tool_calls=[ToolCall(id="", name="terminate", arguments={"status": "maybe"})])

    looping = ToolCallAgent(
        unique("looping"), FunctionModel(loops), limits=AgentLimits(max_steps=1)
    )  # ERROR at max_steps
    broken = ToolCallAgent(unique("broken"), FunctionModel(worker("broken")), memory=BrokenMemory())
    last, last_model = executor("last")
    draft = PlanDraft(title="t", steps=["[LOOP] spin", "[BROKEN] read memory", "finish"])
    flow = PlanningFlow(unique("errs"), {"last": last, "loop": looping, "broken": broken})
    result = flow.run(draft, session="ann").result(10)

    assert result.status is AgentStatus.FINISHED
    assert [s.status for s in result.steps] == [AgentStatus.ERROR, AgentStatus.ERROR, AgentStatus.FINISHED]
    assert "max_steps" in result.steps[0].reason
    assert (
        "the executor's run failed: " in result.steps[1].reason
        and "the memory is down" in result.steps[1].reason
    )
    assert steps_run(last_model) == [2]
    assert result.plan is not None
    assert result.plan.step_statuses == [
        PlanStepStatus.BLOCKED,
        PlanStepStatus.BLOCKED,
        PlanStepStatus.COMPLETED,
    ]
    # no finalizer: the answer lists the results
    assert result.answer.startswith("Plan completed: t\nStep 0 (error, by loop): reached max_steps")


def test_a_planner_that_calls_no_tool_gets_the_default_plan(local: dflow.Runtime) -> None:
    doer, doer_model = executor("doer")
    planner = ScriptedModel([reply("I would rather just talk about it.")])
    flow = PlanningFlow(unique("chatty"), doer, planner)
    request = "Organise the team offsite in Porto for twelve people in May"
    result = flow.run(request).result(10)

    assert result.source == "default" and result.status is AgentStatus.FINISHED
    assert "did not call the planning tool" in result.reason
    assert result.plan is not None
    assert result.plan.title == f"Plan for: {request[:50]}..."
    assert result.plan.steps == ["Analyze the request", "Execute the task", "Verify the results"]
    assert steps_run(doer_model) == [0, 1, 2]
    assert request in doer_model.requests[0].messages[-1].content, "the executors see the request"
    # the same model is the finalizer: asked a second time, without tools, for the summary
    assert [len(r.tools) for r in planner.requests] == [1, 0]
    assert "The results of the steps:" in planner.requests[1].messages[-1].content


def test_a_planning_call_written_as_text_makes_the_plan(local: dflow.Runtime) -> None:
    doer, _ = executor("doer")
    written = '```json\n{"name": "planning", "arguments": {"command": "create", "title": "Trip", "steps": ["book"]}}\n```'
    planner = ScriptedModel([reply(written)])
    result = PlanningFlow(unique("texty"), doer, planner=planner).run("Plan a trip").result(10)
    assert (result.source, result.status) == ("model", AgentStatus.FINISHED)
    assert result.plan is not None and (result.plan.title, result.plan.steps) == ("Trip", ["book"])


def test_the_planner_is_told_the_tool_choice_and_the_finalizer_is_not(local: dflow.Runtime) -> None:
    doer, _ = executor("doer")
    planner = ScriptedModel([reply(calls=[call("planning", command="create", title="T", steps=["a"])])])
    finalizer = ScriptedModel([reply("summary")])
    calls = ModelCalls(tool_choice="planning")
    flow = PlanningFlow(unique("chosen"), doer, planner=planner, finalizer=finalizer, model_calls=calls)
    assert flow.run("x").result(10).answer == "summary"
    assert [r.options.get("tool_choice") for r in planner.requests + finalizer.requests] == ["planning", None]
    with pytest.raises(ValueError, match="tool_choice 'search' is neither"):
        PlanningFlow(unique("bad"), doer, planner, model_calls=ModelCalls(tool_choice="search"))


def test_a_wrong_planning_call_is_answered_with_an_error_that_the_planner_corrects(
    local: dflow.Runtime,
) -> None:
    doer, doer_model = executor("doer")
    planner = ScriptedModel(
        [
            reply(
                calls=[ToolCall(id="c1", name="planning", raw_arguments='{"command": "create", "title": ')]
            ),
            reply(
                calls=[call("planning", command="create", steps="find flights, book hotel")],
                expect="not a JSON object",
            ),
            reply(
                calls=[call("planning", command="create", steps=["find flights", "book hotel"])],
                expect="steps: Input should be a valid list",
            ),
            reply(
                calls=[
                    call("planning", command="create", title="Trip", steps=["find flights", "book hotel"])
                ],
                expect="the plan needs a title",
            ),
        ]
    )
    flow = PlanningFlow(unique("corrected"), doer, planner=planner, options=PlanningOptions(plan_attempts=4))
    result = flow.run("Plan a trip").result(10)

    assert result.source == "model" and result.status is AgentStatus.FINISHED
    assert result.plan is not None and result.plan.steps == ["find flights", "book hotel"]
    assert steps_run(doer_model) == [0, 1]
    observations = [m for m in planner.requests[-1].messages if m.role == "tool"]
    assert [m.tool_call_id for m in observations] == ["c1", "call_1_0", "call_2_0"]
    assert all(m.content.startswith("Error: ") for m in observations)
    assert "Call the tool again" in observations[1].content


def test_a_planner_that_keeps_failing_gets_the_default_plan(local: dflow.Runtime) -> None:
    doer, _ = executor("doer")
    bad = reply(calls=[call("planning", command="get")])  # no plan exists yet: an error each time
    planner = ScriptedModel([bad, bad])
    result = (
        PlanningFlow(unique("stubborn"), doer, planner=planner, options=PlanningOptions(plan_attempts=2))
        .run("x")
        .result(10)
    )
    assert result.source == "default" and len(planner.requests) == 2
    assert "failed 2 times" in result.reason and "there is no plan with ID" in result.reason


def test_a_failing_planner_or_finalizer(local: dflow.Runtime) -> None:
    doer, doer_model = executor("doer")

    def down(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ChatResponse:
        raise RuntimeError("no route to the model")

    result = PlanningFlow(unique("no-planner"), doer, FunctionModel(down)).run("x").result(10)
    assert result.status is AgentStatus.ERROR and result.plan is None and result.steps == []
    assert result.reason == "the planner failed: RuntimeError: no route to the model"
    assert doer_model.requests == []

    draft = PlanDraft(title="t", steps=["one"])
    result = PlanningFlow(unique("no-finalizer"), doer, finalizer=FunctionModel(down)).run(draft).result(10)
    assert (
        result.status is AgentStatus.FINISHED
        and result.answer == "Step 0 (finished, by default): doer did one"
    )
    assert result.reason == "every step was run; the finalizer failed: RuntimeError: no route to the model"


def test_retryable_model_errors_are_retried(local: dflow.Runtime) -> None:
    doer, _ = executor("doer")
    failures = {"planner": 1, "finalizer": 1}  # local mode: one process, so a counter may decide

    def flaky(kind: str, response: ChatResponse) -> FunctionModel:
        def answer(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ChatResponse:
            if failures[kind]:
                failures[kind] -= 1
                raise ModelTimeoutError(f"the {kind} timed out")
            return response

        return FunctionModel(answer)

    plan_call = ChatResponse(
        tool_calls=[
            ToolCall(id="", name="planning", arguments={"command": "create", "title": "t", "steps": ["a"]})
        ]
    )
    flow = PlanningFlow(
        unique("flaky"),
        doer,
        planner=flaky("planner", plan_call),
        finalizer=flaky("finalizer", ChatResponse(content="summary")),
        model_calls=ModelCalls(retry_backoff=0.01),
    )
    result = flow.run("x").result(10)
    assert (result.status, result.source, result.answer) == (AgentStatus.FINISHED, "model", "summary")
    assert failures == {"planner": 0, "finalizer": 0}


def test_replaceable_parts_an_ai_function_planner_a_step_prompt_and_a_finalizer(local: dflow.Runtime) -> None:
    doer, doer_model = executor("doer")
    raw = ScriptedModel([reply(calls=[call("planning", command="create", title="t", steps=["a", "b"])])])
    planner = AIFunction.qwen(raw)  # the raw-completion path: the call is parsed from <tool_call> text
    seen: list[tuple[str, int]] = []

    async def prompt(request: str, plan: Plan, index: int) -> str:
        seen.append((plan.step_statuses[index].value, index))
        return "Custom. " + default_step_prompt(request, plan, index)

    def finalize(request: str, plan: Plan, steps: Sequence[StepResult]) -> str:
        return f"{request}: " + "; ".join(s.answer for s in steps)

    flow = PlanningFlow(
        unique("parts"),
        doer,
        planner=planner,
        finalizer=finalize,
        options=PlanningOptions(step_prompt=prompt),
    )
    result = flow.run("go").result(10)
    assert result.answer == "go: doer did a; doer did b" and result.source == "model"
    assert seen == [("in_progress", 0), ("in_progress", 1)]
    assert doer_model.requests[0].messages[-1].content.startswith("Custom. CURRENT PLAN STATUS:")
    assert raw.requests[0].prompt is not None and '"name": "planning"' in raw.requests[0].prompt


def test_embedded_in_another_flow_the_plan_is_kept_in_the_callers_run(local: dflow.Runtime) -> None:
    doer, _ = executor("doer")
    flow = PlanningFlow(unique("embedded"), doer)
    run = DFlow.direct_run(
        PlanDraft(title="t", steps=["a"]), lambda d: DFlow.just(d).flat_map(flow.flow).id("plan")
    )
    result = run.result(10)
    assert isinstance(result, PlanningResult) and result.source == "given"
    book = PlanBook(run.context())
    assert result.plan is not None and book.get(result.plan.plan_id) == result.plan
    assert book.active == result.plan.plan_id


def test_step_tags() -> None:
    assert step_tag("[SEARCH] find flights") == ("search", "find flights")
    assert step_tag("  [web_2-x]  look") == ("web_2-x", "look")
    assert step_tag("find [SEARCH] flights") == (None, "find [SEARCH] flights")
    assert step_tag("[two words] no") == (None, "[two words] no")


def test_an_unknown_tag_goes_to_the_default_executor(local: dflow.Runtime) -> None:
    doer, doer_model = executor("doer")
    other, other_model = executor("other")
    flow = PlanningFlow(unique("unknown-tag"), {"doer": doer, "other": other})
    result = flow.run(PlanDraft(title="t", steps=["[NOBODY] a", "[OTHER] b"])).result(10)
    assert [s.executor for s in result.steps] == ["doer", "other"]
    assert steps_run(doer_model) == [0] and steps_run(other_model) == [1]


def test_the_constructor_says_what_is_wrong() -> None:
    doer, _ = executor("doer")
    with pytest.raises(TypeError, match="executors is an agent or a non-empty mapping"):
        PlanningFlow(unique("bad"), {})
    with pytest.raises(ValueError, match="executor tag 'two words'"):
        PlanningFlow(unique("bad"), {"two words": doer})
    with pytest.raises(ValueError, match="two executors are tagged 'doer'"):
        PlanningFlow(unique("bad"), {"doer": doer, "DOER": doer})
    with pytest.raises(TypeError, match="executor 'x' is not an agent"):
        PlanningFlow(unique("bad"), {"x": object()})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="default_executor 'nobody'"):
        PlanningFlow(unique("bad"), {"doer": doer}, options=PlanningOptions(default_executor="nobody"))
    with pytest.raises(ValueError, match="descriptions name executors that do not exist: ghost"):
        PlanningFlow(unique("bad"), {"doer": doer}, options=PlanningOptions(descriptions={"ghost": "boo"}))
    with pytest.raises(TypeError, match="planner must be a ChatModel or an AIFunction"):
        PlanningFlow(unique("bad"), doer, planner="gpt")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="plan_attempts must be an int >= 1"):
        PlanningOptions(plan_attempts=0)
    with pytest.raises(TypeError, match="options is a PlanningOptions"):
        PlanningFlow(unique("bad"), doer, options={"plan_attempts": 2})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="planning flow name"):
        PlanningFlow("no spaces allowed", doer)
    flow = PlanningFlow(unique("ok"), doer)
    with pytest.raises(ValueError, match="the request is empty"):
        flow.run("  ")
    with pytest.raises(TypeError, match="starts from a request"):
        flow.run(42)  # type: ignore[arg-type]


# -- the planning tool -----------------------------------------------------------------------


def tool_observations(model: ScriptedModel) -> list[str]:
    return [m.content for m in model.requests[-1].messages if m.role == "tool"]


def test_every_planning_command_and_its_errors_through_an_agent(local: dflow.Runtime) -> None:
    script = [
        call("planning", command="create", plan_id="trip", title="Trip", steps=["a", "b", "c"]),
        call("planning", command="create", plan_id="trip", title="Again", steps=["x"]),
        call("planning", command="mark_step", step_index=1, step_status="in_progress", step_notes="half way"),
        call("planning", command="mark_step", plan_id="trip", step_index=7, step_status="completed"),
        call("planning", command="mark_step", step_index=0, step_status="done"),
        call("planning", command="update", plan_id="trip", steps=["a", "b", "d"]),
        call("planning", command="create", plan_id="other", title="Other", steps=["o"]),
        call("planning", command="list"),
        call("planning", command="set_active", plan_id="nope"),
        call("planning", command="set_active", plan_id="trip"),
        call("planning", command="delete", plan_id="other"),
        call("planning", command="get", plan_id="other"),
        call("planning", command="get"),
        call("planning", command="delete", plan_id="trip"),
        call("planning", command="get"),
        call("planning", command="create", plan_id="bad id!", title="t", steps=["s"]),
        call("planning", command="create", plan_id="p", title="t", steps=[]),
        call("planning", command="fly"),
        ToolCall(id="", name="planning", raw_arguments="{'command': 'list'"),
    ]
    model = ScriptedModel([reply(calls=[c]) for c in script] + [reply("done")])
    agent = ToolCallAgent(
        unique("planner-agent"), model, [planning_tool], limits=AgentLimits(max_steps=30, loop_guard=None)
    )
    run = agent.run("make plans")
    assert run.result(10).status is AgentStatus.FINISHED
    seen = tool_observations(model)
    assert len(seen) == len(script)
    expected = [
        "Plan 'trip' created; it is the active plan.",
        (
            "Error: tool 'planning' failed: PlanningError: a plan with ID 'trip' already exists: use the command "
            "'update'"
        ),
        "Step 1 of plan 'trip' updated.",
        (
            "Error: tool 'planning' failed: PlanningError: step_index 7 is out of range: plan 'trip' has 3 steps, "
            "numbered 0 to 2"
        ),
        (
            "Error: invalid arguments for tool 'planning': step_status: Input should be 'not_started', "
            "'in_progress', 'completed' or 'blocked'"
        ),
        "Plan 'trip' updated.",
        "Plan 'other' created; it is the active plan.",
        "Plans:\n• other (active): Other - 0/1 steps completed\n• trip: Trip - 0/3 steps completed",
        "Error: tool 'planning' failed: PlanningError: there is no plan with ID 'nope': the plans are: other, trip",
        "Plan 'trip' is now the active plan.",
        "Plan 'other' deleted.",
        "Error: tool 'planning' failed: PlanningError: there is no plan with ID 'other': the plans are: trip",
        "Plan: Trip (ID: trip)",
        "Plan 'trip' deleted.",
        (
            "Error: tool 'planning' failed: PlanningError: the command 'get' got no plan_id and no plan is active: "
            "give the plan_id, or create a plan first"
        ),
        "Error: tool 'planning' failed: PlanningError: plan_id 'bad id!' is not accepted",
        "Error: tool 'planning' failed: PlanningError: steps must be a non-empty list of texts",
        "Error: invalid arguments for tool 'planning': command: Input should be 'create', 'update'",
        "Error: the arguments for tool 'planning' are not a JSON object",
    ]
    for i, (got, want) in enumerate(zip(seen, expected)):
        assert got.startswith(want), f"call #{i}: {got!r}"
    assert "1. [→] b\n   Notes: half way" in seen[2]
    assert "1. [→] b\n   Notes: half way\n2. [ ] d" in seen[5], "update keeps what an unchanged step had"
    assert "Progress: 0/3 steps completed (0.0%)" in seen[12]
    # the plans are the run's data: 'trip' and 'other' were both deleted, nothing is left
    book = PlanBook(run.context())
    assert book.ids() == [] and book.active is None


def test_plans_live_in_the_run_and_any_step_continues_them(local: dflow.Runtime) -> None:
    model = ScriptedModel(
        [
            reply(
                calls=[
                    call("planning", command="create", plan_id="p1", title="One", steps=["a", "b"]),
                    call("planning", command="create", plan_id="p2", title="Two", steps=["c"]),
                ]
            ),
            reply(
                calls=[
                    call("planning", command="mark_step", plan_id="p1", step_index=0, step_status="completed")
                ]
            ),
            reply("ok"),
        ]
    )
    run = ToolCallAgent(unique("two-plans"), model, [planning_tool]).run("go")
    run.result(10)
    book = PlanBook(run.context())
    assert book.ids() == ["p1", "p2"], "two calls of one turn (a zip) both keep their plan"
    p1 = book.get("p1")
    assert p1 is not None and p1.step_statuses == [PlanStepStatus.COMPLETED, PlanStepStatus.NOT_STARTED]


def test_two_concurrent_runs_keep_their_plans_apart(local: dflow.Runtime) -> None:
    def planner_for(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ChatResponse:
        if any(m.role == "tool" for m in messages):
            return ChatResponse(content="done")
        who = messages[-1].content.rsplit(" ", 1)[-1]
        return ChatResponse(
            tool_calls=[
                ToolCall(
                    id="",
                    name="planning",
                    arguments={
                        "command": "create",
                        "plan_id": "trip",
                        "title": f"Trip of {who}",
                        "steps": [f"pack for {who}"],
                    },
                )
            ]
        )

    agent = ToolCallAgent(unique("sessions"), FunctionModel(planner_for), [planning_tool])
    runs = [agent.run("plan for ann"), agent.run("plan for bob")]
    dflow.gather(runs, timeout=10)
    titles = []
    for r in runs:
        plan = PlanBook(r.context()).get("trip")
        assert plan is not None
        titles.append((plan.title, plan.steps))
    assert titles == [("Trip of ann", ["pack for ann"]), ("Trip of bob", ["pack for bob"])]

    doer, _ = executor("doer")
    flow = PlanningFlow(unique("apart"), doer, FunctionModel(planner_for))
    results = dflow.gather([flow.run("plan for cyd"), flow.run("plan for dan")], timeout=10)
    assert [(r.plan.title if r.plan else None, r.steps[0].answer) for r in results] == [
        ("Trip of cyd", "doer did pack for cyd"),
        ("Trip of dan", "doer did pack for dan"),
    ]
    assert results[0].plan is not None and results[1].plan is not None
    assert results[0].plan.plan_id != results[1].plan.plan_id


def test_the_plan_book_on_its_own() -> None:
    book = PlanBook(ContextStack("t"))
    plan = book.create("p", "  Title ", ["  one", "two"])
    assert plan.title == "Title" and plan.steps == ["one", "two"] and book.active == "p"
    text = format_plan(book.mark_step("p", 0, "completed", "fine"))
    assert text == (
        "Plan: Title (ID: p)\n"
        "====================\n\n"
        "Progress: 1/2 steps completed (50.0%)\n"
        "Status: 1 completed, 0 in progress, 0 blocked, 1 not started\n\n"
        "Steps:\n"
        "0. [✓] one\n"
        "   Notes: fine\n"
        "1. [ ] two\n"
    )
    assert book.mark_step("p", 1, "blocked", None).text().endswith("1. [!] two\n")
    with pytest.raises(PlanningError, match="needs step_status or step_notes"):
        book.mark_step("p", 0, None, None)
    with pytest.raises(PlanningError, match="step_status 'done' is not one of"):
        book.mark_step("p", 0, "done", None)
    with pytest.raises(PlanningError, match="step_index True is out of range"):
        book.mark_step("p", True, "completed", None)  # type: ignore[arg-type]
    with pytest.raises(PlanningError, match=f"a plan has at most {MAX_PLAN_STEPS}"):
        book.create("q", "t", ["s"] * (MAX_PLAN_STEPS + 1))
    with pytest.raises(PlanningError, match="the title is 501 characters long"):
        book.create("q", "t" * 501, ["s"])
    with pytest.raises(PlanningError, match="step 1 is ''; every step is a non-empty text"):
        book.create("q", "t", ["s", ""])
    with pytest.raises(PlanningError, match="needs a new title or new steps"):
        book.update("p", None, None)
    with pytest.raises(PlanningError, match="unknown command 'fly'"):
        book.execute("fly")
    assert book.execute("list").startswith("Plans:\n• p (active): Title - 1/2 steps completed")
    with pytest.raises(ValueError, match="one status and one note per step"):
        Plan(plan_id="x", title="t", steps=["a"], step_statuses=[], step_notes=["n"])


def test_the_planning_tool_pickles_and_its_schema() -> None:
    for dumps, loads in ((pickle.dumps, pickle.loads), (cloudpickle.dumps, cloudpickle.loads)):
        again = loads(dumps(planning_tool))
        assert again.spec == planning_tool.spec and again.is_flow
    props = planning_tool.spec.parameters["properties"]
    assert planning_tool.spec.parameters["required"] == ["command"]
    assert props["command"]["enum"] == [
        "create",
        "update",
        "list",
        "get",
        "set_active",
        "mark_step",
        "delete",
    ]
    assert set(props) == {"command", "plan_id", "title", "steps", "step_index", "step_status", "step_notes"}


# -- templates -------------------------------------------------------------------------------


@pytest.fixture(params=["in-memory", "redis"])
def templates(request: pytest.FixtureRequest) -> Iterator[PlanTemplates]:
    if request.param == "in-memory":
        yield InMemoryPlanTemplates()
        return
    url = request.getfixturevalue("redis_url")
    yield RedisPlanTemplates(url, prefix=request.getfixturevalue("prefix"))


def test_a_template_saved_and_run_twice_with_different_parameters(
    local: dflow.Runtime, templates: PlanTemplates
) -> None:
    search, search_model = executor("search")
    write, write_model = executor("write")
    planner = ScriptedModel([])  # a template's run never asks the planner
    flow = PlanningFlow(unique("templated"), {"search": search, "write": write}, planner=planner)
    # a plan a run made, saved with its request's city as a parameter
    made = Plan(
        plan_id="p", title="Weekend in Lisbon", steps=["[SEARCH] flights to Lisbon", "[WRITE] a {draft}"]
    )
    first = PlanTemplate.from_plan("weekend", made, {"city": "Lisbon"}, request="A weekend in Lisbon")
    assert first.steps == ["[SEARCH] flights to {city}", "[WRITE] a {{draft}}"] and first.parameters == [
        "city"
    ]
    assert first.request == "A weekend in {city}"

    async def scenario() -> list[PlanningResult]:
        try:
            saved = await templates.save(first)
            assert saved.version == 1
            second = PlanTemplate(
                name="weekend",
                title=first.title,
                request=first.request + ", {days} days",
                steps=[*first.steps, "[WRITE] pack for {days} days in {city}"],
            )
            assert second.parameters == ["city", "days"]
            assert (await templates.save(second)).version == 2
            assert await templates.versions("weekend") == [1, 2] and await templates.names() == ["weekend"]
            assert (await templates.get("weekend", 1)).steps == first.steps
            results = []
            for city, days in (("Porto", "2"), ("Madrid", "3")):
                run = await flow.arun_template(templates, "weekend", {"city": city, "days": days})
                results.append(await run.wait(10))
            with pytest.raises(
                ValueError, match="takes the parameters: city, days; missing days and unknown nights"
            ):
                await flow.arun_template(templates, "weekend", {"city": "Rome", "nights": "2"})
            with pytest.raises(PlanTemplateNotFoundError, match="has no version 7; its versions are 1, 2"):
                await templates.get("weekend", 7)
            with pytest.raises(PlanTemplateNotFoundError, match="no plan template named 'nothing'"):
                await templates.get("nothing")
            assert await templates.delete("weekend") and not await templates.delete("weekend")
            assert await templates.names() == []
            return results
        finally:
            if isinstance(templates, RedisPlanTemplates):
                await templates.aclose()

    porto, madrid = asyncio.run(scenario())
    for result, city, days in ((porto, "Porto", "2"), (madrid, "Madrid", "3")):
        assert result.status is AgentStatus.FINISHED
        assert (result.source, result.template) == ("template", "weekend@2")
        assert result.plan is not None and result.plan.title == f"Weekend in {city}"
        assert result.plan.steps == [
            f"[SEARCH] flights to {city}",
            "[WRITE] a {draft}",
            f"[WRITE] pack for {days} days in {city}",
        ]
        assert [s.answer for s in result.steps] == [
            f"search did flights to {city}",
            "write did a {draft}",
            f"write did pack for {days} days in {city}",
        ]
    assert planner.requests == []
    assert steps_run(search_model) == [0, 0] and steps_run(write_model) == [1, 2, 1, 2]
    assert "A weekend in Porto, 2 days" in write_model.requests[0].messages[-1].content


def test_template_checks() -> None:
    t = PlanTemplate(name="t", title="For {who}", steps=["greet {who}", "say {{hi}}"])
    assert t.parameters == ["who"]
    draft = t.fill({"who": "{x} and {{y}}"})
    assert draft.steps == ["greet {x} and {{y}}", "say {hi}"], "values are not expanded again"
    assert draft.request == "" and draft.template == "t@0"
    with pytest.raises(TypeError, match="parameter 'who' is a int; parameters are text"):
        t.fill({"who": 3})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="takes the parameters: who; missing who"):
        t.fill({})
    with pytest.raises(ValueError, match="not a valid plan"):
        PlanTemplate(name="t", title="t", steps=["{step}"]).fill({"step": " "})
    with pytest.raises(ValueError, match="template name 'a b'"):
        PlanTemplate(name="a b", title="t", steps=["s"])
    with pytest.raises(ValueError, match="steps must be a non-empty list"):
        PlanTemplate(name="t", title="t", steps=[])
    with pytest.raises(ValueError, match="parameter name '1x'"):
        PlanTemplate.from_plan("t", Plan(plan_id="p", title="t", steps=["s"]), {"1x": "s"})
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(InMemoryPlanTemplates())
    with pytest.raises(ValueError, match="not a Redis URL"):
        RedisPlanTemplates("http://user:pw@host/")
    assert "pw" not in repr(RedisPlanTemplates("redis://:pw@127.0.0.1:6379/11"))


@pytest.mark.parametrize("kind", ["in-memory", "redis"])
def test_a_store_keeps_the_last_max_versions(kind: str, request: pytest.FixtureRequest) -> None:
    store: PlanTemplates
    if kind == "redis":
        store = RedisPlanTemplates(
            request.getfixturevalue("redis_url"), prefix=request.getfixturevalue("prefix"), max_versions=2
        )
    else:
        store = InMemoryPlanTemplates(max_versions=2)

    async def scenario() -> tuple[list[int], str, list[int]]:
        try:
            for n in range(3):
                await store.save(PlanTemplate(name="t", title=f"v{n + 1}", steps=["s"]))
            kept = await store.versions("t")
            latest = (await store.get("t")).title
            with pytest.raises(PlanTemplateNotFoundError, match="has no version 1; its versions are 2, 3"):
                await store.get("t", 1)
            with pytest.raises(ValueError, match="version is a number from 1"):
                await store.get("t", 0)
            with pytest.raises(ValueError, match="template name 'a/b'"):
                await store.get("a/b")
            return kept, latest, await store.versions("never")
        finally:
            if isinstance(store, RedisPlanTemplates):
                await store.aclose()

    assert asyncio.run(scenario()) == ([2, 3], "v3", [])


# -- the planning tool and PlanningFlow ----------------------------------------------------------


def run_planning_calls(*calls: ToolCall) -> tuple[list[str], dflow.Run[Any]]:
    """Run an agent whose model makes ``calls`` one per turn, then answers; what each call was
    told. (A model that counts turns by the request alone would lose count when the context
    window leaves huge turns out: this one keeps its own count, fine in local mode.)"""
    script = iter(calls)

    def next_call(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ChatResponse:
        planned = next(script, None)
        return ChatResponse(tool_calls=[planned]) if planned is not None else ChatResponse(content="done")

    model = FunctionModel(next_call)
    agent = ToolCallAgent(
        unique("rv-planner"),
        model,
        [planning_tool],
        limits=AgentLimits(max_steps=len(calls) + 5, loop_guard=None),
    )
    run = agent.run("plan things")
    assert run.result(20).status is AgentStatus.FINISHED
    seen = [r.messages[-1].content for r in model.requests[1:]]  # each turn's observation, the last message
    assert len(seen) == len(calls) and all(r.messages[-1].role == "tool" for r in model.requests[1:])
    return seen, run


CREATE = call("planning", command="create", plan_id="p", title="T", steps=["a", "b", "c"])


def test_a_boolean_step_index_is_an_error_observation(runtime: dflow.Runtime) -> None:
    seen, run = run_planning_calls(
        CREATE, call("planning", command="mark_step", step_index=True, step_status="completed")
    )
    assert seen[1].startswith("Error"), seen[1]
    plan = PlanBook(run.context()).get("p")
    assert plan is not None and plan.step_statuses == [PlanStepStatus.NOT_STARTED] * 3


def test_bad_step_indexes_are_error_observations_and_change_nothing(runtime: dflow.Runtime) -> None:
    bad = [-1, 3, 10**12, -(10**12), 1.5, "one", [1], {"i": 1}, None]
    calls = [call("planning", command="mark_step", step_index=i, step_status="completed") for i in bad]
    seen, run = run_planning_calls(CREATE, *calls)
    for index, said in zip(bad, seen[1:]):
        assert said.startswith("Error"), (index, said)
    assert "step_index -1 is out of range" in seen[1] and "numbered 0 to 2" in seen[2]
    plan = PlanBook(run.context()).get("p")
    assert plan is not None and plan.step_statuses == [PlanStepStatus.NOT_STARTED] * 3


def test_huge_plans_are_refused_with_the_limit_and_store_nothing(runtime: dflow.Runtime) -> None:
    seen, run = run_planning_calls(
        call("planning", command="create", plan_id="big", title="T", steps=["s"] * 10_000),
        call("planning", command="create", plan_id="big", title="T" * 100_000, steps=["s"]),
        call("planning", command="create", plan_id="big", title="T", steps=["s" * 3000]),
        call("planning", command="create", plan_id="big", title="T", steps=["s", "   "]),
        call("planning", command="create", plan_id="big", title="T", steps="one, two"),
        call("planning", command="create", plan_id="x" * 65, title="T", steps=["s"]),
    )
    assert "at most 100" in seen[0] and "10000 steps" in seen[0]
    assert "at most 500" in seen[1]
    assert "at most 2000" in seen[2]
    assert "every step is a non-empty text" in seen[3]
    assert all(s.startswith("Error") for s in seen), seen
    assert PlanBook(run.context()).ids() == []


def test_unicode_plans_round_trip_and_odd_plan_ids_are_refused(runtime: dflow.Runtime) -> None:
    title = "Viagem a S\u00e3o Paulo \U0001f680 \u05e9\u05dc\u05d5\u05dd"
    steps = ["\u6771\u4eac\u3078\u884c\u304f", "e\u0301te\u0301", "\u202eevil\u202c text", "tab\tand \\n"]
    seen, run = run_planning_calls(
        call("planning", command="create", plan_id="uni", title=title, steps=steps),
        call("planning", command="create", plan_id="pl\u00e4n", title="T", steps=["s"]),
        call("planning", command="create", plan_id="a/b", title="T", steps=["s"]),
        call("planning", command="create", plan_id="../plan-active", title="T", steps=["s"]),
        call("planning", command="get", plan_id="uni\u0000"),
    )
    plan = PlanBook(run.context()).get("uni")
    assert plan is not None and plan.title == title and plan.steps == steps
    for i, step in enumerate(steps):
        assert f"{i}. [ ] {step}" in seen[0]
    assert all(s.startswith("Error") and "plan_id" in s for s in seen[1:]), seen[1:]
    assert PlanBook(run.context()).ids() == ["uni"]


def test_a_run_never_reaches_the_plans_of_another_run(runtime: dflow.Runtime) -> None:
    _, first = run_planning_calls(
        call("planning", command="create", plan_id="shared", title="Mine", steps=["a"])
    )
    seen, second = run_planning_calls(
        call("planning", command="get", plan_id="shared"),
        call("planning", command="mark_step", plan_id="shared", step_index=0, step_status="blocked"),
        call("planning", command="set_active", plan_id="shared"),
        call("planning", command="delete", plan_id="shared"),
        call("planning", command="list"),
    )
    assert all("there is no plan with ID 'shared'" in s for s in seen[:4]), seen
    assert seen[4].startswith("There are no plans yet")
    mine = PlanBook(first.context()).get("shared")
    assert mine is not None and mine.title == "Mine" and mine.step_statuses == [PlanStepStatus.NOT_STARTED]
    assert PlanBook(second.context()).ids() == []


def test_a_planner_cannot_choose_its_plan_id(runtime: dflow.Runtime) -> None:
    planner = ScriptedModel(
        [reply(calls=[call("planning", command="create", plan_id="victim", title="Mine", steps=["do it"])])]
    )
    doer = ToolCallAgent(unique("rv-doer"), FunctionModel(lambda m, t: "done it"))
    flow = PlanningFlow(unique("rv-plan-id"), doer, planner=planner)
    run = flow.run("a task")
    result = run.result(20)
    assert result.status is AgentStatus.FINISHED and result.source == "model"
    assert result.plan is not None and result.plan.plan_id.startswith("plan_") and result.plan.title == "Mine"
    assert PlanBook(run.context()).ids() == [result.plan.plan_id]


# -- plan templates ------------------------------------------------------------------------------


def test_format_string_look_alikes_are_plain_text_or_plain_parameters() -> None:
    template = PlanTemplate(
        name="rv-fmt",
        title="Trip to {city}",
        steps=[
            "{__class__} and {__init__}",
            "{0.__init__} {a!r} {city:>10} {} { city } {city.upper}",
            "{{city}} {{{city}}} }} {{ {",
            "{city}{city}",
        ],
    )
    assert template.parameters == ["__class__", "__init__", "city"]
    draft = template.fill({"city": "{__class__.__mro__}", "__class__": "K", "__init__": "{0}"})
    assert draft.title == "Trip to {__class__.__mro__}"  # a value is inserted as it is, never read again
    assert draft.steps == [
        "K and {0}",
        "{0.__init__} {a!r} {city:>10} {} { city } {city.upper}",
        "{city} {{__class__.__mro__}} } { {",
        "{__class__.__mro__}{__class__.__mro__}",
    ]
    with pytest.raises(ValueError, match="missing __init__"):
        template.fill({"city": "x", "__class__": "y"})
    with pytest.raises(ValueError, match="unknown 0"):
        template.fill({"city": "x", "__class__": "y", "__init__": "z", "0": "w"})
    with pytest.raises(TypeError, match="parameters are text"):
        template.fill({"city": object(), "__class__": "y", "__init__": "z"})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="at most 4000"):
        template.fill({"city": "x" * 4001, "__class__": "y", "__init__": "z"})


def test_template_names_with_special_characters_are_refused() -> None:
    store = InMemoryPlanTemplates()
    for name in ("a b", "a/b", "a*", "{a}", "a\nb", "\u00e9", "", "x" * 65, "a\x00", "a;DEL *"):
        with pytest.raises(ValueError, match="template name"):
            PlanTemplate(name=name, title="T", steps=["s"])
        for op in (store.get(name), store.versions(name), store.delete(name)):
            with pytest.raises(ValueError, match="template name"):
                asyncio.run(op)
    saved = asyncio.run(store.save(PlanTemplate(name="a:b@c.d-e_f", title="T", steps=["s"])))
    assert saved.version == 1 and asyncio.run(store.names()) == ["a:b@c.d-e_f"]


def test_a_template_made_from_a_plan_fills_back_to_that_plan() -> None:
    plan = PlanDraft(title="Lisbon trip", steps=["Fly to Lisbon", "Eat tarts"])
    values = {"city": "Lisbon", "x": "t"}
    template = PlanTemplate.from_plan("rv-roundtrip", plan, values)
    again = template.fill(values)
    assert (again.title, again.steps) == (plan.title, plan.steps)
