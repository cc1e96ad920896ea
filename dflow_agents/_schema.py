"""Turning pydantic's JSON schema into what model servers accept.

``clean_schema`` inlines ``$ref``s (servers differ in ``$defs`` support; recursive models
keep theirs) and drops the ``title`` noise. ``strict_schema`` applies OpenAI's strict-mode
rules: every object closed and fully required, optional fields nullable, no defaults.
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["clean_schema", "strict_schema"]

_DATA_KEYS = {"default", "enum", "const", "examples", "example"}
_MAP_KEYS = {"properties", "patternProperties", "$defs", "definitions"}


def clean_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with its references inlined and its titles dropped."""
    schema = dict(schema)
    defs: dict[str, Any] = schema.pop("$defs", {})
    kept: set[str] = set()
    out: dict[str, Any] = _clean(schema, defs, (), kept)
    if kept:  # recursive models: keep the definitions they refer to
        out["$defs"] = {name: _clean(defs[name], defs, (name,), kept) for name in sorted(kept)}
    return out


def _clean(node: Any, defs: dict[str, Any], stack: tuple[str, ...], kept: set[str]) -> Any:
    if isinstance(node, list):
        return [_clean(x, defs, stack, kept) for x in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        name = ref.rsplit("/", 1)[1]
        siblings = {k: _clean(v, defs, stack, kept) for k, v in node.items() if k not in ("$ref", "title")}
        if name in stack:
            kept.add(name)
            return {"$ref": ref, **siblings}
        return {**_clean(defs[name], defs, (*stack, name), kept), **siblings}
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "title":
            continue
        if key in _DATA_KEYS:
            out[key] = copy.deepcopy(value)
        elif key in _MAP_KEYS and isinstance(value, dict):
            out[key] = {name: _clean(sub, defs, stack, kept) for name, sub in value.items()}
        else:
            out[key] = _clean(value, defs, stack, kept)
    return out


def strict_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` under OpenAI's strict-mode rules (input already cleaned)."""
    result = _strict(schema)
    assert isinstance(result, dict)
    return result


def _nullable(node: dict[str, Any]) -> dict[str, Any]:
    variants = node.get("anyOf")
    if node.get("type") == "null" or (
        isinstance(variants, list) and any(isinstance(v, dict) and v.get("type") == "null" for v in variants)
    ):
        return node
    described = {k: node[k] for k in ("description",) if k in node}
    inner = {k: v for k, v in node.items() if k != "description"}
    return {"anyOf": [inner, {"type": "null"}], **described}


def _strict(node: Any) -> Any:
    if isinstance(node, list):
        return [_strict(x) for x in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "default":
            continue
        if key in _DATA_KEYS:
            out[key] = value
        elif key in _MAP_KEYS and isinstance(value, dict):
            out[key] = {name: _strict(sub) for name, sub in value.items()}
        else:
            out[key] = _strict(value)
    if "properties" in out:  # a free-form dict (additionalProperties only) stays as it is
        props: dict[str, Any] = out.get("properties", {})
        required = set(node.get("required", ()))
        out["properties"] = {name: sub if name in required else _nullable(sub) for name, sub in props.items()}
        out["required"] = list(props)
        out["additionalProperties"] = False
    return out
