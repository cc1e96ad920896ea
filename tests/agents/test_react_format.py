"""The text ReAct format: the tolerant parser on real-world-shaped completions, and the
prompt renderer."""

from __future__ import annotations

from typing import Any

import pytest

from dflow_agents import (
    REACT_STOP,
    REACT_TEMPLATE,
    ReActAction,
    ReActFinalAnswer,
    ReActParseFailure,
    ReActStep,
    ToolSpec,
    parse_react_output,
    render_react_prompt,
    render_react_scratchpad,
    tool,
)

from . import recorded as R

TOOLS = [
    ToolSpec(
        name="search",
        description="Search the web.",
        parameters={"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
    ),
    ToolSpec(name="calculator", description="Evaluate an arithmetic expression."),
    ToolSpec(name="get_weather", description="The weather in a city."),
]

HELP = (
    "To use a tool, write:\nThought: <your reasoning>\n"
    "Action: <the tool's name, one of: search, calculator, get_weather>\n"
    "Action Input: <the input as a JSON object>\n"
    "To finish, write:\nThought: I now know the final answer\nFinal Answer: <your answer>"
)
OWN_OBSERVATION = (
    "Note: you wrote your own Observation; it was ignored. Stop after the Action Input and wait for "
    "the real Observation."
)
EARLY_ANSWER = "Note: your Final Answer was ignored because it came before this Observation; answer once you have read it."


def several(n: int) -> str:
    return (
        f"Note: you wrote {n} actions; only the first was run. Write one Action at a time and wait for "
        "its Observation."
    )


def unknown(name: str) -> str:
    return (
        f'Invalid action: there is no tool named "{name}". Available tools: search, calculator, '
        'get_weather. Write one of these names exactly after "Action:", or finish with '
        '"Final Answer: <your answer>".'
    )


def act(tool: str, tool_input: dict[str, Any], thought: str = "", notes: tuple[str, ...] = ()) -> ReActAction:
    return ReActAction(tool=tool, tool_input=tool_input, thought=thought, notes=list(notes))


def final(answer: str, thought: str = "") -> ReActFinalAnswer:
    return ReActFinalAnswer(answer=answer, thought=thought)


def fail(message: str, text: str, thought: str = "") -> ReActParseFailure:
    return ReActParseFailure(message=message, text=text, thought=thought)


Expected = ReActAction | ReActFinalAnswer | ReActParseFailure

# (id, model output, exact expected result)
CASES: list[tuple[str, str, Expected]] = [
    (
        "canonical",
        'Thought: I need the weather.\nAction: get_weather\nAction Input: {"city": "Paris"}',
        act("get_weather", {"city": "Paris"}, "I need the weather."),
    ),
    (
        "no-thought-label",  # the prompt ends with "Thought:", so the model starts mid-line
        ' I need the weather.\nAction: get_weather\nAction Input: {"city": "Paris"}',
        act("get_weather", {"city": "Paris"}, "I need the weather."),
    ),
    (
        "lower-case-labels-and-name",
        'thought: look it up\naction: GET_WEATHER\naction input: {"city": "Rome"}',
        act("get_weather", {"city": "Rome"}, "look it up"),
    ),
    (
        "extra-spaces",
        'Thought :   hmm  \nAction   :   search   \nAction  Input :   {"q": "dflow"}   ',
        act("search", {"q": "dflow"}, "hmm"),
    ),
    (
        "bold-labels",
        '**Thought:** search first\n**Action:** search\n**Action Input:** {"q": "a"}',
        act("search", {"q": "a"}, "search first"),
    ),
    (
        "bold-outside-colon-backticks-fenced-input",
        '**Thought**: x\n**Action**: `search`\n**Action Input**:\n```json\n{"q": "a"}\n```',
        act("search", {"q": "a"}, "x"),
    ),
    (
        "text-after-json-input",
        'Action: search\nAction Input: {"q": "a"} (this should find it)\nI hope this helps.',
        act("search", {"q": "a"}),
    ),
    (
        "input-over-several-lines",
        'Thought: t\nAction: search\nAction Input: {\n  "q": "a",\n  "limit": 3\n}',
        act("search", {"q": "a", "limit": 3}, "t"),
    ),
    (
        "made-up-observation-and-answer",
        (
            'Thought: t\nAction: search\nAction Input: {"q": "a"}\nObservation: 42 results\n'
            "Thought: I now know the final answer\nFinal Answer: 42"
        ),
        act("search", {"q": "a"}, "t", (OWN_OBSERVATION,)),
    ),
    (
        "final-answer",
        "Thought: I now know the final answer\nFinal Answer: Paris is the capital of France.",
        final("Paris is the capital of France.", "I now know the final answer"),
    ),
    (
        "multi-line-final-answer",
        "Final Answer: Two steps:\n1. install\n2. run `make demo`\n\n```sh\nmake demo\n```",
        final("Two steps:\n1. install\n2. run `make demo`\n\n```sh\nmake demo\n```"),
    ),
    (
        "quoted-name-plain-text-input",
        'Action: "search"\nAction Input: weather in Paris',
        act("search", {"input": "weather in Paris"}),
    ),
    (
        "several-actions",
        'Action: search\nAction Input: {"q": "a"}\nAction: calculator\nAction Input: {"e": "1+1"}',
        act("search", {"q": "a"}, notes=(several(2),)),
    ),
    (
        "unknown-tool",
        'Thought: t\nAction: searh\nAction Input: {"q": "a"}',
        fail(unknown("searh"), 'Thought: t\nAction: searh\nAction Input: {"q": "a"}', "t"),
    ),
    (
        "no-substring-match",  # the Java original ran "search" here
        'Action: web_search\nAction Input: {"q": "a"}',
        fail(unknown("web_search"), 'Action: web_search\nAction Input: {"q": "a"}'),
    ),
    (
        "no-prefix-match",
        "Action: calc\nAction Input: 1+1",
        fail(unknown("calc"), "Action: calc\nAction Input: 1+1"),
    ),
    (
        "no-format-at-all",
        "I think the answer is 4.",
        fail(
            'Invalid format: your reply has neither an "Action:" line nor a "Final Answer:" line.\n' + HELP,
            "I think the answer is 4.",
            "I think the answer is 4.",
        ),
    ),
    (
        "answer-before-action-wins",
        "Final Answer: 4\nAction: calculator\nAction Input: 2+2",
        final("4"),
    ),
    (
        "action-before-answer-wins",
        "Action: calculator\nAction Input: 2+2\nFinal Answer: 4",
        act("calculator", {"input": "2+2"}, notes=(EARLY_ANSWER,)),
    ),
    (
        "action-none-beside-answer",
        "Thought: no tool needed\nAction: None\nFinal Answer: 4",
        final("4", "no tool needed"),
    ),
    (
        "action-final-answer",
        'Thought: done\nAction: Final Answer\nAction Input: "The answer is 4."',
        ReActFinalAnswer(answer="The answer is 4.", thought="done"),
    ),
    (
        "react-paper-call-form",
        "Thought: look it up\nAction: search[weather in Paris]",
        act("search", {"input": "weather in Paris"}, "look it up"),
    ),
    (
        "whole-reply-fenced",
        '```\nThought: x\nAction: search\nAction Input: {"q": "a"}\n```',
        act("search", {"q": "a"}, "x"),
    ),
    (
        "loose-json-input",
        "Action: search\nAction Input: {q: 'a', 'limit': 2,}",
        act("search", {"q": "a", "limit": 2}),
    ),
    (
        "broken-json-input",
        'Thought: x\nAction: search\nAction Input: {"q": "a"',
        fail(
            'Invalid action input for tool search: the Action Input is not valid JSON: {"q": "a". '
            'Write the input as a JSON object, e.g. Action Input: {"q": "text"}.',
            'Thought: x\nAction: search\nAction Input: {"q": "a"',
            "x",
        ),
    ),
    (
        "fenced-input-on-next-line-then-observation",
        'Action: search\nAction Input:\n```\n{"q": "a"}\n```\nObservation: blah',
        act("search", {"q": "a"}, notes=(OWN_OBSERVATION,)),
    ),
    (
        "inline-final-answer",
        "Thought: I now know the Final Answer: 42",
        final("42", "I now know the"),
    ),
    (
        "bracketed-name-and-none-input",
        "Action: [calculator]\nAction Input: None",
        act("calculator", {}),
    ),
    (
        "trailing-words-after-name",
        'Thought: x\nAction: search (to find it)\nAction Input: {"q": "a"}',
        act("search", {"q": "a"}, "x"),
    ),
    (
        "numbered-labels",
        'Thought 1: x\nAction 1: search\nAction Input 1: {"q": "a"}',
        act("search", {"q": "a"}, "x"),
    ),
    (
        "final-answer-text-inside-json-input",
        'Action: search\nAction Input: {"q": "Final Answer: no"}',
        act("search", {"q": "Final Answer: no"}),
    ),
    (
        "plain-input-ends-at-blank-line",
        "Thought: x\nAction: search\nAction Input: weather\nin Paris\n\nI will now wait.",
        act("search", {"input": "weather\nin Paris"}, "x"),
    ),
    (
        "list-markers-and-plural-thoughts",
        '- Thoughts: plan\n- Action: calculator\n- Action Input: "2+2"',
        act("calculator", {"input": "2+2"}, "plan"),
    ),
    (
        "input-without-its-label",
        'Action: search\n{"q": "a"}',
        act("search", {"q": "a"}),
    ),
    (
        "made-up-next-question",
        "Final Answer: 4\nQuestion: what is 3+3?\nThought:",
        final("4"),
    ),
    (
        "heading-final-answer",
        "### Final Answer:\nParis.",
        final("Paris."),
    ),
    (
        "empty-final-answer",
        "Thought: done\nFinal Answer:",
        fail(
            'Invalid format: your "Final Answer:" was empty. Write the answer after it.',
            "Thought: done\nFinal Answer:",
            "done",
        ),
    ),
    (
        "empty-reply",
        "  \n",
        fail("Invalid format: your reply was empty.\n" + HELP, ""),
    ),
    (
        "input-without-action",
        'Thought: x\nAction Input: {"q": "a"}',
        fail(
            'Invalid format: you wrote "Action Input:" without an "Action:" line naming the tool.\n' + HELP,
            'Thought: x\nAction Input: {"q": "a"}',
            "x",
        ),
    ),
    (
        "action-none-alone",
        "Action: None",
        fail(
            'Invalid format: "Action:" must name a tool (one of: search, calculator, get_weather); '
            'if you know the answer, write "Final Answer: <your answer>" instead.',
            "Action: None",
        ),
    ),
]


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_parser(text: str, expected: Expected) -> None:
    assert parse_react_output(text, TOOLS) == expected


def test_the_table_is_big_and_named_uniquely() -> None:
    assert len(CASES) >= 25
    assert len({c[0] for c in CASES}) == len(CASES)


def test_tool_names_match_exactly_then_ignoring_case() -> None:
    names = ["Search", "search", "lookup"]
    assert parse_react_output("Action: Search", names) == act("Search", {})
    assert parse_react_output("Action: search", names) == act("search", {})
    assert parse_react_output("Action: LOOKUP", names) == act("lookup", {})
    ambiguous = parse_react_output("Action: SEARCH", names)
    assert isinstance(ambiguous, ReActParseFailure)
    assert ambiguous.message == (
        'Invalid action: "SEARCH" matches several tools that differ only in case (Search, search). '
        "Write the tool's exact name."
    )


def test_a_tool_named_like_a_keyword_is_a_tool() -> None:
    assert parse_react_output("Action: finish\nAction Input: {}\nFinal Answer: x", ["finish"]) == act(
        "finish", {}, notes=(EARLY_ANSWER,)
    )
    no_tools = parse_react_output("Action: search", [])
    assert isinstance(no_tools, ReActParseFailure)
    assert "Available tools: (none: there are no tools, write a Final Answer)" in no_tools.message


# -- rendering -----------------------------------------------------------------------------


def test_prompt_renders_exactly() -> None:
    steps = [
        ReActStep.of(
            ReActAction(tool="search", tool_input={"q": "dflow"}, thought="Look it up.", notes=[several(2)]),
            "dflow is a Python library.",
        ),
        ReActStep.of(parse_react_output("Thought: Done?\nAction: nope", TOOLS)),
    ]
    prompt = render_react_prompt(TOOLS[:2], "What is dflow?", steps)
    assert prompt == (
        "Answer the following question as best you can. You have access to the following tools:\n"
        "\n"
        "search(q: string): Search the web.\n"
        "calculator(): Evaluate an arithmetic expression.\n"
        "\n"
        "Use the following format:\n"
        "\n"
        "Question: the input question you must answer\n"
        "Thought: you should always think about what to do\n"
        "Action: the action to take, exactly one of [search, calculator]\n"
        "Action Input: the input to the action: a JSON object with a value for each argument\n"
        "Observation: the result of the action\n"
        "... (this Thought/Action/Action Input/Observation can repeat N times)\n"
        "Thought: I now know the final answer\n"
        "Final Answer: the final answer to the original input question\n"
        "\n"
        "For example, a call of a tool:\n"
        "Thought: I should use a tool.\n"
        "Action: search\n"
        'Action Input: {"q": "text"}\n'
        "\n"
        "Begin!\n"
        "\n"
        "Question: What is dflow?\n"
        "Thought: Look it up.\n"
        "Action: search\n"
        'Action Input: {"q": "dflow"}\n'
        "Observation: dflow is a Python library.\n" + several(2) + "\n"
        "Thought: Done?\n"
        "Action: nope\n"
        "Observation: " + unknown("nope") + "\n"
        "Thought:"
    )
    assert render_react_prompt(TOOLS[:2], "What is dflow?").endswith("Question: What is dflow?\nThought:")


def test_a_rendered_step_parses_back_to_the_same_action() -> None:
    action = ReActAction(tool="search", tool_input={"q": 'é "quoted"', "n": [1, 2]}, thought="Why not.")
    text = render_react_scratchpad([ReActStep.of(action, "ok")])
    assert (
        text
        == ' Why not.\nAction: search\nAction Input: {"q": "é \\"quoted\\"", "n": [1, 2]}\nObservation: ok\nThought:'
    )
    assert parse_react_output(text.split("\nObservation:")[0], TOOLS) == action


def test_template_placeholders_are_replaced_once_and_other_braces_stay() -> None:
    template = 'Tools: {tools}\nNames: {tool_names}\nExample: {"q": "x"}\nQ: {question}\n{scratchpad}'
    prompt = render_react_prompt([TOOLS[1]], "what is {scratchpad}?", template=template)
    assert prompt == (
        "Tools: calculator(): Evaluate an arithmetic expression.\n"
        'Names: calculator\nExample: {"q": "x"}\nQ: what is {scratchpad}?\n'
    )
    assert (
        render_react_prompt([], "q", template="{tools}|{tool_names}|{question}|{scratchpad}")
        == "(no tools)||q|"
    )
    with pytest.raises(ValueError, match=r"lacks the placeholders \{scratchpad\}"):
        render_react_prompt(TOOLS, "q", template="{tools} {question}")
    assert "{tools}" in REACT_TEMPLATE and REACT_STOP == ("\nObservation:",)


def test_tools_made_with_the_decorator_render_from_their_spec() -> None:
    @tool
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    prompt = render_react_prompt([add], "1+2?", template="{tools}\n{example}\n{question}{scratchpad}")
    assert (
        prompt
        == 'add(a: integer, b: integer): Add two numbers.\nAction: add\nAction Input: {"a": 1, "b": 1}\n1+2?'
    )
    assert parse_react_output('Action: add\nAction Input: {"a": 1, "b": 2}', [add]) == act(
        "add", {"a": 1, "b": 2}
    )


def test_steps_say_what_they_need() -> None:
    failure = parse_react_output("hello", TOOLS)
    assert isinstance(failure, ReActParseFailure)
    assert ReActStep.of(failure).observation == failure.message
    assert ReActStep.of(failure, "custom").observation == "custom"
    with pytest.raises(TypeError, match="needs its observation"):
        ReActStep.of(act("search", {}))
    with pytest.raises(TypeError, match="a final answer ends the loop"):
        ReActStep.of(final("x"))  # type: ignore[arg-type]
    # results and steps are JSON data, to carry in agent state
    step = ReActStep.of(act("search", {"q": "a"}, "t"), "seen")
    assert ReActStep.model_validate(step.model_dump(mode="json")) == step


# -- tools as small models read them (replies recorded from Qwen2.5-0.5B-Instruct) ------------


def test_tools_are_shown_as_signatures_with_their_arguments_and_an_example() -> None:
    shop = ToolSpec(
        name="find",
        description="Find products.\n  In the catalogue.",
        parameters={
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "what to look for"},
                "sort": {"enum": ["price", "rating"], "default": "price"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
            },
            "required": ["query"],
        },
    )
    prompt = render_react_prompt(
        [R.multiply, shop], "17 × 23?", template="{tools}\n--\n{example}{scratchpad}{question}"
    )
    assert prompt == (
        "multiply(a: number, b: number): Multiply two numbers.\n"
        "    a: the first number.\n"
        "    b: the second number.\n"
        'find(query: string, sort: "price" or "rating" = "price", tags: array of string (optional), '
        "limit: integer or null (optional)): Find products. In the catalogue.\n"
        "    query: what to look for\n"
        "--\n"
        'Action: multiply\nAction Input: {"a": 1.5, "b": 1.5}'
        "17 × 23?"
    )
    assert '"properties"' not in render_react_prompt([R.multiply], "q"), (
        "no JSON schema for the model to copy"
    )


