"""The Qwen2.5 prompt renderer, asserted character by character."""

from __future__ import annotations

from dflow_agents import ChatMessage, ToolCall, ToolSpec, parse_qwen_completion, render_qwen_prompt

WEATHER = ToolSpec(
    name="get_weather",
    description="Current weather of a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


def test_conversation_with_tool_results() -> None:
    messages = [
        ChatMessage.system("You are a travel assistant."),
        ChatMessage.user("Weather in Paris and 北京?"),
        ChatMessage.assistant(
            "Let me check.",
            [
                ToolCall(id="c1", name="get_weather", arguments={"city": "Paris"}),
                ToolCall(id="c2", name="get_weather", arguments={"city": "北京"}),
            ],
        ),
        ChatMessage.tool("18°C, cloudy", tool_call_id="c1", name="get_weather"),
        ChatMessage.tool("25°C, sunny", tool_call_id="c2", name="get_weather"),
    ]
    expected = (
        "<|im_start|>system\n"
        "You are a travel assistant.\n\n"
        "# Tools\n\n"
        "You may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        "<tools>\n"
        '{"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city.", '
        '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}\n'
        "</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n"
        "<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n'
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\n"
        "Weather in Paris and 北京?<|im_end|>\n"
        "<|im_start|>assistant\n"
        "Let me check.\n"
        "<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        "</tool_call>\n"
        "<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "北京"}}\n'
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\n"
        "<tool_response>\n"
        "18°C, cloudy\n"
        "</tool_response>\n"
        "<tool_response>\n"
        "25°C, sunny\n"
        "</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert render_qwen_prompt(messages, [WEATHER]) == expected


def test_without_tools_or_system_uses_the_default_system() -> None:
    prompt = render_qwen_prompt(
        [ChatMessage.user("hi"), ChatMessage.assistant("hello"), ChatMessage.user("bye")]
    )
    assert prompt == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n"
        "<|im_start|>assistant\nhello<|im_end|>\n"
        "<|im_start|>user\nbye<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_no_default_system_and_no_generation_prompt() -> None:
    prompt = render_qwen_prompt([ChatMessage.user("hi")], default_system=None, add_generation_prompt=False)
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n"


def test_an_assistant_turn_parses_back_to_its_calls() -> None:
    call = ToolCall(id="x", name="search", arguments={"q": 'a "quoted" {brace}', "n": 2})
    prompt = render_qwen_prompt(
        [ChatMessage.user("q"), ChatMessage.assistant("", [call])], add_generation_prompt=False
    )
    turn = prompt.split("<|im_start|>assistant")[1]
    parsed = parse_qwen_completion(turn)
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [
        ("search", {"q": 'a "quoted" {brace}', "n": 2})
    ]
