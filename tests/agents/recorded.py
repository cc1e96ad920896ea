"""Replies recorded from a real small model, for the regression tests of what it did.

Qwen2.5-0.5B-Instruct behind llama-cpp-python's OpenAI-compatible server (native tools, raw
completions and the default chat format), asked "What is 17 times 23?" with the ``multiply``
tool below offered.
"""

from __future__ import annotations

from dflow_agents import tool


@tool
def multiply(a: float, b: float) -> float:
    """Multiply two numbers.

    Args:
        a: the first number.
        b: the second number.
    """
    return a * b


#: chat mode, default chat format: the call came back as the reply's text, no native tool_calls
CALL = '{"name": "multiply", "arguments": {"a": 17, "b": 23}}'
#: the same, as it also came: fenced
FENCED_CALL = f"```json\n{CALL}\n```"
#: raw mode (the Qwen prompt): the call in Qwen's tags, on the first turn and again on the
#: second, after the model had read 391.0 (6 runs of 6); also how a call read from text
#: goes back to the model
TAGGED_CALL = f"<tool_call>\n{CALL}\n</tool_call>"
#: the ReAct executor, shown multiply's JSON schema: the schema's properties sent back as the
#: Action Input (4 runs of 4)
SCHEMA_AS_INPUT = (
    'Thought: I need to multiply 17 by 23.\nAction: multiply\nAction Input: {"a": {"description": '
    '"the first number.", "type": "number"}, "b": {"description": "the second number.", "type": "number"}}'
)
