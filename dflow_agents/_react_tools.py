"""How a ReAct prompt shows tools to a text model, and how to tell a tool's schema sent back.

Small models copy what they see: shown a full JSON schema, Qwen2.5-0.5B sent the schema
itself as its ``Action Input`` in 4 of 4 runs. So a tool is shown as a signature,
``multiply(a: number, b: number): Multiply two numbers.``, each argument's description on a
line of its own, and the prompt gives one example call with values (:func:`example_call`).
An input shaped like the schema (:func:`is_schema_shaped`) is answered with what to send.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from .messages import ToolSpec

__all__ = ["example_call", "example_input", "is_schema_shaped", "render_tool", "type_text"]

#: words of JSON Schema: an argument's value made only of these is its description
_SCHEMA_WORDS = frozenset(
    {
        "type",
        "description",
        "title",
        "default",
        "enum",
        "items",
        "properties",
        "required",
        "minimum",
        "maximum",
        "format",
        "examples",
        "anyOf",
        "oneOf",
        "additionalProperties",
    }
)
_SAMPLES: dict[str, Any] = {
    "string": "text",
    "integer": 1,
    "number": 1.5,
    "boolean": True,
    "array": [],
    "object": {},
}


def _properties(spec: ToolSpec) -> dict[str, Any]:
    props = spec.parameters.get("properties")
    return props if isinstance(props, dict) else {}


def _required(spec: ToolSpec) -> list[str]:
    req = spec.parameters.get("required")
    return [r for r in req if isinstance(r, str)] if isinstance(req, list) else []


def _types(schema: Mapping[str, Any]) -> list[str]:
    """The JSON types ``schema`` allows (``[]``: any)."""
    kind = schema.get("type")
    if isinstance(kind, str):
        return [kind]
    if isinstance(kind, list):
        return [k for k in kind if isinstance(k, str)]
    found: list[str] = []
    for part in schema.get("anyOf") or schema.get("oneOf") or ():
        if isinstance(part, dict):
            found += [t for t in _types(part) if t not in found]
    return found


def type_text(schema: Mapping[str, Any]) -> str:
    """A short name of the type ``schema`` describes: ``number``, ``array of string``,
    ``"a" or "b"``, ``string or null``, ``any``."""
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return " or ".join(json.dumps(v, ensure_ascii=False) for v in enum)
    kinds = _types(schema)
    items = schema.get("items")
    if kinds == ["array"] and isinstance(items, dict) and _types(items):
        return f"array of {type_text(items)}"
    return " or ".join(kinds) if kinds else "any"


def render_tool(spec: ToolSpec) -> str:
    """``name(arg: type, ...): description``, then each argument's description indented."""
    props, required = _properties(spec), set(_required(spec))
    args = []
    for name, schema in props.items():
        schema = schema if isinstance(schema, dict) else {}
        arg = f"{name}: {type_text(schema)}"
        if name not in required:
            shown = json.dumps(schema.get("default"), ensure_ascii=False)
            arg += f" = {shown}" if "default" in schema else " (optional)"
        args.append(arg)
    description = " ".join(spec.description.split())
    head = f"{spec.name}({', '.join(args)})" + (f": {description}" if description else "")
    lines = [head]
    for name, schema in props.items():
        said = schema.get("description") if isinstance(schema, dict) else None
        if isinstance(said, str) and said.strip():
            lines.append(f"    {name}: {' '.join(said.split())}")
    return "\n".join(lines)


def _sample(schema: Mapping[str, Any]) -> Any:
    if "default" in schema:
        return schema["default"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[0]
    kinds = [k for k in _types(schema) if k != "null"]
    return _SAMPLES.get(kinds[0], "text") if kinds else "text"


def example_input(spec: ToolSpec) -> str:
    """An input for ``spec`` with a value of the right type for each required argument
    (each argument when none is required), as JSON."""
    props = _properties(spec)
    names = [n for n in _required(spec) if n in props] or list(props)
    values = {n: _sample(props[n] if isinstance(props[n], dict) else {}) for n in names}
    return json.dumps(values, ensure_ascii=False)


def example_call(specs: Sequence[ToolSpec]) -> str:
    """The lines of an example call of the first tool (``""`` without tools)."""
    if not specs:
        return ""
    return f"Action: {specs[0].name}\nAction Input: {example_input(specs[0])}"


def _takes_objects(schema: Any) -> bool:
    """Whether an argument of ``schema`` may legitimately be a JSON object."""
    if not isinstance(schema, dict):
        return True
    kinds = _types(schema)
    return not kinds or "object" in kinds


def is_schema_shaped(tool_input: Mapping[str, Any], spec: ToolSpec) -> bool:
    """Whether ``tool_input`` is ``spec``'s schema (or its arguments' descriptions) sent
    back instead of values: ``{"a": {"description": "the first number.", "type": "number"}}``."""
    if not tool_input:
        return False
    if tool_input.get("type") == "object" and isinstance(tool_input.get("properties"), dict):
        return True
    props = _properties(spec)
    for name, value in tool_input.items():
        if name not in props or _takes_objects(props[name]):
            return False
        if not isinstance(value, dict) or not value or not set(value) <= _SCHEMA_WORDS:
            return False
        if not {"type", "description"} & set(value):
            return False
    return True
