"""Long-term memory per user: de-duplication on write (default and pluggable similarity),
idempotent keys, eviction, ranking, the prompt's token budget, snapshots at declared
events, an agent that sees its user's facts, hostile input; and on Redis (db 12): facts
written by agents on real worker processes, read by a new process, and writers in several
processes at once that neither lose nor duplicate a fact."""

from __future__ import annotations

import asyncio
import difflib
import json
import os
import pathlib
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

import dflow
from dflow import DFlow
from dflow.wire.values import encode
from dflow_agents import (
    ChatMessage,
    Fact,
    LongTermMemory,
    LongTermRecall,
    StateLongTermMemory,
    ToolCallAgent,
    ToolSpec,
    estimate_tokens,
    facts_prompt,
    same_text,
    tool,
    user_statements,
)
from dflow_agents.agent import SESSION_KEY, AgentStatus
from dflow_agents.longterm import HEADER
from dflow_agents.testing import FunctionModel, ScriptedModel, call, reply
from tests.integration.conftest import SECRET, fresh_prefix, require
from tests.support.workers import Cluster, streams_transport

ROOT = pathlib.Path(__file__).resolve().parents[2]
REDIS_URL = os.environ.get("DFLOW_TEST_REDIS_LONGTERM", "redis://127.0.0.1:6379/12")

PREFERENCE = "I prefer window seats."
VARIANTS = [
    PREFERENCE,
    "  i PREFER window   seats",
    "I prefer window-seats!",
    "I Prefer Window Seats ...",
    "i prefer\twindow seats?",
]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


_names = iter(range(10**6))


def unique(stem: str) -> str:
    return f"{stem}-{next(_names)}-{uuid.uuid4().hex[:6]}"


# -- de-duplication and keys (local mode) ----------------------------------------------------


def test_the_same_preference_stated_five_times_is_stored_once(local: dflow.Runtime) -> None:
    memory = StateLongTermMemory(prefix=unique("lt"))
    assert isinstance(memory, LongTermMemory)
    stored = [
        run(memory.remember("ann", text, kind="preference", tags=[f"t{i}"]))
        for i, text in enumerate(VARIANTS)
    ]
    assert stored == [1, 0, 0, 0, 0]
    run(memory.remember("ann", "My dog is called Rex."))
    facts = run(memory.facts("ann"))
    assert [f.text for f in facts] == ["My dog is called Rex.", PREFERENCE]  # most recently stated first
    window = facts[1]
    assert (window.count, window.kind, window.tags) == (5, "preference", ("t0", "t1", "t2", "t3", "t4"))
    assert window.first < window.last
    assert run(memory.facts("bob")) == [], "users never see each other's facts"
    # one write of several facts, which restate each other and known ones
    assert run(memory.remember("ann", ["I am vegetarian", "i am VEGETARIAN.", "I prefer window seats"])) == 1
    counts = {f.text: f.count for f in run(memory.facts("ann"))}
    assert counts == {PREFERENCE: 6, "My dog is called Rex.": 1, "I am vegetarian": 2}


def test_a_key_used_before_changes_nothing(local: dflow.Runtime) -> None:
    memory = StateLongTermMemory(prefix=unique("lt"))
    assert run(memory.remember("ann", PREFERENCE, key="run-1:4")) == 1
    assert run(memory.remember("ann", VARIANTS[1], key="run-1:4")) == 0
    assert run(memory.remember("ann", "something new", key="run-1:4")) == 0, (
        "the first write under a key wins"
    )
    assert [(f.text, f.count) for f in run(memory.facts("ann"))] == [(PREFERENCE, 1)]
    assert run(memory.remember("ann", VARIANTS[1], key="run-2:4")) == 0
    assert [(f.text, f.count) for f in run(memory.facts("ann"))] == [(PREFERENCE, 2)]
    # only the last max_keys keys are remembered
    small = StateLongTermMemory(prefix=unique("lt"), max_keys=2)
    for k in ("a", "b", "c"):
        run(small.remember("ann", PREFERENCE, key=k))
    assert run(small.remember("ann", PREFERENCE, key="a")) == 0
    assert run(small.facts("ann"))[0].count == 4, "key 'a' was forgotten, so it counted again"


