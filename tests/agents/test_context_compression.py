"""Context compression: past the window, the oldest turns are summarised by an AI function into
one message kept in the run; the task and the newest tool results are sent word for word, every
request fits the window (measured in tokens), and the facts of the summarised turns still reach
the model. Scripted models, local mode."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import pytest

import dflow
from dflow_agents import (
    SUMMARY_PROMPT,
    AgentLimits,
    AgentStatus,
    AIFunction,
    ChatMessage,
    ChatResponse,
    ContextCompression,
    ToolCall,
    ToolCallAgent,
    ToolSpec,
    Usage,
    estimate_tokens,
    tool,
)
from dflow_agents.compression import split_at
from dflow_agents.testing import FunctionModel

_names = iter(range(10**6))
PAGES = 6
WINDOW = 700
TASK = "Read pages 0 to 5 and tell me every page's code."
_CODE = re.compile(r"CODE-(\d+)")


def unique(stem: str) -> str:
    return f"compress-{stem}-{next(_names)}"


def page(n: int) -> str:
    return f"Page {n}. The code of page {n} is CODE-{n}. " + "Filler text of the manual. " * 20


@tool
def read_page(n: int) -> str:
    """Read a page of the manual."""
    return page(n)


def seen(messages: Sequence[ChatMessage]) -> set[int]:
    return {int(n) for m in messages for n in _CODE.findall(m.content)}


def summary_of(transcript: str) -> ChatResponse:
    """What a summariser writes: every code it read, and nothing else."""
    codes = sorted({int(n) for n in _CODE.findall(transcript)})
    text = "Codes found so far: " + ", ".join(f"page {n}: CODE-{n}" for n in codes)
    return ChatResponse(content=text, usage=Usage(prompt_tokens=100, completion_tokens=10, total_tokens=110))


def reader(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ChatResponse:
    """Reads the first page whose code it cannot see, or answers with every code; decided from
    what it is sent alone. Asked to summarise (the default summariser), it summarises."""
    if messages and messages[0].content == SUMMARY_PROMPT:
        return summary_of(messages[-1].content)
    known = seen(messages)
    missing = [n for n in range(PAGES) if n not in known]
    if missing:
        return ChatResponse(tool_calls=[ToolCall(id="", name="read_page", arguments={"n": missing[0]})])
    return ChatResponse(content=" ".join(f"CODE-{n}" for n in range(PAGES)))


def summariser() -> tuple[AIFunction[Any], FunctionModel]:
    model = FunctionModel(lambda m, t: summary_of(m[-1].content), name="summariser")
    return AIFunction.chat(model), model


def limits(compression: ContextCompression | None, max_steps: int = 12) -> AgentLimits:
    return AgentLimits(context_tokens=WINDOW, compression=compression, loop_guard=None, max_steps=max_steps)


def agent_requests(model: FunctionModel) -> list[list[ChatMessage]]:
    return [list(r.messages) for r in model.requests if r.messages[0].content != SUMMARY_PROMPT]


def test_the_oldest_turns_are_summarised_and_their_facts_still_reach_the_model(local: dflow.Runtime) -> None:
    fn, writer = summariser()
    model = FunctionModel(reader, name="reader")
    run = ToolCallAgent(unique("facts"), model, [read_page], limits=limits(ContextCompression(fn))).run(TASK)
    result = run.result(10)
    assert result.status is AgentStatus.FINISHED and result.answer == " ".join(
        f"CODE-{n}" for n in range(PAGES)
    )
    assert result.steps == PAGES + 1, "each page read once: none was forgotten"
    requests = agent_requests(model)
    tokens = [sum(estimate_tokens(m) for m in r) for r in requests]
    assert max(tokens) <= WINDOW, tokens  # measured: every request fits the window
    assert all(r[1].role == "user" and r[1].content == TASK for r in requests), "the goal, word for word"
    for n, request in enumerate(requests[1:]):  # the result the model has not read yet: as it came
        assert request[-1].role == "tool" and request[-1].content == page(n)
    summarised = [r for r in requests if any(m.name == "summary" for m in r)]
    assert summarised and all(r[2].name == "summary" for r in summarised), "the summary follows the task"
    assert len(writer.requests) >= 1 and result.usage.total_tokens >= 110 * len(writer.requests)
    data = run.context().as_dict()
    kept = {k: v for k, v in data.items() if "/summary/" in k}
    assert kept and all(v[0]["name"] == "summary" and "CODE-0" in v[0]["content"] for v in kept.values())
    assert "  user (summary): [Summary of the earlier turns" in run.tree()


def test_without_compression_the_left_out_turns_are_forgotten(local: dflow.Runtime) -> None:
    model = FunctionModel(reader, name="reader")
    result = ToolCallAgent(unique("dropped"), model, [read_page], limits=limits(None)).run(TASK).result(10)
    assert result.status is AgentStatus.ERROR and "max_steps (12)" in result.reason  # it re-read pages
    tokens = [sum(estimate_tokens(m) for m in r) for r in agent_requests(model)]
    assert max(tokens) <= WINDOW


def test_the_agents_own_model_summarises_by_default(local: dflow.Runtime) -> None:
    model = FunctionModel(reader, name="reader")
    run = ToolCallAgent(unique("own"), model, [read_page], limits=limits(ContextCompression())).run(TASK)
    assert run.result(10).steps == PAGES + 1
    asked = [r for r in model.requests if r.messages[0].content == SUMMARY_PROMPT]
    assert asked and "The task: " + TASK in asked[0].messages[1].content
    assert not asked[0].tools, "the summariser is offered no tools"


def test_a_conversation_within_the_window_is_not_summarised(local: dflow.Runtime) -> None:
    fn, writer = summariser()
    lim = AgentLimits(compression=ContextCompression(fn))  # 32,000 tokens: plenty
    result = (
        ToolCallAgent(unique("small"), FunctionModel(reader), [read_page], limits=lim).run(TASK).result(10)
    )
    assert result.ok and writer.requests == []


def test_a_call_is_never_split_from_its_results_and_the_last_turn_is_kept() -> None:
    call = ChatMessage.assistant("", [ToolCall(id="c1", name="x"), ToolCall(id="c2", name="x")])
    results = [ChatMessage.tool("r" * 400, tool_call_id=i, name="x") for i in ("c1", "c2")]
    messages = [ChatMessage.assistant("a" * 400), call, *results, ChatMessage.assistant("b" * 40)]
    assert split_at(messages, 20, estimate_tokens) == 4  # the call and its results go together
    assert split_at(messages, 10_000, estimate_tokens) == 0  # all fit: nothing to summarise
    assert split_at(messages[-1:], 1, estimate_tokens) == 0  # the last turn alone is always kept


def test_compression_settings_are_checked_where_they_are_written() -> None:
    with pytest.raises(TypeError, match="summarizer is an AIFunction"):
        ContextCompression(summarizer="summarise")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="keep_tokens must be an int >= 1"):
        ContextCompression(keep_tokens=0)
    with pytest.raises(TypeError, match="AgentLimits.compression is a ContextCompression"):
        AgentLimits(compression={"keep_tokens": 10})  # type: ignore[arg-type]
