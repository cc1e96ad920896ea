"""AIFunction: formatter, template, model and parser as replaceable callables."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from typing import Any

import cloudpickle
import pytest

from dflow_agents import (
    AIFunction,
    ChatMessage,
    ChatResponse,
    ModelConfig,
    ToolCall,
    ToolSpec,
    qwen_template,
    render_qwen_prompt,
    tool,
)
from dflow_agents.testing import FunctionModel, ScriptedModel, call, reply


@tool
def lookup(term: str) -> str:
    """Look a term up."""
    return term


INPUTS = {
    "system": "You are terse.",
    "messages": [{"role": "user", "content": "define monad"}],
    "next_step": "Use a tool if needed.",
}
CONVERSATION = [
    ChatMessage.system("You are terse."),
    ChatMessage.user("define monad"),
    ChatMessage.user("Use a tool if needed."),
]


def test_native_path() -> None:
    model = ScriptedModel([reply("Looking.", calls=[call("lookup", term="monad")])])
    fn = AIFunction.chat(model, tools=[lookup], temperature=0)
    response = asyncio.run(fn(INPUTS))
    assert response.tool_calls == [ToolCall(id="call_0_0", name="lookup", arguments={"term": "monad"})]
    [request] = model.requests
    assert list(request.messages) == CONVERSATION
    assert request.tools == (lookup.spec,)
    assert request.options == {"temperature": 0}


def test_qwen_raw_path() -> None:
    model = ScriptedModel([reply("Looking.", calls=[call("lookup", term="monad")])])
    fn = AIFunction.qwen(model, tools=[lookup], max_tokens=256)
    response = asyncio.run(fn(INPUTS))
    assert response.content == "Looking."
    assert [(c.id, c.name, c.arguments) for c in response.tool_calls] == [
        ("call_0", "lookup", {"term": "monad"})
    ]
    [request] = model.requests
    assert request.prompt == render_qwen_prompt(CONVERSATION, [lookup.spec])
    assert request.options == {"max_tokens": 256}


def test_parts_swapped_per_instance_and_per_call() -> None:
    model = ScriptedModel(["a verdict"])
    base = AIFunction.chat(model)
    shouting = base.with_parts(parser=lambda r: r.content.upper())
    assert asyncio.run(shouting({"input": "hi"})) == "A VERDICT"
    assert asyncio.run(base({"input": "hi"})).content == "a verdict"  # the original is unchanged

    def one_line(variables: Mapping[str, Any]) -> list[ChatMessage]:
        return [ChatMessage.user(" | ".join(m.content for m in variables["messages"]))]

    assert asyncio.run(base({"system": "s", "input": "hi"}, template=one_line)).content == "a verdict"
    assert list(model.requests[-1].messages) == [ChatMessage.user("s | hi")]
    other = ToolSpec(name="other")
    asyncio.run(base({"input": "hi", "tools": [lookup, other]}))
    assert model.requests[-1].tools == (lookup.spec, other)
    with pytest.raises(TypeError, match="unknown AI function part"):
        base.with_parts(prompt=one_line)


def test_every_part_is_a_plain_callable() -> None:
    """A validation function, as a crawler would use: job and page in, a verdict out."""

    def formatter(inputs: Mapping[str, Any]) -> dict[str, Any]:
        return {"job": inputs["job"], "content": inputs["content"][:50]}

    def template(variables: Mapping[str, Any]) -> list[ChatMessage]:
        return [
            ChatMessage.user(f"Job: {variables['job']}\nContent: {variables['content']}\nValid? Answer JSON.")
        ]

    async def model(prompt: str | Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ChatResponse:
        assert not isinstance(prompt, str) and tools == []
        found = "4090" in prompt[0].content.split("Content:")[1]
        return ChatResponse(content=f'Sure: {{"valid": {json.dumps(found)}, "reason": "checked"}}')

    def parser(response: ChatResponse) -> dict[str, Any]:
        text = response.content
        parsed: dict[str, Any] = json.loads(text[text.index("{") : text.rindex("}") + 1])
        return parsed

    validate = AIFunction(model=model, template=template, formatter=formatter, parser=parser)
    assert asyncio.run(validate({"job": "cheapest 4090", "content": "RTX 4090: 1599 USD"})) == {
        "valid": True,
        "reason": "checked",
    }
    assert asyncio.run(validate({"job": "cheapest 4090", "content": "no GPUs here"}))["valid"] is False


def test_async_parser_and_model_config() -> None:
    async def parse(response: ChatResponse) -> str:
        await asyncio.sleep(0)
        return response.content[::-1]

    fn = AIFunction(model=ModelConfig(FunctionModel(lambda m, t: "abc"), {"seed": 1}), parser=parse)
    assert asyncio.run(fn({"input": "x"})) == "cba"


def test_mismatched_template_and_model_are_explained() -> None:
    chat_only = AIFunction(model=FunctionModel(lambda m, t: "x"))
    fn = chat_only.with_parts(template=qwen_template)
    with pytest.raises(TypeError, match="has no complete"):
        asyncio.run(fn({"input": "x"}))
    with pytest.raises(ValueError, match="no conversation"):
        asyncio.run(chat_only({}))


def test_pickles_with_its_parts() -> None:
    fn = AIFunction.chat(ScriptedModel([reply("hello", expect="hi")]), tools=[lookup])
    copy = cloudpickle.loads(cloudpickle.dumps(fn))
    assert asyncio.run(copy({"input": "hi"})).content == "hello"
    assert copy.tools == (lookup.spec,)
