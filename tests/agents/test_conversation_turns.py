"""A tool-calling agent reads each turn only what is new of its conversation, fits the window
from a running count and builds its request from data dumped once: what the model is sent,
and what the run records, are the same as when every turn reads and fits it all again (a
worker that did not run the turns before, the plain ``context_window``), in local mode."""

from __future__ import annotations

from typing import Any

import dflow
from dflow_agents import AgentLimits, ChatMessage, ModelCalls, ToolCallAgent, ToolSpec, tool
from dflow_agents._growing_window import GrowingWindow
from dflow_agents.exchanges import chat_request
from dflow_agents.testing import FunctionModel, call, reply

_names = iter(range(10**6))


@tool
def note(key: str) -> str:
    """A stored text."""
    return f"the note {key}: " + "z" * 300


def looping(turns: int) -> FunctionModel:
    """A model that calls ``note`` twice a turn for ``turns`` turns (the same call every third
    turn: the loop guard speaks), then answers."""

    def decide(messages: Any, tools: Any) -> Any:
        turn = sum(1 for m in messages if m.role == "assistant")
        if turn >= turns:
            return reply("done")
        key = "same" if turn % 3 == 0 else f"k{turn}"
        return reply(f"turn {turn}", calls=[call("note", key=key), call("note", key=f"{key}-2")])

    return FunctionModel(decide, name="looping")


def agent_of(model: FunctionModel, turns: int) -> ToolCallAgent:
    return ToolCallAgent(
        f"turns-{next(_names)}",
        model,
        [note],
        limits=AgentLimits(max_steps=turns + 5, context_tokens=900, max_observation_chars=200),
    )


def sent(model: FunctionModel) -> list[list[dict[str, Any]]]:
    return [[m.model_dump(mode="json") for m in r.messages] for r in model.requests]


def records(run: dflow.Run) -> dict[str, Any]:
    return {k: v for k, v in run.context().as_dict().items() if "/call/" in k}


def run_of(model: FunctionModel, turns: int) -> dflow.Run:
    run = agent_of(model, turns).run("take notes")
    assert run.result(30).steps >= turns - 4  # (or the loop guard stopped it)
    return run


def test_each_turn_sends_what_a_worker_reading_the_whole_conversation_again_sends(
    local: dflow.Runtime, monkeypatch: Any
) -> None:
    kept = looping(12)
    kept_run = run_of(kept, 12)
    assert any(m.name == "loop-guard" for r in kept.requests for m in r.messages), "the guard spoke"
    assert any("were left out" in m.content for r in kept.requests for m in r.messages), "the window cut"

    forgetful = looping(12)
    agent = agent_of(forgetful, 12)
    decide = forgetful.fn

    def forgetting(messages: Any, tools: Any) -> Any:
        agent._conversations._entries.clear()  # as if another worker ran every earlier turn
        return decide(messages, tools)

    monkeypatch.setattr(forgetful, "fn", forgetting)
    forgetful_run = agent.run("take notes")
    assert forgetful_run.result(30).steps >= 8
    assert sent(forgetful) == sent(kept)
    assert list(records(forgetful_run).values()) == list(records(kept_run).values())


def test_each_turn_sends_the_window_context_window_makes_of_the_whole_conversation(
    local: dflow.Runtime, monkeypatch: Any
) -> None:
    growing = looping(12)
    run_of(growing, 12)
    monkeypatch.setattr(GrowingWindow, "fit", lambda self, system, budget: None)  # context_window, whole
    whole = looping(12)
    run_of(whole, 12)
    assert sent(growing) == sent(whole)


def test_a_request_that_extends_an_earlier_one_is_dumped_as_each_of_its_messages() -> None:
    first = [ChatMessage.system("be brief"), ChatMessage.user("go"), ChatMessage.assistant("a")]
    specs = [ToolSpec(name="one"), ToolSpec(name="two", description="the second")]
    chat_request(first, specs, {})
    longer = [*first, ChatMessage.tool("r", tool_call_id="c1", name="one")]
    changed = [first[0], first[1], ChatMessage.assistant("b"), longer[3]]
    for messages in (longer, changed, first[:2]):
        request = chat_request(messages, specs, {})
        assert request["messages"] == [m.model_dump(mode="json", exclude_defaults=True) for m in messages]
        assert request["tools"] == [s.model_dump(mode="json", exclude_defaults=True) for s in specs]


def test_an_agent_keeping_no_records_makes_no_request_records(local: dflow.Runtime, monkeypatch: Any) -> None:
    made: list[int] = []
    monkeypatch.setattr("dflow_agents._ask.chat_request", lambda *a: made.append(1) or {})
    agent = ToolCallAgent(f"turns-{next(_names)}", looping(2), [note], model_calls=ModelCalls(recording=None))
    assert agent.run("take notes").result(30).ok
    assert made == []


def test_two_runs_of_one_namespace_keep_their_conversations_apart() -> None:
    """A rerun starts with the data, and so the namespace, of the run it reruns, then writes
    turns of its own under it: each run's conversation is its own."""
    from types import SimpleNamespace

    from dflow_agents._conversations import Conversations

    said = {
        ("a", "ns/head"): (ChatMessage.user("the task"),),
        ("a", "ns/think/0"): (ChatMessage.assistant("a's turn 0"),),
        ("a", "ns/observe/0"): (),
        ("b", "ns/head"): (ChatMessage.user("the task"),),
        ("b", "ns/think/0"): (ChatMessage.assistant("b's turn 0"),),
        ("b", "ns/observe/0"): (),
    }

    def read(ctx: Any, key: str) -> tuple[ChatMessage, ...]:
        return said[(ctx.trace_id, key)]

    conversations = Conversations()
    state = {"ns": "ns", "step": 1, "nudged": [], "query": "the task"}
    for trace in ("a", "b", "a", "b"):
        entry = conversations.take(SimpleNamespace(trace_id=trace), state, read)  # type: ignore[arg-type]
        assert [m.content for m in entry.messages] == ["the task", f"{trace}'s turn 0"]
        conversations.give(entry)
