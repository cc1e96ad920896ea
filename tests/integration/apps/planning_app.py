"""A planning flow that the worker processes of the planning integration test import
(``dflow worker tests.integration.apps.planning_app``), declared at import time as an application
would.

``trip`` plans ``[SEARCH] ...``, ``[WRITE] ...``, ``[SEARCH] ...`` (its planner is a
:class:`FunctionModel` that decides from the conversation alone) and gives each step to the
``search`` or the ``write`` :class:`ToolCallAgent`. Each executor calls ``work`` once, with the
key ``<job>:step-<i>``, then answers with what it returned; the finalizer joins the answers.

As in ``agent_app``, a request names its *job* (``"job <id>: ..."``): ``work`` counts its
executions under its key in the Redis hash ``<job>:tool-execs``, every model call is counted
in ``<job>:model-calls`` (``planner``, ``finalizer``, ``<executor>-step<i>-turn<t>``), and a
key in the set ``<job>:hold`` makes the first execution of ``work`` block, so that a test
can kill the worker while that step is in flight.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Sequence

import redis

from dflow_agents import AgentLimits, ChatMessage, ChatResponse, ToolCall, ToolCallAgent, ToolSpec, tool
from dflow_agents.planning import PlanningFlow
from dflow_agents.testing import FunctionModel

REDIS = os.environ.get("DFLOW_TEST_REDIS", "redis://127.0.0.1:6379/11")
HOLD_SECONDS = 120.0  # far longer than any test: the worker is killed during it

_r = redis.Redis.from_url(REDIS)
_JOB = re.compile(r"\bjob (\S+): ")
_STEP = re.compile(r"working on step (\d+): ")

STEPS = ["[SEARCH] find the flights", "[WRITE] draft the itinerary", "[SEARCH] check the hotels"]
#: the steps of ``parallel_trip``: the first two run together, as a zip
PARALLEL_STEPS = [
    {"step": "find the flights", "agent": "search", "parallel": True},
    {"step": "draft the itinerary", "agent": "write", "parallel": True},
    "[SEARCH] check the hotels",
]


def job_in(messages: Sequence[ChatMessage]) -> str:
    found = _JOB.search("\n".join(m.content for m in messages if m.role == "user"))
    assert found is not None, "no job in the request"
    return found.group(1)


@tool
async def work(key: str) -> str:
    """Do the work of a step.

    Args:
        key: the step's id
    """
    job = key.rsplit(":", 1)[0]
    n = _r.hincrby(f"{job}:tool-execs", key, 1)
    if n == 1 and _r.sismember(f"{job}:hold", key):
        _r.rpush(f"{job}:holding", key)
        await asyncio.sleep(HOLD_SECONDS)
    return f"result of {key.rsplit(':', 1)[1]}"


def executor_model(label: str) -> FunctionModel:
    def answer(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ChatResponse:
        job = job_in(messages)
        found = _STEP.search(next(m.content for m in messages if m.role == "user"))
        assert found is not None, "no step in the task"
        step = int(found.group(1))
        turn = sum(1 for m in messages if m.role == "assistant")
        _r.hincrby(f"{job}:model-calls", f"{label}-step{step}-turn{turn}", 1)
        results = [m.content for m in messages if m.role == "tool"]
        if not results:
            return ChatResponse(
                tool_calls=[ToolCall(id="", name="work", arguments={"key": f"{job}:step-{step}"})]
            )
        return ChatResponse(content=f"{label}: {results[-1]}")

    return FunctionModel(answer, name=f"{label}-model")


def planner_model(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ChatResponse:
    job = job_in(messages)
    if tools:  # the planner is offered the planning tool; the finalizer is not
        _r.hincrby(f"{job}:model-calls", "planner", 1)
        steps = PARALLEL_STEPS if "in parallel" in messages[-1].content else STEPS
        return ChatResponse(
            tool_calls=[
                ToolCall(
                    id="",
                    name="planning",
                    arguments={"command": "create", "title": f"Trip {job}", "steps": steps},
                )
            ]
        )
    _r.hincrby(f"{job}:model-calls", "finalizer", 1)
    results = messages[-1].content.split("The results of the steps:\n", 1)[1]
    return ChatResponse(content=f"Summary: {results}")


search = ToolCallAgent("it-plan-search", executor_model("search"), [work], limits=AgentLimits(max_steps=4))
write = ToolCallAgent("it-plan-write", executor_model("write"), [work], limits=AgentLimits(max_steps=4))
trip = PlanningFlow(
    "it-trip", {"search": search, "write": write}, FunctionModel(planner_model, name="planner")
)
parallel_trip = PlanningFlow(
    "it-trip-parallel", {"search": search, "write": write}, FunctionModel(planner_model, name="planner")
)

ANSWER = (
    "Summary: Step 0 (finished, by search): search: result of step-0\n"
    "Step 1 (finished, by write): write: result of step-1\n"
    "Step 2 (finished, by search): search: result of step-2"
)


def trip_request(job: str) -> str:
    return f"job {job}: plan my trip"


def parallel_request(job: str) -> str:
    return f"job {job}: plan my trip in parallel"
