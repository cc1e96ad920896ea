"""What the model saw and said: each turn's model calls kept in the run (the request as it was
made, the reply, what went on the wire), bounded, redactable, and shown by ``Run.tree()`` and
the console. Scripted models and the local OpenAI-compatible test server, local mode."""

from __future__ import annotations

import json
from typing import Any

import dflow
from dflow.ops.conversations import described
from dflow.server.console.html import conversation_html
from dflow.server.console.views import conversations
from dflow.wire.values import encode
from dflow_agents import (
    AgentLimits,
    AgentStatus,
    AIFunction,
    CallRecording,
    ConversationAgentExecutor,
    ModelCalls,
    ModelTimeoutError,
    OpenAIChatModel,
    ToolCallAgent,
    _recorded,
    tool,
)
from dflow_agents.testing import FunctionModel, ScriptedModel, call, reply

from .conftest import FakeLLMServer, chat_body
from .test_toolcall_agent import close_on_runtime

_names = iter(range(10**6))


def unique(stem: str) -> str:
    return f"recorded-{stem}-{next(_names)}"


@tool
def lookup(key: str) -> str:
    """A stored text."""
    return "secret-token-42 and " + "y" * 10_000


def model_calls(run: dflow.Run) -> dict[int, list[dict[str, Any]]]:
    """The recorded model calls of a run, by turn, their requests rebuilt whole."""
    recorded = dflow.RecordedMessages()
    return {turn: [recorded.rebuilt(c) for c in calls] for turn, calls in kept_calls(run).items()}


def kept_calls(run: dflow.Run) -> dict[int, list[dict[str, Any]]]:
    """The model calls of a run, by turn, as its data keeps them."""
    data = run.context().as_dict()
    found = {
        int(k.rsplit("/", 1)[1]): v["model_calls"]
        for k, v in data.items()
        if "/call/" in k and isinstance(v, dict)
    }
    return dict(sorted(found.items()))


def test_each_turn_keeps_the_request_the_model_got_and_its_reply(local: dflow.Runtime) -> None:
    model = ScriptedModel([reply("looking", calls=[call("lookup", key="k")]), reply("found it")], name="m1")
    agent = ToolCallAgent(
        unique("turns"), model, [lookup], model_calls=ModelCalls(options={"temperature": 0})
    )
    run = agent.run("find k")
    assert run.result(10).answer == "found it"
    calls = model_calls(run)
    assert sorted(calls) == [0, 1] and [len(c) for c in calls.values()] == [1, 1]
    first = calls[0][0]
    assert first["model"] == "m1"
    sent = model.requests[0]
    assert first["request"]["messages"] == [
        m.model_dump(mode="json", exclude_defaults=True) for m in sent.messages
    ]
    assert [t["name"] for t in first["request"]["tools"]] == ["terminate", "lookup"]
    assert first["request"]["options"] == {"temperature": 0}
    assert first["reply"]["content"] == "looking" and first["reply"]["tool_calls"][0]["name"] == "lookup"
    tree = run.tree()
    assert 'model call (m1): reply: {"content": "looking"' in tree
    assert '    sent: 2 messages; tools terminate, lookup; options {"temperature": 0}' in tree
    assert "request: {" not in tree, "the whole request only with requests=True (dflow inspect --requests)"


def test_records_are_bounded_and_say_what_they_cut(local: dflow.Runtime) -> None:
    model = ScriptedModel([reply(calls=[call("lookup", key="k")]), reply("done")])
    recording = CallRecording(text_chars=500, max_chars=600)
    run = ToolCallAgent(unique("bounded"), model, [lookup], model_calls=ModelCalls(recording=recording)).run(
        "k?"
    )
    run.result(10)
    second = model_calls(run)[1][0]["request"]
    observation = second["messages"][-1]["content"]
    assert observation.startswith("secret-token-42") and observation.endswith(" more characters)")
    assert len(observation) < 600
    assert second["left_out_messages"] == 1
    assert [t["name"] for t in second["tools"]] == ["terminate", "lookup"]
    assert kept_calls(run)[1][0]["request"]["tools_as_before"] is True
    assert [m["role"] for m in second["messages"]] == ["system", "user", "tool"], (
        "the messages of the first turn's record are kept by reference; of the new ones, all"
        " but the last are left out, as the observation alone takes most of 600 (the tools, the same"
        " as the first turn's, are kept once)"
    )


def test_a_redact_hook_sees_each_record_before_it_is_kept(local: dflow.Runtime) -> None:
    def redact(record: dict[str, Any]) -> dict[str, Any]:
        return json.loads(json.dumps(record).replace("secret-token-42", "[redacted]"))

    model = ScriptedModel([reply(calls=[call("lookup", key="k")]), reply("done")])
    calls = ModelCalls(recording=CallRecording(redact=redact))
    run = ToolCallAgent(unique("redact"), model, [lookup], model_calls=calls).run("k?")
    run.result(10)
    kept = json.dumps(model_calls(run))
    assert "secret-token-42" not in kept and "[redacted]" in kept


