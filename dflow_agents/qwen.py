"""The Qwen2.5 raw tool-call format: a prompt renderer and a tolerant completion parser.

For models served without native tool calls (a raw ``/completions`` endpoint), the tools are
written into a ChatML prompt and the model answers with
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``. Small models break that format
in many ways; :func:`parse_qwen_completion` recovers the calls from all the shapes listed in
its docstring and leaves text that merely mentions JSON alone.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator, Sequence
from typing import Any

from . import _loose_json
from .messages import ChatMessage, ChatResponse, ToolCall, ToolSpec

__all__ = [
    "QWEN_DEFAULT_SYSTEM",
    "QWEN_STOP",
    "calls_as_text",
    "parse_qwen_completion",
    "read_text_tool_calls",
    "render_qwen_prompt",
    "tool_responses_text",
]

#: The system prompt Qwen2.5 uses when the conversation has none.
QWEN_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
#: Stop sequences for a raw completion of a rendered prompt.
QWEN_STOP = ("<|im_end|>", "<|endoftext|>")

_TOOLS_INTRO = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_TOOLS_OUTRO = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def render_qwen_prompt(
    messages: Sequence[ChatMessage],
    tools: Sequence[ToolSpec] | None = None,
    *,
    default_system: str | None = QWEN_DEFAULT_SYSTEM,
    add_generation_prompt: bool = True,
    tool_choice: str | None = None,
) -> str:
    """Render a conversation as a Qwen2.5 ChatML prompt, ending with an open assistant turn.

    The first system message (or ``default_system``) opens the prompt; with tools, the tool
    list and the ``<tool_call>`` instruction follow it in the same system turn. Assistant tool
    calls are written back as ``<tool_call>`` blocks, and consecutive tool results share one
    user turn, each wrapped in ``<tool_response>``.

    ``tool_choice``: ``None`` or ``"auto"`` lists the tools; ``"none"`` lists none;
    ``"required"`` adds that the model must call one; a tool's name lists that tool only and
    says to call it (``ValueError`` for a name not among ``tools``).
    """
    msgs = list(messages)
    system = default_system
    if msgs and msgs[0].role == "system":
        system, msgs = msgs[0].content, msgs[1:]
    shown, must = _chosen(tools or (), tool_choice)
    out = [_system_turn(system, shown, must)]
    for is_tool, group in itertools.groupby(msgs, key=lambda m: m.role == "tool"):
        if is_tool:  # the results of one reply's calls: one user turn
            out.append(f"<|im_start|>user\n{tool_responses_text([m.content for m in group])}<|im_end|>\n")
        else:
            out += [
                f"<|im_start|>{m.role}\n{calls_as_text(m.content, m.tool_calls)}<|im_end|>\n" for m in group
            ]
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
    return "".join(out)


def _chosen(tools: Sequence[ToolSpec], choice: str | None) -> tuple[list[ToolSpec], str]:
    """The tools to list for ``choice``, and the sentence telling the model to call."""
    if not tools or choice in (None, "auto"):
        return list(tools), ""
    if choice == "none":
        return [], ""
    if choice == "required":
        return list(tools), "\n\nYou must call one or more of these functions in this reply."
    named = [t for t in tools if t.name == choice]
    if not named:
        offered = ", ".join(t.name for t in tools)
        raise ValueError(f"tool_choice {choice!r} names no tool offered ({offered})")
    return named, f"\n\nYou must call the function {choice} in this reply."


def _system_turn(system: str | None, tools: Sequence[ToolSpec], must: str) -> str:
    """The system turn: the system prompt, then the tools and how to call them."""
    if tools:
        listing = "".join("\n" + json.dumps(t.to_openai(), ensure_ascii=False) for t in tools)
        head = f"{system}\n\n" if system is not None else ""
        return f"<|im_start|>system\n{head}{_TOOLS_INTRO}{listing}{_TOOLS_OUTRO}{must}<|im_end|>\n"
    return f"<|im_start|>system\n{system}<|im_end|>\n" if system is not None else ""


def calls_as_text(content: str, calls: Sequence[ToolCall]) -> str:
    """``content`` then each of ``calls`` as a ``<tool_call>`` block, one a line: a reply
    with tool calls as a model without native calls writes it."""
    parts = [content] if content else []
    for c in calls:
        name = json.dumps(c.name, ensure_ascii=False)
        args = json.dumps(c.arguments, ensure_ascii=False)
        parts.append(f'<tool_call>\n{{"name": {name}, "arguments": {args}}}\n</tool_call>')
    return "\n".join(parts)


def tool_responses_text(results: Sequence[str]) -> str:
    """Tool results as ``<tool_response>`` blocks, in call order: the user turn that answers
    a reply of ``<tool_call>`` blocks."""
    return "\n".join(f"<tool_response>\n{r}\n</tool_response>" for r in results)


_OPEN = re.compile(r"<\s*tool_call\s*>", re.IGNORECASE)
_CLOSE = re.compile(r"<\s*/\s*tool_call\s*>", re.IGNORECASE)
_END = re.compile(r"<\|(?:im_end|endoftext)\|>")
_FENCE_OPEN_AT_END = re.compile(r"```[\w+-]*\s*$")
_NAME = re.compile(r"""["']name["']\s*:\s*["']([^"'\s]+)["']""")
_BRACKET = re.compile(r"[{\[]")
_MAX_FAILURES = 256
_FENCED = re.compile(r"^```[\w+-]*[ \t]*\n?(.*?)\n?```$", re.DOTALL)


def parse_qwen_completion(text: str, *, id_prefix: str = "call_") -> ChatResponse:
    """Split a raw completion into its text content and its tool calls.

    Recovered shapes: one or several ``<tool_call>`` blocks, an unclosed ``<tool_call>``, a
    JSON array of calls, calls in code fences, prose before or after the call, single-quoted
    pseudo-JSON, ``arguments`` given as a JSON string (or as ``parameters``), OpenAI-style
    ``{"function": {...}}`` wrappers, and a bare call object without tags. A tagged call whose
    JSON is broken still yields a call (name recovered, ``raw_arguments`` set) so the agent
    can tell the model. Untagged JSON counts as a call only if it has a ``name`` and
    ``arguments``; any other text stays text.

    The content is the text before the first call (stripped); the calls get the ids
    ``{id_prefix}0``, ``{id_prefix}1``, ... in order.
    """
    end = _END.search(text)
    text = (text[: end.start()] if end else text).strip()
    found = _tagged(text) or _bare(text)
    if found is None:
        return ChatResponse(content=text)
    start, raw_calls = found
    content = _FENCE_OPEN_AT_END.sub("", text[:start].rstrip()).strip()
    calls = [
        ToolCall(id=f"{id_prefix}{n}", name=name, arguments=args, raw_arguments=raw)
        for n, (name, args, raw) in enumerate(raw_calls)
    ]
    return ChatResponse(content=content, tool_calls=calls)


def read_text_tool_calls(
    response: ChatResponse, tools: Sequence[ToolSpec | str], *, id_prefix: str = "call_"
) -> ChatResponse:
    """``response`` with the tool calls its text holds, when it has no native ones.

    Servers without a tool-call parser (llama.cpp's default chat format, many Ollama and
    vLLM set-ups) return a call in the content: ``{"name": "multiply", "arguments": {...}}``,
    the same in a code fence, a list of them, or ``<tool_call>`` tags. This reads them with
    :func:`parse_qwen_completion`, with care for text that is an answer:

    * calls in ``<tool_call>`` tags always count, whatever tool they name (a name not among
      ``tools`` goes back to the model as an unknown tool, as a native call would);
    * untagged JSON counts when it is a call object (a ``name`` and ``arguments``, or an
      OpenAI ``{"function": ...}`` wrapper) or a list of them, and every call names one of
      ``tools``; a call of another name counts only when the text is nothing but calls
      (code fences and spaces aside), as a model that meant a call writes it;
    * any other JSON (``{"name": "Ann", "age": 3}``, an object naming no tool inside prose)
      stays the answer.

    The content becomes the text before the first call and ``calls_from_text`` is set; a
    response that has native calls, or no call in its text, comes back unchanged.
    """
    text = response.content
    if response.tool_calls or not text.strip():
        return response
    parsed = parse_qwen_completion(text, id_prefix=id_prefix)
    if not parsed.tool_calls:
        return response
    names = {t.name if isinstance(t, ToolSpec) else t for t in tools}
    offered = all(c.name in names for c in parsed.tool_calls)
    if not (offered or _OPEN.search(text) is not None or _only_calls(text)):
        return response
    return response.model_copy(
        update={"content": parsed.content, "tool_calls": parsed.tool_calls, "calls_from_text": True}
    )


def _only_calls(text: str) -> bool:
    """Whether ``text`` is one call object or a list of them and nothing else (a code fence
    around it aside)."""
    body = _FENCED.sub(r"\1", text.strip()).strip()
    try:
        value = _loose_json.loads(body)
    except ValueError:
        return False
    return bool(_calls_in(value, need_arguments=True))


_Call = tuple[str, dict[str, Any], str | None]


def _tagged(text: str) -> tuple[int, list[_Call]] | None:
    first = _OPEN.search(text)
    if first is None:
        return None
    calls: list[_Call] = []
    for segment in _OPEN.split(text[first.end() :]):
        close = _CLOSE.search(segment)
        body = segment[: close.start()] if close else segment
        found = [c for _, value in _values(body) for c in _calls_in(value, need_arguments=False)]
        if not found:
            found = _repaired(body)
        calls.extend(found)
    return (first.start(), calls) if calls else None


def _bare(text: str) -> tuple[int, list[_Call]] | None:
    start: int | None = None
    calls: list[_Call] = []
    for at, value in _values(text):
        found = _calls_in(value, need_arguments=True)
        if found:
            start = at if start is None else start
            calls.extend(found)
    return (start, calls) if start is not None else None


def _values(text: str) -> Iterator[tuple[int, Any]]:
    """Every JSON value in ``text`` that may hold a call, with where it starts, in order.

    A decoded value is skipped whole (an object inside data is not a call); only values that
    start before the last ``name`` can hold one; and the scan gives up after
    ``_MAX_FAILURES`` brackets that start nothing, so pathological text stays cheap.
    """
    last_name = text.rfind("name")
    pos, failures = 0, 0
    while failures < _MAX_FAILURES:
        m = _BRACKET.search(text, pos)
        if m is None or m.start() > last_name:
            return
        decoded = _loose_json.decode_at(text, m.start())
        if decoded is None:
            failures += 1
            pos = m.start() + 1
            continue
        value, pos = decoded
        yield m.start(), value


def _calls_in(value: Any, *, need_arguments: bool) -> list[_Call]:
    """The calls a decoded value holds: a call object, a list of them, or a wrapper."""
    if isinstance(value, list):
        calls = [_call(v, need_arguments) for v in value]
        if not calls or any(c is None for c in calls):
            return [] if need_arguments else [c for c in calls if c is not None]
        return [c for c in calls if c is not None]
    if isinstance(value, dict) and isinstance(value.get("tool_calls"), list):
        return _calls_in(value["tool_calls"], need_arguments=need_arguments)
    call = _call(value, need_arguments)
    return [call] if call else []


def _call(value: Any, need_arguments: bool) -> _Call | None:
    if not isinstance(value, dict):
        return None
    if isinstance(value.get("function"), dict):
        value = value["function"]
    name = value.get("name")
    if not isinstance(name, str) or not name.strip():
        return None
    key = "arguments" if "arguments" in value else "parameters" if "parameters" in value else None
    if key is None and need_arguments:
        return None
    args, raw = _arguments(value.get(key) if key else None)
    return name.strip(), args, raw


def _arguments(value: Any) -> tuple[dict[str, Any], str | None]:
    """Arguments as a dict, or ``({}, raw text)`` when they are not a JSON object."""
    if value is None:
        return {}, None
    if isinstance(value, dict):
        return value, None
    if isinstance(value, str):
        if not value.strip():
            return {}, None
        try:
            decoded = _loose_json.loads(value)
        except ValueError:
            return {}, value
        return (decoded, None) if isinstance(decoded, dict) else ({}, value)
    return {}, json.dumps(value, ensure_ascii=False)


def _repaired(body: str) -> list[_Call]:
    """A broken tagged call: add the closing brackets a truncated call lacks; else keep its
    name and its text (``raw_arguments``), so the agent can tell the model what it sent."""
    text = body.strip()
    m = _BRACKET.search(text)
    if m is not None:
        for closing in ("}", "}}", "}}}", "]", "}]", "}}]"):
            decoded = _loose_json.decode_at(text + closing, m.start())
            if decoded is not None and decoded[1] == len(text) + len(closing):
                found = _calls_in(decoded[0], need_arguments=False)
                if found:
                    return found
    name = _NAME.search(text)
    return [(name.group(1), {}, text)] if name else []
