"""Conversation memory: idempotent appends, isolated sessions, Redis persistence and TTL,
session-name checks, pickling refusal, and the context window on hand-made conversations."""

from __future__ import annotations

import asyncio
import copy
import os
import pathlib
import pickle
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import cloudpickle
import pytest

import dflow
from dflow import DFlow
from dflow_agents import (
    ChatMemory,
    ChatMessage,
    InMemoryChatMemory,
    RedisChatMemory,
    ToolCall,
    context_window,
    estimate_tokens,
)
from tests.integration import conftest as integration

# The Redis fixtures of the integration tests: a fresh key prefix per test, its keys deleted
# afterwards; a missing Redis skips the test locally and fails it when CI is set.
redis_url = integration.redis_url
prefix = integration.prefix

ROOT = pathlib.Path(__file__).resolve().parents[2]

Factory = Callable[[], Any]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.fixture(params=["in-memory", "redis"])
def make_memory(request: pytest.FixtureRequest) -> Iterator[Factory]:
    """A factory of memories of one kind: every call is a new instance on the same data."""
    if request.param == "in-memory":
        shared = InMemoryChatMemory()
        yield lambda: shared
        return
    url = request.getfixturevalue("redis_url")
    key_prefix = request.getfixturevalue("prefix")
    yield lambda: RedisChatMemory(url, prefix=key_prefix)


async def closed(memory: Any, work: Any) -> Any:
    try:
        return await work
    finally:
        if isinstance(memory, RedisChatMemory):
            await memory.aclose()


def exchange(n: int) -> list[ChatMessage]:
    return [ChatMessage.user(f"question {n}"), ChatMessage.assistant(f"answer {n}")]


# -- the memories --------------------------------------------------------------------------


def test_both_memories_follow_the_protocol() -> None:
    assert isinstance(InMemoryChatMemory(), ChatMemory)
    assert isinstance(RedisChatMemory("redis://127.0.0.1:6379/11"), ChatMemory)


def test_append_is_idempotent_per_key(make_memory: Factory) -> None:
    memory = make_memory()

    async def main() -> list[ChatMessage]:
        assert await memory.append("user-1", exchange(1), key="trace-a:3") is True
        assert await memory.append("user-1", exchange(1), key="trace-a:3") is False  # a re-executed step
        assert await memory.append("user-1", exchange(99), key="trace-a:3") is False  # the first batch wins
        assert await memory.append("user-1", exchange(2), key="trace-a:4") is True
        return await memory.load("user-1")

    assert run(closed(memory, main())) == exchange(1) + exchange(2)


def test_sessions_are_isolated_and_clear_forgets_one(make_memory: Factory) -> None:
    memory = make_memory()

    async def main() -> None:
        await memory.append("alice", exchange(1), key="k")
        await memory.append("bob", exchange(2), key="k")  # the same key in another session
        assert await memory.load("alice") == exchange(1)
        assert await memory.load("bob") == exchange(2)
        assert await memory.load("carol") == []
        await memory.clear("alice")
        assert await memory.load("alice") == []
        assert await memory.load("bob") == exchange(2)
        assert await memory.append("alice", exchange(3), key="k") is True  # its keys went too

    run(closed(memory, main()))


def test_messages_keep_tool_calls_and_dicts_are_accepted(make_memory: Factory) -> None:
    memory = make_memory()
    call = ToolCall(id="call_0_0", name="search", arguments={"q": "é", "n": [1, 2]})
    batch = [
        ChatMessage.assistant("", [call]),
        ChatMessage.tool("found", tool_call_id="call_0_0", name="search").model_dump(mode="json"),
    ]

    async def main() -> list[ChatMessage]:
        await memory.append("s", batch, key="k1")
        return await memory.load("s")

    assert run(closed(memory, main())) == [
        ChatMessage.assistant("", [call]),
        ChatMessage.tool("found", tool_call_id="call_0_0", name="search"),
    ]


