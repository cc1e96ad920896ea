"""The tolerant Qwen2.5 completion parser on real-world-shaped completions."""

from __future__ import annotations

from typing import Any

import pytest

from dflow_agents import ChatResponse, ToolCall, ToolSpec, parse_qwen_completion, read_text_tool_calls

from . import recorded as R

Call = tuple[str, dict[str, Any]] | tuple[str, dict[str, Any], str]

# (id, completion, expected content, expected calls as (name, arguments[, raw_arguments]))
CASES: list[tuple[str, str, str, list[Call]]] = [
    (
        "plain-text",
        "The sky is blue because of Rayleigh scattering.",
        "The sky is blue because of Rayleigh scattering.",
        [],
    ),
    ("empty", "", "", []),
    ("whitespace", "  \n\t ", "", []),
    (
        "canonical",
        '<tool_call>\n{"name": "search", "arguments": {"q": "weather"}}\n</tool_call>',
        "",
        [("search", {"q": "weather"})],
    ),
    (
        "prose-before",
        'I will look it up.\n<tool_call>\n{"name": "search", "arguments": {"q": "x"}}\n</tool_call>',
        "I will look it up.",
        [("search", {"q": "x"})],
    ),
    (
        "prose-after-dropped",
        'Checking.<tool_call>{"name": "search", "arguments": {"q": "x"}}</tool_call>\nI hope this helps!',
        "Checking.",
        [("search", {"q": "x"})],
    ),
    (
        "two-calls",
        '<tool_call>\n{"name": "a", "arguments": {"n": 1}}\n</tool_call>\n<tool_call>\n{"name": "b", "arguments": {"n": 2}}\n</tool_call>',
        "",
        [("a", {"n": 1}), ("b", {"n": 2})],
    ),
    (
        "two-calls-prose-between",
        'First: <tool_call>{"name": "a", "arguments": {}}</tool_call> then <tool_call>{"name": "b", "arguments": {}}</tool_call>',
        "First:",
        [("a", {}), ("b", {})],
    ),
    (
        "unclosed-tag",
        'Let me check.\n<tool_call>\n{"name": "search", "arguments": {"q": "x"}}',
        "Let me check.",
        [("search", {"q": "x"})],
    ),
    (
        "second-tag-unclosed",
        '<tool_call>{"name": "a", "arguments": {}}</tool_call>\n<tool_call>{"name": "b", "arguments": {"k": "v"}}',
        "",
        [("a", {}), ("b", {"k": "v"})],
    ),
    (
        "truncated-missing-brace",
        '<tool_call>\n{"name": "search", "arguments": {"q": "x"}\n</tool_call>',
        "",
        [("search", {"q": "x"})],
    ),
    (
        "broken-json-keeps-name",
        '<tool_call>{"name": "search", "arguments": {"q": "unterminated</tool_call>',
        "",
        [("search", {}, '{"name": "search", "arguments": {"q": "unterminated')],
    ),
    (
        "tag-without-call-stays-text",
        "<tool_call>I am not sure what to call</tool_call>",
        "<tool_call>I am not sure what to call</tool_call>",
        [],
    ),
    (
        "array-in-tag",
        '<tool_call>[{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {"y": 2}}]</tool_call>',
        "",
        [("a", {"x": 1}), ("b", {"y": 2})],
    ),
    (
        "bare-array",
        '[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"z": [1, 2]}}]',
        "",
        [("a", {}), ("b", {"z": [1, 2]})],
    ),
    (
        "fence-with-prose",
        'Sure, here is the call:\n```json\n{"name": "search", "arguments": {"q": "x"}}\n```\nDone.',
        "Sure, here is the call:",
        [("search", {"q": "x"})],
    ),
    (
        "fence-inside-tag",
        '<tool_call>\n```json\n{"name": "search", "arguments": {"q": "x"}}\n```\n</tool_call>',
        "",
        [("search", {"q": "x"})],
    ),
    (
        "single-quotes-in-tag",
        "<tool_call>{'name': 'search', 'arguments': {'q': 'it\\'s raining'}}</tool_call>",
        "",
        [("search", {"q": "it's raining"})],
    ),
    (
        "python-literals-bare",
        "{'name': 'set_flag', 'arguments': {'on': True, 'reason': None}}",
        "",
        [("set_flag", {"on": True, "reason": None})],
    ),
    (
        "arguments-as-json-string",
        '<tool_call>{"name": "search", "arguments": "{\\"q\\": \\"x\\", \\"n\\": 3}"}</tool_call>',
        "",
        [("search", {"q": "x", "n": 3})],
    ),
    (
        "arguments-string-not-json",
        '<tool_call>{"name": "search", "arguments": "q=x"}</tool_call>',
        "",
        [("search", {}, "q=x")],
    ),
    ("parameters-key", '{"name": "search", "parameters": {"q": "x"}}', "", [("search", {"q": "x"})]),
    (
        "openai-wrapper",
        '{"type": "function", "function": {"name": "search", "arguments": {"q": "x"}}}',
        "",
        [("search", {"q": "x"})],
    ),
    (
        "bare-object",
        '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
        "",
        [("get_weather", {"city": "Paris", "unit": "celsius"})],
    ),
    (
        "bare-object-after-prose",
        'To answer this I need the weather. {"name": "get_weather", "arguments": {"city": "Paris"}}',
        "To answer this I need the weather.",
        [("get_weather", {"city": "Paris"})],
    ),
    (
        "nested-braces-in-strings",
        '<tool_call>{"name": "python", "arguments": {"code": "d = {\'a\': {1: 2}}\\nprint(d[\'a\'])"}}</tool_call>',
        "",
        [("python", {"code": "d = {'a': {1: 2}}\nprint(d['a'])"})],
    ),
    (
        "chinese",
        '我来查一下北京的天气。\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "北京"}}\n</tool_call>',
        "我来查一下北京的天气。",
        [("get_weather", {"city": "北京"})],
    ),
    (
        "garbage-after-call",
        '<tool_call>{"name": "search", "arguments": {"q": "x"}}}} ]] oops</tool_call>',
        "",
        [("search", {"q": "x"})],
    ),
    (
        "python-dict-stays-text",
        "In Python, {'a': 1} and [1, 2] are literals; use dict.get to read them.",
        "In Python, {'a': 1} and [1, 2] are literals; use dict.get to read them.",
        [],
    ),
    (
        "json-with-name-no-arguments-stays-text",
        'The record is {"name": "Alice", "age": 30}.',
        'The record is {"name": "Alice", "age": 30}.',
        [],
    ),
    (
        "format-explanation-stays-text",
        'Reply with {"name": <tool>, "arguments": {...}} to call a tool.',
        'Reply with {"name": <tool>, "arguments": {...}} to call a tool.',
        [],
    ),
    (
        "im-end-cut",
        '<tool_call>{"name": "a", "arguments": {}}</tool_call><|im_end|>\n<|im_start|>user\nhi',
        "",
        [("a", {})],
    ),
    ("text-then-im-end", "Final answer: 42.<|im_end|><|endoftext|>", "Final answer: 42.", []),
    ("no-arguments-key-in-tag", '<tool_call>{"name": "list_files"}</tool_call>', "", [("list_files", {})]),
    (
        "null-arguments",
        '<tool_call>{"name": "list_files", "arguments": null}</tool_call>',
        "",
        [("list_files", {})],
    ),
    (
        "odd-tag-spelling",
        '< TOOL_CALL >{"name": "a", "arguments": {"x": 1}}< /tool_call >',
        "",
        [("a", {"x": 1})],
    ),
    (
        "unicode-escapes",
        '<tool_call>{"name": "say", "arguments": {"text": "\\u4e2d\\u6587 \\ud83d\\ude00"}}</tool_call>',
        "",
        [("say", {"text": "中文 😀"})],
    ),
    (
        "windows-path-single-quotes",
        "<tool_call>{'name': 'read', 'arguments': {'path': 'C:\\data\\logs.txt'}}</tool_call>",
        "",
        [("read", {"path": "C:\\data\\logs.txt"})],
    ),
    (
        "closing-tag-only",
        '{"name": "search", "arguments": {"q": "x"}}\n</tool_call>',
        "",
        [("search", {"q": "x"})],
    ),
    (
        "data-array-stays-text",
        'The scores were [1, 2, 3] and {"mean": 2}.',
        'The scores were [1, 2, 3] and {"mean": 2}.',
        [],
    ),
    ("tool-calls-wrapper", '{"tool_calls": [{"name": "a", "arguments": {"k": 1}}]}', "", [("a", {"k": 1})]),
    (
        "trailing-commas",
        "<tool_call>{'name': 'a', 'arguments': {'x': [1, 2,],},}</tool_call>",
        "",
        [("a", {"x": [1, 2]})],
    ),
    (
        "raw-newline-in-string",
        '<tool_call>{"name": "write", "arguments": {"text": "line one\nline two"}}</tool_call>',
        "",
        [("write", {"text": "line one\nline two"})],
    ),
    (
        "call-inside-data-is-not-a-call",
        'Example: {"example": {"name": "a", "arguments": {}}}',
        'Example: {"example": {"name": "a", "arguments": {}}}',
        [],
    ),
]