def test_a_pluggable_similarity_decides_what_is_the_same_fact(local: dflow.Runtime) -> None:
    def close(new: str, existing: str) -> bool:  # a score with a threshold
        return difflib.SequenceMatcher(None, new.lower(), existing.lower()).ratio() >= 0.85

    memory = StateLongTermMemory(prefix=unique("lt"), similar=close)
    assert run(memory.remember("ann", "I prefer a window seat")) == 1
    assert run(memory.remember("ann", "I prefer window seats")) == 0
    assert run(memory.remember("ann", "I prefer the aisle")) == 1
    assert {f.text: f.count for f in run(memory.facts("ann"))} == {
        "I prefer a window seat": 2,
        "I prefer the aisle": 1,
    }
    assert same_text(" I PREFER window-seats!!", "i prefer window seats") is True
    assert same_text("I prefer window seats", "I prefer aisle seats") is False

    def broken(new: str, existing: str) -> bool:
        raise RuntimeError("the similarity failed")

    failing = StateLongTermMemory(prefix=memory.prefix, similar=broken)
    with pytest.raises(RuntimeError, match="the similarity failed"):
        run(failing.remember("ann", "anything"))
    assert len(run(memory.facts("ann"))) == 2, "a failing similarity writes nothing"


def test_past_max_facts_the_least_recently_stated_fact_is_evicted(local: dflow.Runtime) -> None:
    memory = StateLongTermMemory(prefix=unique("lt"), max_facts=3)
    for text in ("fact a", "fact b", "fact c"):
        run(memory.remember("ann", text))
    run(memory.remember("ann", "FACT A"))  # stated again: now the most recent
    run(memory.remember("ann", "fact d"))
    assert [f.text for f in run(memory.facts("ann"))] == ["fact d", "fact a", "fact c"]
    with pytest.raises(ValueError, match="4 facts in one write, over max_facts=3"):
        run(memory.remember("ann", ["w", "x", "y", "z"]))


def test_versions_are_kept_for_audit_and_rollback(local: dflow.Runtime) -> None:
    memory = StateLongTermMemory(prefix=unique("lt"), history=3)
    run(memory.remember("ann", PREFERENCE))
    run(memory.remember("ann", "a wrong fact"))
    state = memory.state("ann")
    assert [v.version for v in state.history()] == [2, 1]
    state.rollback(1)
    assert [f.text for f in run(memory.facts("ann"))] == [PREFERENCE]
    assert run(memory.forget("ann", "I PREFER WINDOW SEATS")) == 1
    assert run(memory.forget("ann", "not there")) == 0
    run(memory.remember("ann", ["x", "y"], key="k"))
    assert run(memory.forget("ann")) == 2 and run(memory.facts("ann")) == []
    assert run(memory.remember("ann", "x", key="k")) == 0, (
        "forgetting keeps the keys: a step run again adds nothing"
    )


# -- recall and the prompt's budget ----------------------------------------------------------


def test_recall_puts_the_most_relevant_first_then_the_most_recent(local: dflow.Runtime) -> None:
    memory = StateLongTermMemory(prefix=unique("lt"))
    for text in ("I prefer window seats", "My dog is called Rex", "I am vegetarian", "I live in Oslo"):
        run(memory.remember("ann", text))
    assert [f.text for f in run(memory.recall("ann"))] == [
        "I live in Oslo",
        "I am vegetarian",
        "My dog is called Rex",
        "I prefer window seats",
    ]
    found = run(memory.recall("ann", "Book a WINDOW seat, I prefer those, and a vegetarian meal"))
    assert [f.text for f in found][:2] == ["I prefer window seats", "I am vegetarian"]
    assert [f.text for f in found][2:] == ["I live in Oslo", "My dog is called Rex"]
    assert len(run(memory.recall("ann", "dog", limit=1))) == 1
    assert run(memory.recall("ann", "dog", limit=1))[0].text == "My dog is called Rex"

    by_length = StateLongTermMemory(prefix=memory.prefix, score=lambda query, fact: -len(fact.text))
    assert run(by_length.recall("ann", "anything"))[0].text == "I live in Oslo"


