"""The text ReAct format: a prompt renderer and a tolerant parser of what the model writes.

The model reasons in text::

    Thought: I should look up the weather.
    Action: get_weather
    Action Input: {"city": "Paris"}

and the agent runs the tool and appends ``Observation: <result>`` to the scratchpad, or the
model ends with ``Final Answer: ...``. Send the prompt with ``stop=REACT_STOP`` so the model
stops where the observation belongs.

:func:`parse_react_output` returns a :class:`ReActAction`, a :class:`ReActFinalAnswer` or a
:class:`ReActParseFailure` (a value, not an exception) whose ``message`` is written for the
model: feed it back as the observation. Keep the steps as :class:`ReActStep` and render the
next prompt with :func:`render_react_prompt`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from . import _loose_json
from . import _react_lexer as lex
from . import _react_tools as tools_text
from .messages import ToolSpec
from .tools import Tool

__all__ = [
    "REACT_STOP",
    "REACT_TEMPLATE",
    "ReActAction",
    "ReActFinalAnswer",
    "ReActParseFailure",
    "ReActStep",
    "parse_react_output",
    "render_react_prompt",
    "render_react_scratchpad",
]

#: The default prompt. Placeholders: ``{tools}`` (one entry per tool: its signature,
#: ``multiply(a: number, b: number): Multiply two numbers.``, and each argument's description
#: on a line of its own), ``{tool_names}`` (the names, comma-separated), ``{example}`` (an
#: example call of the first tool, with values), ``{question}`` and ``{scratchpad}`` (the
#: steps so far; empty at first). Only these are replaced, in one pass, so other braces in a
#: template (JSON examples) need no escaping; ``{example}`` and ``{tool_names}`` may be left
#: out.
REACT_TEMPLATE = """Answer the following question as best you can. You have access to the following tools:

{tools}

Use the following format:

Question: the input question you must answer
Thought: you should always think about what to do
Action: the action to take, exactly one of [{tool_names}]
Action Input: the input to the action: a JSON object with a value for each argument
Observation: the result of the action
... (this Thought/Action/Action Input/Observation can repeat N times)
Thought: I now know the final answer
Final Answer: the final answer to the original input question

For example, a call of a tool:
Thought: I should use a tool.
{example}

Begin!

Question: {question}
Thought:{scratchpad}"""

#: Stop sequences for a ReAct completion: the model stops where the observation goes.
REACT_STOP = ("\nObservation:",)

_FROZEN = ConfigDict(frozen=True, extra="forbid")
_PLACEHOLDER = re.compile(r"\{(tools|tool_names|example|question|scratchpad)\}")
_REQUIRED = ("{tools}", "{question}", "{scratchpad}")


# -- results -------------------------------------------------------------------------------


class ReActAction(BaseModel):
    """The model asked for a tool: its registered ``tool`` name, the ``tool_input`` (a JSON
    object; plain text comes as ``{"input": text}``) and the ``thought`` before it.

    ``notes`` say what the parser ignored (a second action, a made-up observation...): add
    them to the observation so the model learns the format.
    """

    model_config = _FROZEN

    kind: Literal["action"] = "action"
    tool: str
    tool_input: dict[str, Any] = Field(default_factory=dict)
    thought: str = ""
    notes: list[str] = Field(default_factory=list)


class ReActFinalAnswer(BaseModel):
    """The model's final ``answer``, and the ``thought`` before it."""

    model_config = _FROZEN

    kind: Literal["final"] = "final"
    answer: str
    thought: str = ""
    notes: list[str] = Field(default_factory=list)


class ReActParseFailure(BaseModel):
    """Text the parser could not read as an action or an answer (a value, not an exception).

    ``message`` tells the model what was wrong and how to write it; send it back as the
    observation. ``text`` is the model's text (cut before a made-up observation).
    """

    model_config = _FROZEN

    kind: Literal["error"] = "error"
    message: str
    text: str
    thought: str = ""