@pytest.mark.parametrize(
    ("session", "why"),
    [
        ("", "is empty"),
        ("u" * 129, "129 characters long"),
        ("alice bob", "may only contain"),
        ("alice}:messages", "may only contain"),
        ("{bob}", "may only contain"),
        ("*", "may only contain"),
        ("../bob", "may only contain"),
        ("alice\nbob", "may only contain"),
    ],
)
def test_session_names_are_checked(session: str, why: str) -> None:
    for memory in (InMemoryChatMemory(), RedisChatMemory("redis://127.0.0.1:6379/11")):
        for work in (memory.load(session), memory.append(session, [], key="k"), memory.clear(session)):
            with pytest.raises(ValueError, match=why) as info:
                run(work)
            assert "hashlib.sha256" in str(info.value)


def test_session_names_that_are_accepted() -> None:
    memory = InMemoryChatMemory()
    for session in ("user-42", "a:b@c.d_e", "u" * 128, "0"):
        run(memory.append(session, exchange(1), key="k"))
        assert run(memory.load(session)) == exchange(1)
    with pytest.raises(TypeError, match="a session name is a str"):
        run(memory.load(42))  # type: ignore[arg-type]


def test_append_checks_its_key_and_messages() -> None:
    memory = InMemoryChatMemory()
    with pytest.raises(ValueError, match="key= as a non-empty str"):
        run(memory.append("s", exchange(1), key=""))
    with pytest.raises(TypeError, match="wrap a single message in a list"):
        run(memory.append("s", ChatMessage.user("hi"), key="k"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="message #1 is not a chat message"):
        run(memory.append("s", [ChatMessage.user("hi"), {"role": "robot"}], key="k"))
    assert run(memory.load("s")) == []


def test_in_memory_keys_are_bounded() -> None:
    memory = InMemoryChatMemory(max_keys=2)
    for key in ("k1", "k2", "k3"):
        run(memory.append("s", exchange(1), key=key))
    assert run(memory.append("s", exchange(1), key="k3")) is False
    assert run(memory.append("s", exchange(1), key="k1")) is True  # forgotten: only the last 2 are kept


@pytest.mark.parametrize(
    "memory", [InMemoryChatMemory(), RedisChatMemory("redis://:secret@127.0.0.1:6379/11")], ids=repr
)
def test_memories_refuse_pickling_and_name_dflow_shared(memory: Any) -> None:
    for dumps in (pickle.dumps, cloudpickle.dumps):
        with pytest.raises(TypeError, match=r'dflow\.shared\(\w+ChatMemory\(\.\.\.\), "memory"\)'):
            dumps(memory)
    with pytest.raises(TypeError, match="cannot be pickled"):
        cloudpickle.dumps(lambda: memory)  # a closure that captured it
    assert copy.deepcopy(memory) is memory and copy.copy(memory) is memory
    assert "secret" not in repr(memory)


def test_a_shared_memory_travels_by_name_and_a_retried_step_appends_once(local: dflow.Runtime) -> None:
    memory = dflow.shared(InMemoryChatMemory(), f"test-memory-{uuid.uuid4().hex}")

    async def remember(ctx: dflow.ContextStack, question: str) -> str:
        await memory.append("chat-1", [ChatMessage.user(question)], key=ctx.idempotency_key)
        if ctx.attempt == 0:
            raise RuntimeError("the worker crashed after the append")
        return question

    run_ = DFlow.direct_run(
        "hello", lambda q: DFlow.just(q).map(remember).id("remember").retry(3, backoff=0.01, jitter=False)
    )
    assert run_.result(timeout=10) == "hello"
    assert any(s.status == dflow.StepStatus.RETRYING for s in run_.context().steps)  # it ran twice
    assert run(memory.load("chat-1")) == [ChatMessage.user("hello")]


# -- Redis ---------------------------------------------------------------------------------


def test_redis_memory_survives_a_new_client_and_a_new_process(redis_url: str, prefix: str) -> None:
    script = textwrap.dedent(
        f"""
        import asyncio
        from dflow_agents import ChatMessage, RedisChatMemory

        async def main():
            memory = RedisChatMemory({redis_url!r}, prefix={prefix!r})
            await memory.append("chat", [ChatMessage.user("from another process")], key="p:1")
            await memory.aclose()

        asyncio.run(main())
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", script], check=True, cwd=ROOT, env=env, timeout=60)

    async def main() -> None:
        writer = RedisChatMemory(redis_url, prefix=prefix)
        await writer.append("chat", [ChatMessage.assistant("from this process")], key="p:2")
        await writer.aclose()
        reader = RedisChatMemory(redis_url, prefix=prefix)  # a fresh instance and connection
        assert await reader.load("chat") == [
            ChatMessage.user("from another process"),
            ChatMessage.assistant("from this process"),
        ]
        assert await reader.append("chat", [ChatMessage.user("again")], key="p:1") is False
        await reader.aclose()

    run(main())


def test_redis_keys_ttl_refresh_and_expiry(redis_url: str, prefix: str) -> None:
    import redis

    r = redis.Redis.from_url(redis_url)
    messages_key, keys_key = f"{prefix}:{{chat}}:messages", f"{prefix}:{{chat}}:keys"

    async def main() -> None:
        memory = RedisChatMemory(redis_url, prefix=prefix, ttl=100)
        await memory.append("chat", exchange(1), key="k1")
        assert r.type(messages_key) == b"list" and r.llen(messages_key) == 2
        assert r.type(keys_key) == b"zset" and r.zrange(keys_key, 0, -1) == [b"k1"]
        assert 99_000 < r.pttl(messages_key) <= 100_000 and 99_000 < r.pttl(keys_key) <= 100_000
        r.pexpire(messages_key, 5_000)
        r.pexpire(keys_key, 5_000)
        await memory.append("chat", exchange(1), key="k1")  # a duplicate refreshes the TTL too
        assert r.pttl(messages_key) > 99_000 and r.pttl(keys_key) > 99_000
        await memory.aclose()

        short = RedisChatMemory(redis_url, prefix=prefix, ttl=0.2)
        await short.append("gone", exchange(1), key="k1")
        assert await short.load("gone") == exchange(1)
        await asyncio.sleep(0.4)
        assert await short.load("gone") == []
        assert await short.append("gone", exchange(2), key="k1") is True  # its keys expired with it
        await short.aclose()

    try:
        run(main())
    finally:
        r.close()


def test_redis_keys_are_bounded_and_a_client_can_be_passed(redis_url: str, prefix: str) -> None:
    import redis
    import redis.asyncio as aioredis

    async def main() -> None:
        client = aioredis.Redis.from_url(redis_url)
        memory = RedisChatMemory(client, prefix=prefix, max_keys=3, ttl=None)
        for n in range(5):
            await memory.append("chat", exchange(n), key=f"k{n}")
        assert await memory.append("chat", exchange(4), key="k4") is False
        assert await memory.append("chat", exchange(0), key="k0") is True  # beyond the last 3 keys
        assert len(await memory.load("chat")) == 12
        await client.aclose()

    run(main())
    r = redis.Redis.from_url(redis_url)
    try:
        assert r.zrange(f"{prefix}:{{chat}}:keys", 0, -1) == [b"k3", b"k4", b"k0"]
        assert r.pttl(f"{prefix}:{{chat}}:messages") == -1  # ttl=None: no expiry
    finally:
        r.close()


def test_redis_memory_says_what_is_wrong(redis_url: str, prefix: str) -> None:
    import redis

    with pytest.raises(ValueError, match="not a Redis URL: 'http://x'"):
        RedisChatMemory("http://x")
    with pytest.raises(ValueError, match="prefix must be"):
        RedisChatMemory(redis_url, prefix="a{b}")
    with pytest.raises(ValueError, match="ttl is the seconds"):
        RedisChatMemory(redis_url, ttl=0)
    with pytest.raises(TypeError, match="a Redis URL or a redis.asyncio.Redis client"):
        RedisChatMemory(42)  # type: ignore[arg-type]

    r = redis.Redis.from_url(redis_url)
    r.rpush(f"{prefix}:{{chat}}:messages", b"not json")
    r.close()

    async def main() -> None:
        memory = RedisChatMemory(redis_url, prefix=prefix)
        with pytest.raises(ValueError, match=r"stored message #0 .* clear the session or use another prefix"):
            await memory.load("chat")
        await memory.aclose()

    run(main())


# -- the context window --------------------------------------------------------------------


def ten(message: ChatMessage) -> int:
    """Every message costs 10 tokens: budgets count messages."""
    return 10


SYSTEM = ChatMessage.system("You are a careful assistant.")
GOAL = ChatMessage.user("What is the weather in Paris and in Rome?")
A1 = ChatMessage.assistant(
    "", [ToolCall(id="c1", name="weather", arguments={"city": "Paris"}), ToolCall(id="c2", name="weather")]
)
T1 = ChatMessage.tool("Paris: 21 C", tool_call_id="c1", name="weather")
T2 = ChatMessage.tool("Error: city is required", tool_call_id="c2", name="weather")
A2 = ChatMessage.assistant("I forgot the city for the second call.")
A3 = ChatMessage.assistant("", [ToolCall(id="c3", name="weather", arguments={"city": "Rome"})])
T3 = ChatMessage.tool("Rome: 25 C", tool_call_id="c3", name="weather")
A4 = ChatMessage.assistant("Paris has 21 C, Rome 25 C.")
TASK = [SYSTEM, GOAL, A1, T1, T2, A2, A3, T3, A4]


def marker(turns: int, messages: int) -> ChatMessage:
    t, m = ("turn" if turns == 1 else "turns"), ("message" if messages == 1 else "messages")
    return ChatMessage.system(
        f"[{turns} earlier {t} ({messages} {m}) of this conversation were left out to fit the context window.]"
    )


def test_window_sends_everything_that_fits_unchanged() -> None:
    assert context_window(GOAL, TASK, 90, count_tokens=ten) == TASK
    assert context_window(None, TASK, 10_000) == TASK  # the goal defaults to the first user message


def test_window_keeps_the_newest_turns_and_marks_the_gap() -> None:
    # system + goal + marker = 30; then A4 (10) and A3+T3 (20) fit 60, A2 would not
    assert context_window(GOAL, TASK, 60, count_tokens=ten) == [SYSTEM, GOAL, marker(2, 4), A3, T3, A4]


def test_window_never_splits_a_call_from_its_results() -> None:
    # A3+T3 do not fit in the 10 tokens left after A4: both go, never A3 or T3 alone
    assert context_window(GOAL, TASK, 50, count_tokens=ten) == [SYSTEM, GOAL, marker(3, 6), A4]
    # A1 with its two results is one turn of 30
    assert context_window(GOAL, TASK, 70, count_tokens=ten) == [SYSTEM, GOAL, marker(1, 3), A2, A3, T3, A4]
    assert context_window(GOAL, TASK, 80, count_tokens=ten) == [SYSTEM, GOAL, marker(1, 3), A2, A3, T3, A4]


def test_window_always_keeps_system_and_goal_even_over_budget() -> None:
    assert context_window(GOAL, TASK, 5, count_tokens=ten) == [SYSTEM, GOAL, marker(4, 7)]
    assert context_window(GOAL, TASK[1:], 30, count_tokens=ten) == [GOAL, marker(3, 6), A4]


def test_window_with_a_goal_in_the_middle_of_a_session() -> None:
    earlier_q, earlier_a = ChatMessage.user("Hi, who are you?"), ChatMessage.assistant("An assistant.")
    session = [SYSTEM, earlier_q, earlier_a, GOAL, A2, A4]

    def tokens(m: ChatMessage) -> int:
        return 30 if m == earlier_q else 10

    # the gap is before the goal: the marker stands where the left-out turn was
    assert context_window(GOAL, session, 60, count_tokens=tokens) == [
        SYSTEM,
        marker(1, 1),
        earlier_a,
        GOAL,
        A2,
        A4,
    ]
    # the gap spans the goal: the goal is pinned, the marker follows it
    assert context_window(GOAL, session, 40, count_tokens=tokens) == [SYSTEM, GOAL, marker(3, 3), A4]
    # the goal is the last equal user message (a repeated question starts a new task)
    again = [SYSTEM, GOAL, A4, GOAL, A2]
    assert context_window(GOAL, again, 40, count_tokens=ten) == [SYSTEM, marker(2, 2), GOAL, A2]


def test_window_with_a_goal_given_as_text_outside_the_conversation() -> None:
    history = [SYSTEM, A2, A3, T3, A4]
    assert context_window(GOAL.content, history, 1000, count_tokens=ten) == [SYSTEM, GOAL, A2, A3, T3, A4]
    assert context_window(GOAL.content, history, 50, count_tokens=ten) == [SYSTEM, GOAL, marker(2, 3), A4]


def test_window_leaves_out_tool_messages_without_their_call() -> None:
    trimmed = [SYSTEM, T2, GOAL, A2, T1, A4]  # e.g. a memory trimmed by someone else
    assert context_window(GOAL, trimmed, 1000, count_tokens=ten) == [SYSTEM, GOAL, A2, A4]


def test_window_truncates_long_observations_with_a_note() -> None:
    long = ChatMessage.tool("A" * 5000 + "B" * 5000, tool_call_id="c3", name="weather")
    window = context_window(GOAL, [GOAL, A3, long, A4], 10_000, max_observation_chars=400)
    assert window[:2] == [GOAL, A3] and window[3] == A4
    cut = window[2]
    assert cut.content == "A" * 300 + "\n[… 9,600 characters cut]\n" + "B" * 100
    assert (cut.role, cut.tool_call_id, cut.name) == ("tool", "c3", "weather")
    assert context_window(GOAL, [GOAL, A3, long], 10_000, max_observation_chars=None)[2] == long
    assert context_window(GOAL, [GOAL, A3, T3], 10_000, max_observation_chars=5)[2].content == (
        "Rome\n[… 5 characters cut]\nC"
    )


def test_window_respects_the_budget_with_the_default_estimate() -> None:
    conversation = [SYSTEM, GOAL]
    for n in range(30):
        call = ToolCall(id=f"c{n}", name="search", arguments={"q": f"page {n}"})
        conversation += [
            ChatMessage.assistant(f"Step {n}: searching.", [call]),
            ChatMessage.tool(f"result {n} " * (40 + 37 * n % 300), tool_call_id=f"c{n}", name="search"),
        ]
    conversation.append(ChatMessage.assistant("Done."))
    fixed = estimate_tokens(SYSTEM) + estimate_tokens(GOAL)
    previous = 0
    for budget in range(fixed + 40, 12_000, 97):
        window = context_window(GOAL, conversation, budget, max_observation_chars=1000)
        assert sum(estimate_tokens(m) for m in window) <= budget
        assert window[:2] == [SYSTEM, GOAL] and window[-1].content == "Done."
        for i, m in enumerate(window):
            if m.role == "tool":  # right after its call, or after another result of that call
                j = i - 1
                while window[j].role == "tool":
                    j -= 1
                assert m.tool_call_id in {c.id for c in window[j].tool_calls}
        assert len(window) >= previous  # a larger budget never sends less
        previous = len(window)
    assert context_window(GOAL, conversation, 100_000, max_observation_chars=1000)[2:] != conversation[2:]
    assert (
        "characters cut]"
        in context_window(GOAL, conversation, 100_000, max_observation_chars=1000)[-2].content
    )


def test_window_leaves_its_input_alone_and_checks_its_arguments() -> None:
    conversation = list(TASK)
    context_window(GOAL, conversation, 30, count_tokens=ten, max_observation_chars=3)
    assert conversation == TASK
    with pytest.raises(ValueError, match="budget is a number of tokens"):
        context_window(GOAL, TASK, 0)
    with pytest.raises(ValueError, match="max_observation_chars is an int"):
        context_window(GOAL, TASK, 100, max_observation_chars=0)


def test_estimate_tokens_counts_characters_over_four_plus_framing() -> None:
    assert estimate_tokens(ChatMessage.user("")) == 4
    assert estimate_tokens(ChatMessage.user("abcd")) == 5
    assert estimate_tokens(ChatMessage.user("abcde")) == 6
    call = ToolCall(id="x", name="ab", arguments={})  # "ab" + "{}"
    assert estimate_tokens(ChatMessage.assistant("", [call])) == 5