@pytest.mark.parametrize(
    ("completion", "content", "calls"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_parse(completion: str, content: str, calls: list[Call]) -> None:
    parsed = parse_qwen_completion(completion)
    assert parsed.content == content
    got = [
        (c.name, c.arguments) if c.raw_arguments is None else (c.name, c.arguments, c.raw_arguments)
        for c in parsed.tool_calls
    ]
    assert got == calls
    assert [c.id for c in parsed.tool_calls] == [f"call_{n}" for n in range(len(calls))]


def test_enough_cases() -> None:
    assert len(CASES) >= 30
    assert len({c[0] for c in CASES}) == len(CASES)


def test_id_prefix_and_invalid_arguments_flag() -> None:
    parsed = parse_qwen_completion(
        '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b", "arguments": "oops"}</tool_call>',
        id_prefix="call_3_",
    )
    assert [c.id for c in parsed.tool_calls] == ["call_3_0", "call_3_1"]
    assert [c.arguments_ok for c in parsed.tool_calls] == [True, False]


def test_pathological_text_stays_text_quickly() -> None:
    deep = "[" * 50_000 + "]" * 50_000 + " has a name"
    assert parse_qwen_completion(deep).content == deep
    braces = "{" * 50_000 + " name"
    assert parse_qwen_completion(braces).tool_calls == []


# -- calls a chat model wrote in its text (issue: a server without a tool-call parser) -----

OFFERED = [ToolSpec(name="multiply"), ToolSpec(name="terminate")]
MULTIPLY = ToolCall(id="call_0", name="multiply", arguments={"a": 17, "b": 23})


@pytest.mark.parametrize(
    ("text", "content"),
    [
        (R.CALL, ""),
        (f"```json\n{R.CALL}\n```", ""),
        (f"```\n{R.CALL}\n```", ""),
        (f"<tool_call>\n{R.CALL}\n</tool_call>", ""),
        (f"I will multiply them.\n{R.CALL}", "I will multiply them."),
        (f"I will multiply them.\n```json\n{R.CALL}\n```", "I will multiply them."),
        ('{"function": {"name": "multiply", "arguments": "{\\"a\\": 17, \\"b\\": 23}"}}', ""),
    ],
    ids=["bare", "fenced-json", "fenced", "tagged", "prose-then-call", "prose-then-fence", "openai-wrapper"],
)
def test_a_call_written_as_text_is_read_as_a_call(text: str, content: str) -> None:
    read = read_text_tool_calls(ChatResponse(content=text), OFFERED)
    assert read.tool_calls == [MULTIPLY] and read.content == content and read.calls_from_text


def test_a_list_of_calls_written_as_text_is_read_in_order() -> None:
    text = f'[{R.CALL}, {{"name": "terminate", "arguments": {{"status": "success"}}}}]'
    read = read_text_tool_calls(ChatResponse(content=text), OFFERED, id_prefix="call_2_")
    assert [(c.id, c.name) for c in read.tool_calls] == [("call_2_0", "multiply"), ("call_2_1", "terminate")]


@pytest.mark.parametrize(
    "text",
    [
        "17 times 23 is 391.",
        '{"result": 391}',
        '{"name": "Ann", "age": 3}',  # a name but no arguments: data, not a call
        'Here is an example request: {"name": "get_weather", "arguments": {"city": "Paris"}} as you asked.',
        '```json\n{"name": "Ann", "arguments": "none"}\n```, and {"name": "Bob"}',
        '[{"name": "multiply", "arguments": {"a": 1}}, {"id": 7}]',  # a list that is not only calls
    ],
    ids=["prose", "json-answer", "json-with-a-name", "call-of-no-tool-in-prose", "mixed", "list-with-data"],
)
def test_text_that_is_an_answer_stays_the_answer(text: str) -> None:
    response = ChatResponse(content=text)
    assert read_text_tool_calls(response, OFFERED) is response


def test_a_call_of_a_tool_not_offered_counts_when_it_is_the_whole_reply() -> None:
    # it goes back to the model as an unknown tool, as a native call of that name would
    for text in (
        '{"name": "multiplication", "arguments": {"a": 17, "b": 23}}',
        '```json\n{"name": "multiplication", "arguments": {"a": 17, "b": 23}}\n```',
        'Calling it.<tool_call>{"name": "multiplication", "arguments": {}}</tool_call>',
    ):
        read = read_text_tool_calls(ChatResponse(content=text), OFFERED)
        assert [c.name for c in read.tool_calls] == ["multiplication"], text


def test_native_calls_and_empty_replies_are_left_as_they_are() -> None:
    native = ChatResponse(content=R.CALL, tool_calls=[MULTIPLY])
    assert read_text_tool_calls(native, OFFERED) is native
    empty = ChatResponse(content="  ")
    assert read_text_tool_calls(empty, OFFERED) is empty