class ReActStep(BaseModel):
    """One finished step of the scratchpad: what the model did and what it observed.

    A step of a valid action has ``tool`` and ``tool_input``; a step whose text could not be
    parsed keeps that ``text`` instead, and its observation is usually the parse message.
    """

    model_config = _FROZEN

    thought: str = ""
    tool: str | None = None
    tool_input: dict[str, Any] | None = None
    text: str | None = None
    observation: str

    @classmethod
    def of(cls, parsed: ReActAction | ReActParseFailure, observation: str | None = None) -> ReActStep:
        """The step for a parsed action and its tool's observation (with the action's notes
        appended), or for a parse failure (the observation defaults to its message)."""
        if isinstance(parsed, ReActAction):
            if observation is None:
                raise TypeError("ReActStep.of(action, observation): an action's step needs its observation")
            text = "\n".join([observation, *parsed.notes]) if parsed.notes else observation
            return cls(
                thought=parsed.thought, tool=parsed.tool, tool_input=parsed.tool_input, observation=text
            )
        if isinstance(parsed, ReActParseFailure):
            return cls(
                thought=parsed.thought,
                text=parsed.text,
                observation=parsed.message if observation is None else observation,
            )
        raise TypeError(
            f"a scratchpad step is an action or a parse failure, got {type(parsed).__qualname__}: "
            "a final answer ends the loop"
        )


# -- rendering -----------------------------------------------------------------------------


def _spec(t: ToolSpec | Tool | str) -> ToolSpec:
    if isinstance(t, ToolSpec):
        return t
    if isinstance(t, Tool):
        return t.spec
    if isinstance(t, str):
        return ToolSpec(name=t)
    raise TypeError(f"a tool is a ToolSpec, a Tool or a name, got {type(t).__qualname__}")


def render_react_scratchpad(steps: Sequence[ReActStep]) -> str:
    """The steps as the text after the prompt's last ``Thought:``, ending in ``Thought:`` again
    (empty for no steps). Actions are written in the canonical format whatever the model
    wrote, so the model sees the format it should follow."""
    out: list[str] = []
    for step in steps:
        if step.tool is not None:
            thought = f" {step.thought}" if step.thought else ""
            tool_input = json.dumps(step.tool_input or {}, ensure_ascii=False)
            out.append(f"{thought}\nAction: {step.tool}\nAction Input: {tool_input}")
        else:
            text = lex.strip_thought_label((step.text or "").strip())
            out.append(f" {text}" if text else "")
        out.append(f"\nObservation: {step.observation.strip()}\nThought:")
    return "".join(out)


def render_react_prompt(
    tools: Sequence[ToolSpec | Tool | str],
    question: str,
    steps: Sequence[ReActStep] = (),
    *,
    template: str = REACT_TEMPLATE,
) -> str:
    """The ReAct prompt: ``template`` with its placeholders (see :data:`REACT_TEMPLATE`)
    replaced by the ``tools``, the ``question`` and the ``steps`` so far."""
    missing = [p for p in _REQUIRED if p not in template]
    if missing:
        raise ValueError(f"the ReAct template lacks the placeholders {', '.join(missing)}")
    specs = [_spec(t) for t in tools]
    values = {
        "tools": "\n".join(tools_text.render_tool(s) for s in specs) if specs else "(no tools)",
        "tool_names": ", ".join(s.name for s in specs),
        "example": tools_text.example_call(specs) or "(no tools: write a Final Answer)",
        "question": question,
        "scratchpad": render_react_scratchpad(steps),
    }
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)


# -- parsing: what the labels mean (dflow_agents._react_lexer finds and reads them) --------

_CALL_FORM = re.compile(r"^([A-Za-z0-9_-]{1,64})\s*[\[(](.*)[\])]$", re.DOTALL)
_WORD = re.compile(r"^[A-Za-z0-9_-]{1,64}(?=\s|[(\[])")
_NO_ACTION = {"none", "n/a", "na", "null", "no action", "nothing", "-", ""}
_FINAL_ACTION = {"final answer", "final_answer", "finalanswer", "finish", "answer"}


def _available(names: Sequence[str]) -> str:
    return ", ".join(names) if names else "(none: there are no tools, write a Final Answer)"


def _format_help(names: Sequence[str]) -> str:
    return (
        "To use a tool, write:\nThought: <your reasoning>\nAction: <the tool's name, one of: "
        f"{_available(names)}>\nAction Input: <the input as a JSON object>\n"
        "To finish, write:\nThought: I now know the final answer\nFinal Answer: <your answer>"
    )


def _is_word(name: str, words: set[str], names: Sequence[str]) -> bool:
    """Whether ``name`` is one of ``words`` ("none", "final answer"...) and not a tool's name."""
    return name.lower() in words and not lex.matching(name, names)