def test_the_facts_message_stays_within_its_token_budget() -> None:
    facts = [Fact(text=f"fact number {i} " + "x" * (i * 7 % 90 + 1)) for i in range(60)]
    seen_sizes = set()
    for budget in range(1, 800, 3):
        message = facts_prompt(facts, budget)
        if message is None:
            assert budget < estimate_tokens(ChatMessage.system(f"{HEADER}\n- {facts[0].text}"))
            continue
        assert message.role == "system"
        assert estimate_tokens(message) <= budget
        lines = message.content.splitlines()[1:]
        texts = [line[2:] for line in lines]
        indexes = [next(i for i, f in enumerate(facts) if f.text == t) for t in texts]
        assert indexes == sorted(indexes), "the facts keep their order (most relevant first)"
        seen_sizes.add(len(lines))
    assert max(seen_sizes) > 10 and len(seen_sizes) > 10
    everything = facts_prompt(facts, 100_000)
    assert everything is not None and len(everything.content.splitlines()) == 61
    # a fact too long for what is left is left out; shorter ones after it still go in
    mixed = [Fact(text="short one"), Fact(text="y" * 400), Fact(text="short two", kind="preference")]
    shown = facts_prompt(mixed, len(HEADER) // 4 + 20)
    assert shown is not None and shown.content.splitlines()[1:] == ["- short one", "- [preference] short two"]
    assert facts_prompt([Fact(text="two\nlines,\t tabbed")], 100).content.splitlines()[1:] == [  # type: ignore[union-attr]
        "- two lines, tabbed"
    ]
    with pytest.raises(ValueError, match="budget is a number of tokens"):
        facts_prompt(facts, 0)


# -- agents ------------------------------------------------------------------------------------


def recalled(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
    """A model that answers with the recalled facts it was sent (after the system prompt)."""
    given = [m.content for m in messages if m.role == "system" and "earlier conversations" in m.content]
    return given[0] if given else "nothing"


def test_an_agent_run_for_a_user_sees_the_users_facts_in_its_prompt(local: dflow.Runtime) -> None:
    memory = StateLongTermMemory(prefix=unique("lt"))
    for text in (
        "I prefer window seats",
        "My dog is called Rex",
        "I am vegetarian",
    ):  # the first is the oldest
        run(memory.remember("ann", text))
    run(memory.remember("bob", "I prefer the aisle"))
    model = ScriptedModel([reply("Booked 12A.")])
    agent = ToolCallAgent(unique("lt-agent"), model, longterm=memory)
    result = agent.run("Book me a window seat", user="ann").result(10)
    assert result.status is AgentStatus.FINISHED
    sent = model.requests[0].messages
    assert [m.role for m in sent] == ["system", "system", "user"]
    assert sent[0].content.startswith("You are an agent")
    lines = sent[1].content.splitlines()
    assert "earlier conversations" in lines[0]
    assert lines[1:] == ["- I prefer window seats", "- I am vegetarian", "- My dog is called Rex"]
    assert "aisle" not in sent[1].content

    plain = ScriptedModel([reply("Hello.")])
    ToolCallAgent(unique("lt-agent"), plain, longterm=memory).run("Hi").result(10)
    assert [m.role for m in plain.requests[0].messages] == ["system", "user"], "no user: no facts"

    # the facts are cut to LongTermRecall.tokens: the most relevant ones that fit
    echo = FunctionModel(recalled)
    budget = estimate_tokens(ChatMessage.system(f"{HEADER}\n- I prefer window seats"))  # room for one fact
    small = ToolCallAgent(
        unique("lt-agent"), echo, longterm=LongTermRecall(memory, tokens=budget), system_prompt=None
    )
    answer = small.run("a window seat please", user="ann").result(10).answer
    assert answer.splitlines()[1:] == ["- I prefer window seats"]
    assert estimate_tokens(echo.requests[0].messages[0]) <= budget


@tool
def note(preference: str) -> str:
    """Note one of the user's preferences."""
    return f"noted: {preference}"


def test_snapshots_are_written_at_the_declared_events_only(local: dflow.Runtime) -> None:
    memory = StateLongTermMemory(prefix=unique("lt"))
    agent = ToolCallAgent(
        unique("lt-agent"),
        FunctionModel(recalled),
        longterm=LongTermRecall(memory, snapshot_on={"finished"}),
        system_prompt=None,
    )
    answers = [agent.run(text, user="ann").result(10).answer for text in VARIANTS]
    assert answers[0] == "nothing"
    assert answers[-1].splitlines()[1:] == ["- [snapshot] I prefer window seats."]
    facts = run(memory.facts("ann"))
    assert [(f.text, f.count, f.kind) for f in facts] == [(PREFERENCE, 5, "snapshot")]

    # a run that does not reach a declared event writes nothing
    on_failure = ToolCallAgent(
        unique("lt-agent"),
        ScriptedModel([reply("ok")]),
        longterm=LongTermRecall(memory, snapshot_on={"terminated", "error"}),
    )
    assert on_failure.run("I live in Oslo", user="ann").result(10).ok
    assert len(run(memory.facts("ann"))) == 1

    # a tool event, with facts picked by the agent's own function: the tool's notes
    def notes(messages: Sequence[ChatMessage]) -> list[str]:
        return [m.content.removeprefix("noted: ") for m in messages if m.role == "tool" and m.name == "note"]

    model = ScriptedModel([reply(calls=[call("note", preference="I am vegetarian")]), reply("Noted.")])
    noting = ToolCallAgent(
        unique("lt-agent"),
        model,
        [note],
        longterm=LongTermRecall(memory, snapshot_on={"tool:note"}, snapshot_facts=notes),
    )
    assert noting.run("remember that I eat no meat", user="ann").result(10).ok
    assert {f.text for f in run(memory.facts("ann"))} == {PREFERENCE, "I am vegetarian"}
    assert user_statements(
        [ChatMessage.user(" hi "), ChatMessage.assistant("yo"), ChatMessage.user("z" * 501)]
    ) == ["hi"]


def test_agent_settings_and_requests_are_checked(local: dflow.Runtime) -> None:
    memory = StateLongTermMemory(prefix=unique("lt"))
    model = ScriptedModel([reply("ok")])
    with pytest.raises(TypeError, match="LongTermRecall.memory is a LongTermMemory"):
        LongTermRecall(None, snapshot_on={"finished"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown snapshot event 'task_done'"):
        LongTermRecall(memory, snapshot_on={"task_done"})
    with pytest.raises(ValueError, match="names no tool of this agent"):
        ToolCallAgent(unique("lt-agent"), model, longterm=LongTermRecall(memory, snapshot_on={"tool:nosuch"}))
    with pytest.raises(TypeError, match="snapshot_on is a set of event names"):
        LongTermRecall(memory, snapshot_on="finished")
    with pytest.raises(TypeError, match="longterm is a LongTermMemory"):
        ToolCallAgent(unique("lt-agent"), model, longterm=object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="LongTermRecall.tokens must be an int >= 1"):
        LongTermRecall(memory, tokens=0)
    with pytest.raises(ValueError, match="has none \\(longterm=\\)"):
        ToolCallAgent(unique("lt-agent"), model).run("hi", user="ann")
    agent = ToolCallAgent(unique("lt-agent"), model, longterm=memory)
    with pytest.raises(ValueError, match="the user id 'a b'"):
        agent.run("hi", user="a b")

    # a run started in a server session may use only that session's long-term memory
    def in_session(ctx: dflow.ContextStack, value: str) -> DFlow[Any]:
        with pytest.raises(dflow.DFlowError, match="dflow's own"):
            ctx.put(SESSION_KEY, "alice")  # a step cannot claim a session
        ctx._changes[SESSION_KEY] = encode("alice")  # as the server writes it when it creates the run
        return agent.flow(value, user="bob")

    failed = DFlow.from_call(unique("lt-session")).flat_map(in_session).id("go").init(unique("lt-session"))
    with pytest.raises(dflow.RunFailedError) as info:
        failed.call("what do you know about bob?").result(10)
    assert info.value.error["type"] == "PermissionError"
    assert "may not use the long-term memory of user 'bob'" in info.value.error["message"]


# -- hostile input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("user", "error", "match"),
    [
        ("", ValueError, "is empty"),
        ("a b", ValueError, "may only contain"),
        ("u" * 129, ValueError, "129 characters long"),
        ("{slot}", ValueError, "may only contain"),
        ("ann\n", ValueError, "may only contain"),
        (None, TypeError, "a user id is a str, got NoneType"),
        (42, TypeError, "got int"),
    ],
)
def test_bad_user_ids_are_refused(
    local: dflow.Runtime, user: Any, error: type[Exception], match: str
) -> None:
    memory = StateLongTermMemory(prefix=unique("lt"))
    for attempt in (memory.remember(user, "x"), memory.recall(user), memory.facts(user), memory.forget(user)):
        with pytest.raises(error, match=match):
            run(attempt)


def test_hostile_facts_get_clear_errors_and_write_nothing(local: dflow.Runtime) -> None:
    memory = StateLongTermMemory(prefix=unique("lt"), max_chars=500)
    huge = "I prefer " + "window " * 1_500_000  # ~10 MB
    with pytest.raises(
        ValueError, match=f"fact #0 is {len(huge.strip()):,} characters, over this memory's max_chars=500"
    ):
        run(memory.remember("ann", huge))
    cases: list[tuple[Any, dict[str, Any], type[Exception], str]] = [
        (42, {}, TypeError, "remember takes a fact \\(a str\\) or a list of them, got int"),
        (b"bytes", {}, TypeError, "got bytes"),
        (["ok", None], {}, TypeError, "fact #1 is a NoneType"),
        (["ok", "   "], {}, ValueError, "fact #1 is empty"),
        ("ok", {"key": ""}, ValueError, "key is None or a non-empty str"),
        ("ok", {"key": 7}, ValueError, "key is None or a non-empty str"),
        ("ok", {"kind": "k" * 65}, ValueError, "kind is a non-empty str of at most 64"),
        ("ok", {"tags": "preference"}, TypeError, "tags is a list of at most 16 str"),
        ("ok", {"tags": [1]}, ValueError, "a tag is a non-empty str"),
    ]
    for facts, options, error, match in cases:
        with pytest.raises(error, match=match):
            run(memory.remember("ann", facts, **options))
    with pytest.raises(TypeError, match="a query is a str"):
        run(memory.recall("ann", 3))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="limit must be an int from 1"):
        run(memory.recall("ann", limit=0))
    assert run(memory.facts("ann")) == [] and memory.state("ann").history() == [], "nothing was written"

    # a State of that name written by something else is not read as facts
    dflow.State(f"{memory.prefix}:carol").set([1, 2, 3])
    with pytest.raises(ValueError, match="does not hold long-term memory .*use another prefix"):
        run(memory.facts("carol"))


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="prefix is 1 to 64 characters"):
        StateLongTermMemory(prefix="a b")
    with pytest.raises(TypeError, match="similar= takes a function"):
        StateLongTermMemory(similar="same")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_facts must be an int from 1"):
        StateLongTermMemory(max_facts=0)
    with pytest.raises(ValueError, match="history must be an int from 1 to 20"):
        StateLongTermMemory(history=50)
    with pytest.raises(ValueError, match="over the 8,388,608 a dflow.State holds"):
        StateLongTermMemory(max_facts=10_000, max_chars=1000)


# -- on Redis ----------------------------------------------------------------------------------


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    """A fresh key prefix on Redis db 12, its keys deleted after the test."""
    import redis

    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except Exception as exc:
        require(f"Redis at {REDIS_URL}", False, str(exc))
    with fresh_prefix(REDIS_URL) as p:
        yield p


def store_url(prefix: str) -> str:
    return f"{REDIS_URL}?prefix={prefix}&redispatch_after=2"


def python(script: str, *args: str) -> subprocess.Popen[str]:
    """A new Python process running ``script`` (its output piped)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finished(proc: subprocess.Popen[str]) -> str:
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-3000:]
    return out


RECALL = """
    import asyncio, json, sys
    import dflow
    from dflow_agents import StateLongTermMemory
    from tests.integration.apps.longterm_app import PREFIX

    dflow.configure(sys.argv[1], sys.argv[2], secret=sys.argv[3], consume=False)
    facts = asyncio.run(StateLongTermMemory(prefix=PREFIX).recall("ann", "which seats do I prefer?"))
    print(json.dumps([[f.text, f.count, f.kind] for f in facts]))
    dflow.shutdown()
"""


@pytest.mark.integration  # worker processes
def test_agents_on_workers_store_a_preference_once_and_a_new_process_recalls_it(redis_prefix: str) -> None:
    from tests.integration.apps import longterm_app as app

    cluster = Cluster("tests.integration.apps.longterm_app", REDIS_URL, redis_prefix)
    try:
        cluster.workers.start(2)
        cluster.connect()
        others = [f"My locker number is {i}" for i in range(1, 6)]
        runs = [app.agent.run(text, user="ann") for text in [*VARIANTS, *others]]
        results = dflow.gather(runs, timeout=60)
        assert all(r.ok for r in results), results
        workers = {rec.worker.rsplit(":", 1)[0] for r in runs for rec in r.context().steps if rec.worker}
        assert len(workers) == 2, f"the runs' steps ran on both worker processes: {workers}"
        facts = run(app.memory.facts("ann"))
        assert len(facts) == 6, [f.text for f in facts]
        window = [f for f in facts if same_text(f.text, PREFERENCE)]
        assert len(window) == 1 and window[0].count == 5, (
            "stated five times (in concurrent runs), stored once"
        )
        assert {f.text for f in facts} - {window[0].text} == set(others), "no other fact lost or doubled"

        out = finished(python(RECALL, cluster.transport_url, cluster.store_url, SECRET))
        recalled_there = json.loads(out)
        assert recalled_there[0][:2] == [window[0].text, 5], "a new process recalls it, most relevant first"
        assert len(recalled_there) == 6

        answer = app.agent.run("Which seats do I prefer?", user="ann").result(30).answer
        shown = " ".join(window[0].text.split())  # as the prompt shows it: whitespace folded
        assert answer.splitlines()[1] == f"- [snapshot] {shown}", (
            f"the next run's model sees it first: {answer}"
        )
    finally:
        cluster.close()


WRITER = """
    import asyncio, sys, time
    import redis
    import dflow
    from dflow_agents import StateLongTermMemory

    transport, store, secret, prefix, barrier, me = sys.argv[1:7]
    dflow.configure(transport, store, secret=secret, consume=False)
    memory = StateLongTermMemory(prefix=prefix)
    variants = ["I prefer window seats.", "i PREFER window seats", "I prefer window-seats!"]

    async def main():
        writes = [memory.remember("ann", variants[i % 3], key=f"{me}:{i}") for i in range(15)]
        writes += [memory.remember("ann", f"fact {i} of writer {me}") for i in range(10)]
        writes += [memory.remember("ann", "said once, under one key", key="the-same-key")]
        return await asyncio.gather(*writes)

    r = redis.Redis.from_url(store.split("?")[0])
    r.incr(barrier)
    deadline = time.monotonic() + 30
    while int(r.get(barrier)) < 3 and time.monotonic() < deadline:
        time.sleep(0.005)
    print(sum(asyncio.run(main())))
    dflow.shutdown()
"""


@pytest.mark.integration  # worker processes
def test_writers_in_three_processes_at_once_lose_and_duplicate_nothing(redis_prefix: str) -> None:
    transport, store = streams_transport(REDIS_URL, redis_prefix), store_url(redis_prefix)
    barrier = f"{redis_prefix}:barrier"
    procs = [python(WRITER, transport, store, SECRET, "lt", barrier, f"w{n}") for n in range(3)]
    added = sum(int(finished(p)) for p in procs)
    dflow.configure(transport, store, secret=SECRET, consume=False)
    try:
        facts = run(StateLongTermMemory(prefix="lt").facts("ann"))
        history = StateLongTermMemory(prefix="lt").state("ann").history()
    finally:
        dflow.shutdown()
    by_text = {f.text: f.count for f in facts}
    window = [t for t in by_text if same_text(t, PREFERENCE)]
    assert len(window) == 1 and by_text[window[0]] == 45, "45 statements, each under its own key: one fact"
    assert by_text["said once, under one key"] == 1, "three writers, one key: written once"
    assert {t for t in by_text if t.startswith("fact ")} == {
        f"fact {i} of writer w{n}" for i in range(10) for n in range(3)
    }
    assert len(by_text) == 32 and added == 32, "each fact was reported new by exactly one writer"
    assert 3 * 25 < history[0].version <= 3 * 26, "a version a write (a repeated key: at most a no-op one)"