def test_the_tools_schema_sent_as_the_input_is_answered_with_what_to_send() -> None:
    parsed = parse_react_output(R.SCHEMA_AS_INPUT, [R.multiply])
    assert isinstance(parsed, ReActParseFailure)
    assert parsed.thought == "I need to multiply 17 by 23."
    assert parsed.message == (
        "Invalid action input for tool multiply: you sent the description of its arguments (their types "
        "and descriptions), not their values. Send a JSON object with a value for each argument, e.g. "
        'Action Input: {"a": 1.5, "b": 1.5} for multiply(a: number, b: number): Multiply two numbers.'
    )
    whole = 'Action: multiply\nAction Input: {"type": "object", "properties": {"a": {"type": "number"}}}'
    assert isinstance(parse_react_output(whole, [R.multiply]), ReActParseFailure)
    assert parse_react_output('Action: multiply\nAction Input: {"a": 17, "b": 23}', [R.multiply]) == act(
        "multiply", {"a": 17, "b": 23}
    )


def test_an_object_argument_that_looks_like_a_schema_is_still_an_input() -> None:
    @tool
    def catalogue(filter: dict[str, str]) -> str:
        """Filter the catalogue."""
        return "ok"

    text = 'Action: catalogue\nAction Input: {"filter": {"type": "book", "description": "blue"}}'
    assert parse_react_output(text, [catalogue]) == act(
        "catalogue", {"filter": {"type": "book", "description": "blue"}}
    )