def test_a_redact_hook_that_fails_keeps_nothing_of_the_call(local: dflow.Runtime) -> None:
    def broken(record: dict[str, Any]) -> dict[str, Any]:
        raise KeyError("oops")

    model = ScriptedModel(["the answer"], name="m2")
    run = ToolCallAgent(
        unique("broken"), model, model_calls=ModelCalls(recording=CallRecording(redact=broken))
    ).run("?")
    assert run.result(10).answer == "the answer"
    assert model_calls(run) == {0: [{"model": "m2", "error": "the redact hook failed (KeyError): not kept"}]}


def test_recording_can_be_switched_off(local: dflow.Runtime) -> None:
    run = ToolCallAgent(unique("off"), ScriptedModel(["hi"]), model_calls=ModelCalls(recording=None)).run("?")
    run.result(10)
    assert model_calls(run) == {}


def test_a_model_call_that_keeps_failing_is_kept_with_its_error(local: dflow.Runtime) -> None:
    def down(messages: Any, tools: Any) -> Any:
        raise ModelTimeoutError("no answer within 30 s")

    agent = ToolCallAgent(
        unique("down"), FunctionModel(down, name="slow"), model_calls=ModelCalls(attempts=1)
    )
    run = agent.run("?")
    assert run.result(10).status is AgentStatus.ERROR
    (only,) = model_calls(run)[0]
    assert only["model"] == "slow" and only["error"] == "ModelTimeoutError: no answer within 30 s"
    assert "model call (slow): failed: ModelTimeoutError: no answer within 30 s" in run.tree()


def test_the_openai_client_adds_what_went_on_the_wire_and_the_raw_reply(
    local: dflow.Runtime, llm_server: FakeLLMServer
) -> None:
    body = chat_body({"content": "Hello there."})
    llm_server.answer(body)
    model = OpenAIChatModel("qwen2.5-0.5b-instruct", base_url=llm_server.base_url, api_key="EMPTY")
    try:
        run = ToolCallAgent(unique("wire"), model, [lookup]).run("hi")
        assert run.result(10).answer == "Hello there."
    finally:
        close_on_runtime(model)
    (only,) = model_calls(run)[0]
    assert only["model"] == "qwen2.5-0.5b-instruct" and only["reply"]["content"] == "Hello there."
    sent = only["http"]["sent"]
    assert sent["endpoint"] == "chat/completions" and sent["model"] == "qwen2.5-0.5b-instruct"
    assert sent["tool_choice"] == "auto" and sent["tools"] == llm_server.received[0].body["tools"]
    assert json.loads(only["http"]["raw_reply"]) == body
    assert "EMPTY" not in json.dumps(only), "the API key is never part of a record"


def test_a_raw_prompt_is_kept_as_it_was_sent(local: dflow.Runtime) -> None:
    model = ScriptedModel(["The answer is 4."], name="raw")
    run = ToolCallAgent(unique("raw"), AIFunction.qwen(model)).run("2+2?")
    assert run.result(10).answer == "The answer is 4."
    (only,) = model_calls(run)[0]
    assert only["request"]["prompt"] == model.requests[0].prompt
    assert "<|im_start|>user\n2+2?<|im_end|>" in only["request"]["prompt"]


def test_the_react_executor_keeps_its_model_calls_too(local: dflow.Runtime) -> None:
    model = ScriptedModel(["Final Answer: 42"], name="react")
    run = ConversationAgentExecutor(unique("react"), model, [], mode="completion").run("meaning?")
    assert run.result(10).answer == "42"
    (only,) = model_calls(run)[0]
    assert "Question: meaning?" in only["request"]["prompt"] and only["request"]["options"]["stop"]
    assert only["reply"]["content"] == "Final Answer: 42"


def test_the_console_shows_the_model_calls_in_the_conversation(local: dflow.Runtime) -> None:
    run = ToolCallAgent(unique("console"), ScriptedModel(["hi <there>"], name="m3")).run("?")
    run.result(10)
    found = conversations({k: encode(v) for k, v in run.context().as_dict().items()})
    (conv,) = [c for c in found if c.title.startswith("recorded-console-")]
    roles = [m["role"] for m in conv.messages]
    assert roles == ["user", "model call", "assistant"]
    html = conversation_html([conv])
    assert '<div class="msg other"><div class="who">model call</div>' in html
    assert "hi &lt;there&gt;" in html and "request: {" in html


def counting(turns: int) -> FunctionModel:
    """A model that calls ``lookup`` once a turn for ``turns`` turns, then answers."""

    def decide(messages: Any, tools: Any) -> Any:
        turn = sum(1 for m in messages if m.role == "assistant")
        if turn >= turns:
            return reply("done")
        return reply(f"turn {turn}", calls=[call("short_lookup", key=f"k{turn}")])

    return FunctionModel(decide, name="counting")


