"""The context window kept up to date as a conversation grows is the one ``context_window``
makes of the whole conversation, turn after turn, for conversations of every shape: tool
calls and their results (answered, orphaned, long), system messages, copies of the goal."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dflow_agents import ChatMessage, ToolCall
from dflow_agents._growing_window import GrowingWindow
from dflow_agents.memory import context_window, estimate_tokens

GOAL = ChatMessage.user("the task")


def _message(kind: str, n: int) -> ChatMessage:
    if kind == "goal":
        return ChatMessage.user("the task")
    if kind == "call":
        return ChatMessage.assistant("", [ToolCall(id=f"c{n}", name="add", arguments={"a": n})])
    if kind == "tool":
        return ChatMessage.tool(f"result {n} " + "x" * (n % 7) * 30, tool_call_id=f"c{n}", name="add")
    if kind == "system":
        return ChatMessage.system(f"note {n}")
    if kind == "user":
        return ChatMessage.user(f"more {n}")
    return ChatMessage.assistant(f"thought {n} " * (n % 5))


KINDS = st.sampled_from(["goal", "call", "tool", "tool", "system", "user", "text"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batches=st.lists(st.lists(KINDS, max_size=6), min_size=1, max_size=12),
    budget=st.integers(1, 400),
    limit=st.sampled_from([None, 40, 100]),
    system=st.sampled_from([[], [ChatMessage.system("be brief")]]),
)
def test_the_growing_window_is_context_window_of_the_whole_conversation(
    batches: list[list[str]], budget: int, limit: int | None, system: list[ChatMessage]
) -> None:
    conversation: list[ChatMessage] = []
    window = GrowingWindow(conversation, GOAL, estimate_tokens, limit)
    n = 0
    for batch in batches:
        for kind in batch:
            conversation.append(_message(kind, n))
            n += 1
        expected = context_window(GOAL, system + conversation, budget, max_observation_chars=limit)
        assert window.fit(system, budget) == expected


def test_a_window_of_a_long_conversation_keeps_the_newest_turns_that_fit() -> None:
    conversation = [ChatMessage.user("the task")]
    for n in range(40):
        conversation += [_message("call", n), _message("tool", n)]
    window = GrowingWindow(conversation, GOAL, estimate_tokens, 4000)
    got = window.fit([ChatMessage.system("be brief")], 100)
    assert got == context_window(GOAL, [ChatMessage.system("be brief"), *conversation], 100)
    assert got is not None and "were left out" in got[2].content and got[-1] == conversation[-1]


def test_a_system_message_after_the_start_or_a_counter_below_zero_leaves_it_to_context_window() -> None:
    conversation = [ChatMessage.user("the task")]
    assert GrowingWindow(conversation, GOAL, estimate_tokens, None).fit([ChatMessage.user("x")], 50) is None
    conversation.append(ChatMessage.user("more"))
    assert GrowingWindow(conversation, GOAL, lambda m: -1, None).fit([], 50) is None