def parse_react_output(
    text: str, tools: Sequence[ToolSpec | Tool | str]
) -> ReActAction | ReActFinalAnswer | ReActParseFailure:
    """Read a ReAct completion: an action, a final answer, or a failure to tell the model.

    ``tools`` are the registered tools (specs, tools or names). Tolerated: any
    capitalisation, a missing ``Thought:`` (the prompt ends with it; text before the first
    label is the thought), extra spaces, markdown (``**Action:**``, list and heading marks),
    numbered labels (``Action 1:``), a reply wrapped in a code fence, code fences around the
    input, text after a JSON input, an input over several lines, an input on the line after
    its label, quotes, backticks or brackets around the tool name, trailing words after it
    (``Action: search (the web)``), ``Action: tool[input]`` without an ``Action Input``,
    ``Action: Final Answer`` (its input is the answer) and ``Action: None`` next to a final
    answer.

    * A made-up ``Observation:`` after an action (and all after it) is cut off: the model
      must not invent tool results; the action gets a note saying so. A ``Question:`` after
      the reply is cut off too.
    * Several actions: the first is taken, with a note.
    * An action and a final answer: **whichever comes first wins**. An answer written after
      an action came before the action's observation, so it is ignored (with a note); an
      action after an answer is ignored.
    * Tool names match exactly, then case-insensitively, and nothing else (no prefixes or
      substrings): an unknown name is a failure listing the tools.
    * JSON input is read loosely (single quotes, trailing commas...); a JSON object that
      cannot be read is a failure, and so is the tool's schema sent back as the input
      (``{"a": {"type": "number", "description": ...}}``: what small models copy from a
      prompt), saying what to send instead. Plain text (up to the first blank line) or a quoted
      string becomes ``{"input": text}``; an empty input, ``None`` or ``{}`` is ``{}``.
    """
    specs = [_spec(t) for t in tools]
    names = [s.name for s in specs]
    body, segments, notes = _without_made_up_parts(lex.unwrapped(text))
    finals, actions = _finals_and_actions(segments, names)
    if not actions and not finals:
        return _no_labels(body, segments, names)
    if finals and (not actions or finals[0][1] < actions[0][1]):
        return _final(body, segments, finals[0])
    _, start, end, content = actions[0]
    notes += _ignored(len(actions), bool(finals))
    stop = min([g[1] for g in actions[1:] + finals] + [len(body)])
    raw_input = next((g[3] for g in segments if g[0] == "input" and end <= g[1] < stop), None)
    said = _Said(lex.thought(body, segments, start), notes, body.strip())
    return _action(content, raw_input, specs, said)


def _finals_and_actions(
    segments: list[lex.Segment], names: Sequence[str]
) -> tuple[list[lex.Segment], list[lex.Segment]]:
    """The ``Final Answer:`` labels and the ``Action:`` labels; "Action: None" or "Action:
    Final Answer" beside a "Final Answer:" is no action."""
    finals = [g for g in segments if g[0] == "final"]
    words = _NO_ACTION | _FINAL_ACTION
    actions = [
        g
        for g in segments
        if g[0] == "action" and not (finals and _is_word(lex.first_line(g[3]), words, names))
    ]
    return finals, actions


def _ignored(actions: int, finals: bool) -> list[str]:
    """The notes on what was left out beside the first action."""
    notes = []
    if actions > 1:
        notes.append(
            f"Note: you wrote {actions} actions; only the first was run. "
            "Write one Action at a time and wait for its Observation."
        )
    if finals:
        notes.append(
            "Note: your Final Answer was ignored because it came before this Observation; "
            "answer once you have read it."
        )
    return notes


def _without_made_up_parts(body: str) -> tuple[str, list[lex.Segment], list[str]]:
    """``body`` and its labels, cut before a made-up ``Observation:`` or ``Question:``; the
    notes saying what was cut."""
    segments = lex.segments(body)
    notes: list[str] = []
    cut = lex.cut_at(segments)
    if cut is not None:
        if segments[cut][0] == "observation":
            notes.append(
                "Note: you wrote your own Observation; it was ignored. Stop after the Action Input "
                "and wait for the real Observation."
            )
        body, segments = body[: segments[cut][1]], segments[:cut]
    return body.rstrip(), segments, notes


def _no_labels(body: str, segments: list[lex.Segment], names: Sequence[str]) -> ReActParseFailure:
    thought = lex.thought(body, segments, len(body))
    if any(g[0] == "input" for g in segments):
        problem = 'you wrote "Action Input:" without an "Action:" line naming the tool.'
    elif body.strip():
        problem = 'your reply has neither an "Action:" line nor a "Final Answer:" line.'
    else:
        problem = "your reply was empty."
    return ReActParseFailure(
        message=f"Invalid format: {problem}\n{_format_help(names)}", text=body.strip(), thought=thought
    )