def long_agent(stem: str, turns: int, model: Any) -> ToolCallAgent:
    return ToolCallAgent(
        unique(stem),
        model,
        [short_lookup],
        limits=AgentLimits(max_steps=turns + 5),
        model_calls=ModelCalls(recording=CallRecording(text_chars=100_000, max_chars=1_000_000)),
    )


@tool
def short_lookup(key: str) -> str:
    """A stored text."""
    return f"the value of {key}"


def test_a_turn_keeps_only_what_its_request_adds_so_a_40_turn_run_stays_bounded(
    local: dflow.Runtime,
) -> None:
    model = counting(40)
    run = long_agent("long", 40, model).run("count")
    assert run.result(30).answer == "done"
    sizes = {turn: len(json.dumps(calls)) for turn, calls in kept_calls(run).items()}
    assert sorted(sizes) == list(range(41))
    assert max(sizes[t] for t in range(2, 41)) < 1.1 * sizes[2], (
        f"a turn's record does not grow with the conversation: {sizes}"
    )
    for turn, (kept,) in model_calls(run).items():  # each rebuilt as the model got it
        assert kept["request"]["messages"] == [
            m.model_dump(mode="json", exclude_defaults=True) for m in model.requests[turn].messages
        ]


def test_requests_are_rebuilt_the_same_by_a_worker_that_did_not_record_the_turn_before(
    local: dflow.Runtime, monkeypatch: Any
) -> None:
    forgetful = counting(6)
    decide = forgetful.fn

    def forgetting(messages: Any, tools: Any) -> Any:
        _recorded._known.clear()  # as if another worker recorded every earlier turn
        return decide(messages, tools)

    monkeypatch.setattr(forgetful, "fn", forgetting)
    run = long_agent("forgetful", 6, forgetful).run("count")
    assert run.result(30).answer == "done"
    for turn, (kept,) in model_calls(run).items():
        assert kept["request"]["messages"] == [
            m.model_dump(mode="json", exclude_defaults=True) for m in forgetful.requests[turn].messages
        ]
        assert kept["request"]["tools"] == [
            t.model_dump(mode="json", exclude_defaults=True) for t in forgetful.requests[turn].tools
        ], "the tools, kept once, are put back in every request"
    assert all(c[0]["request"].get("tools_as_before") for t, c in kept_calls(run).items() if t > 0)
    assert all(isinstance(p, list) for p in kept_calls(run)[6][0]["request"]["message_parts"][:1]), (
        "the earlier messages are still kept by reference"
    )


def shown(run: dflow.Run) -> list[list[dict[str, Any]]]:
    """A run's conversations as ``dflow inspect`` and the console show them (names left out)."""
    return [messages for _, messages in described(run.context().as_dict())]


def test_a_run_of_whole_records_and_one_of_added_parts_show_the_same_conversation(
    local: dflow.Runtime, monkeypatch: Any
) -> None:
    now = shown(run_of(counting(5)))

    def whole(self: CallRecording, ctx: Any, prefix: str, turn: int, calls: Any) -> None:
        ctx.put(f"{prefix}{turn}", self.record(calls))  # as records were kept before

    monkeypatch.setattr(CallRecording, "keep", whole)
    before = shown(run_of(counting(5)))
    assert [m["role"] for m in before[0]].count("model call") == 6
    assert now == before


def test_a_run_recorded_with_its_tools_in_every_turn_shows_the_same_conversation(
    local: dflow.Runtime, monkeypatch: Any
) -> None:
    now = run_of(counting(5))
    assert all("tools_as_before" in c[0]["request"] for t, c in kept_calls(now).items() if t > 0)
    # as the records of the version before kept them: the tools whole in every turn's request
    ignored = property(lambda self: None, lambda self, v: None)
    monkeypatch.setattr(_recorded.Transcript, "tools", ignored, raising=False)
    before = run_of(counting(5))
    assert all("tools" in c[0]["request"] for c in kept_calls(before).values())
    assert shown(now) == shown(before)
    assert model_calls(now) == model_calls(before)


def run_of(model: Any) -> dflow.Run:
    run = ToolCallAgent(unique("same"), model, [short_lookup]).run("count")
    assert run.result(30).answer == "done"
    return run


def test_a_request_whose_tools_are_those_before_keeps_the_mark_when_no_earlier_tools_were_read() -> None:
    """A reading that starts after the request that offered the tools (or whose record of it
    was replaced) cannot put them back: it says they were those before, not that none were."""
    recorded = dflow.RecordedMessages()
    call = {"request": {"message_parts": [{"role": "user", "content": "hi"}], "tools_as_before": True}}
    whole = recorded.rebuilt(call)["request"]
    assert whole["tools_as_before"] is True and "tools" not in whole
    assert whole["messages"] == [{"role": "user", "content": "hi"}]
