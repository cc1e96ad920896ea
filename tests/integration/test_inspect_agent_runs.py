"""``dflow inspect`` of an agent's run on Redis, from a process that has none of the agent's
classes (the command line): the result as its fields, and each turn's thought, calls and
observations in full, up to a bound."""

from __future__ import annotations

import dflow
from dflow_agents import ToolCallAgent, tool
from dflow_agents.testing import ScriptedModel, call, reply

from .conftest import SECRET
from .test_cli import dflow_cmd

DEFINITION = "one word after another, " * 12  # 300 characters: the tree cuts it at a few
LONG = "x" * 5000


@tool
def define(word: str) -> str:
    """What a word means."""
    return DEFINITION


@tool
def shout(text: str) -> str:
    """A long text."""
    return LONG


inspected = ToolCallAgent(
    "inspected",
    ScriptedModel(
        [
            reply("I look the word up first.", calls=[call("define", word="ephemeral")]),
            reply("Now a long one.", calls=[call("shout", text="hey")]),
            reply("Ephemeral means short-lived."),
        ]
    ),
    [define, shout],
)


def test_inspect_shows_an_agent_runs_result_and_every_turn_in_a_process_without_its_classes(
    redis_url: str, prefix: str
) -> None:
    store_url = f"{redis_url}?prefix={prefix}"
    dflow.configure(f"{redis_url}?stream={prefix}:steps", store_url, secret=SECRET)
    try:
        run = inspected.run("What does ephemeral mean?")
        assert run.result(20).answer == "Ephemeral means short-lived."
    finally:
        dflow.shutdown()
    out = dflow_cmd("inspect", run.trace_id, "--store", store_url)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "undecodable" not in text, text
    assert f"run {run.trace_id}  done" in text and "→ AgentResult(status='finished'" in text
    assert "finish" in text and text.count("AgentResult(status='finished'") == 2  # the run's and finish's
    conversation = text[text.index("conversation inspected (") :]
    assert "  user: What does ephemeral mean?" in conversation
    assert "  assistant: I look the word up first." in conversation
    assert '    → define(word="ephemeral") [call_0_0]' in conversation
    assert f"  tool define [call_0_0]: {DEFINITION}" in conversation  # not cut to a few characters
    assert f"  tool shout [call_1_0]: {'x' * 2000} … (3,000 more characters)" in conversation  # bounded
    assert conversation.rstrip().endswith("  assistant: Ephemeral means short-lived.")
    # what the model was sent and said, each turn: a line on the request, its whole text on demand
    assert conversation.count("  model call (scripted): reply: {") == 3
    assert "    sent: 2 messages; tools terminate, define, shout" in conversation
    assert "request: {" not in conversation
    full = dflow_cmd("inspect", run.trace_id, "--store", store_url, "--requests")
    assert full.returncode == 0 and full.stdout.count('    request: {"messages": [{"role": "system"') == 3