def _final(
    body: str, segments: list[lex.Segment], final: lex.Segment
) -> ReActFinalAnswer | ReActParseFailure:
    _, start, _, content = final
    thought = lex.thought(body, segments, start)
    answer = lex.final_text(content)
    if not answer:
        return ReActParseFailure(
            message='Invalid format: your "Final Answer:" was empty. Write the answer after it.',
            text=body.strip(),
            thought=thought,
        )
    return ReActFinalAnswer(answer=answer, thought=thought)


class _Said:
    """What an action's reply said besides it: the thought, the notes, the whole text."""

    __slots__ = ("notes", "text", "thought")

    def __init__(self, thought: str, notes: list[str], text: str) -> None:
        self.thought, self.notes, self.text = thought, notes, text

    def failure(self, message: str) -> ReActParseFailure:
        return ReActParseFailure(message=message, text=self.text, thought=self.thought)


def _tool_named(name: str, raw_input: str | None, names: Sequence[str]) -> tuple[list[str], str | None]:
    """The tools ``name`` (an ``Action:`` line) means, and the input when the line holds it."""
    found = lex.matching(name, names)
    if not found and raw_input is None:
        call = _CALL_FORM.match(name)  # the ReAct paper's "Action: search[query]"
        if call and lex.matching(call.group(1), names):
            return lex.matching(call.group(1), names), call.group(2)
    if not found:
        word = _WORD.match(name)  # "Action: search (for the weather)": its leading word
        if word:
            found = lex.matching(word.group(), names)
    return found, raw_input


def _action(
    content: str, raw_input: str | None, specs: Sequence[ToolSpec], said: _Said
) -> ReActAction | ReActFinalAnswer | ReActParseFailure:
    names = [s.name for s in specs]
    lines = [line for line in content.strip().split("\n") if line.strip()]
    name = lex.clean_name(lines[0]) if lines else ""
    found, raw_input = _tool_named(name, raw_input, names)
    if raw_input is None and len(lines) > 1:
        raw_input = "\n".join(lines[1:])  # "Action: search\n{...}": the input without its label
    if not found:
        return _no_tool(name, raw_input, names, said)
    if len(found) > 1:
        return said.failure(
            f'Invalid action: "{name}" matches several tools that differ only in case '
            f"({', '.join(found)}). Write the tool's exact name."
        )
    spec = specs[names.index(found[0])]
    tool_input = lex.read_input(raw_input) if raw_input is not None else {}
    if isinstance(tool_input, str):
        return said.failure(
            f"Invalid action input for tool {spec.name}: {tool_input}. "
            f"Write the input as a JSON object, e.g. Action Input: {tools_text.example_input(spec)}."
        )
    if tools_text.is_schema_shaped(tool_input, spec):
        return said.failure(
            f"Invalid action input for tool {spec.name}: you sent the description of its arguments "
            "(their types and descriptions), not their values. Send a JSON object with a value for "
            f"each argument, e.g. Action Input: {tools_text.example_input(spec)} for "
            f"{tools_text.render_tool(spec).splitlines()[0]}"
        )
    return ReActAction(tool=spec.name, tool_input=tool_input, thought=said.thought, notes=said.notes)


def _no_tool(
    name: str, raw_input: str | None, names: Sequence[str], said: _Said
) -> ReActFinalAnswer | ReActParseFailure:
    """An ``Action:`` that names no tool: a final answer written as an action, or a failure."""
    if _is_word(name, _FINAL_ACTION, names):  # "Action: Final Answer" + the answer
        answer = lex.final_text(lex.unfenced(raw_input or ""))
        decoded = _loose_json.decode_at(answer, 0) if answer[:1] in ("'", '"') else None
        if decoded is not None and isinstance(decoded[0], str):
            answer = decoded[0]
        if answer:
            return ReActFinalAnswer(answer=answer, thought=said.thought, notes=said.notes)
        return said.failure('Invalid format: to finish, write "Final Answer: <your answer>".')
    if _is_word(name, _NO_ACTION, names):
        return said.failure(
            f'Invalid format: "Action:" must name a tool (one of: {_available(names)}); '
            'if you know the answer, write "Final Answer: <your answer>" instead.'
        )
    shown = name if len(name) <= 80 else name[:77] + "..."
    return said.failure(
        f'Invalid action: there is no tool named "{shown}". Available tools: {_available(names)}. '
        'Write one of these names exactly after "Action:", or finish with "Final Answer: <your answer>".'
    )
