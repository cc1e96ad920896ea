"""What an MCP tool call's result becomes: the text the model reads and the data a step keeps.

A result's content blocks may be anything a server sends: text (of any size), images, audio,
links to resources, embedded text or binary resources, structured content. The model reads
the text blocks (cut at a cap, saying how much was cut) and a one-line note for each binary
block; the step keeps the same, with binary data replaced by its type and size, so a server
that sends megabytes of image does not put them in the store.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

import mcp.types as mt

__all__ = ["cut", "observation_of"]


def cut(text: str, limit: int) -> str:
    """``text`` within ``limit`` characters, saying how many were left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n[... {len(text) - limit} more characters cut]"


def _size(data: str) -> int:
    """The number of bytes a base64 text decodes to (an estimate if it is not base64)."""
    try:
        return len(base64.b64decode(data, validate=True))
    except (binascii.Error, ValueError):
        return len(data) * 3 // 4


def _block(block: Any) -> tuple[str, dict[str, Any]]:
    """The text the model reads for one content block, and the data the step keeps."""
    if isinstance(block, mt.TextContent):
        return block.text, {"type": "text", "text": block.text}
    if isinstance(block, (mt.ImageContent, mt.AudioContent)):
        size = _size(block.data)
        return f"[{block.type} {block.mime_type}, {size} bytes]", {
            "type": block.type,
            "mime_type": block.mime_type,
            "bytes": size,
        }
    if isinstance(block, mt.ResourceLink):
        return f"[resource {block.uri}" + (f" ({block.mime_type})]" if block.mime_type else "]"), {
            "type": "resource_link",
            "uri": str(block.uri),
            "mime_type": block.mime_type,
        }
    if isinstance(block, mt.EmbeddedResource):
        res = block.resource
        if isinstance(res, mt.TextResourceContents):
            return res.text, {"type": "resource", "uri": str(res.uri), "text": res.text}
        size = _size(res.blob)
        note = f"[binary resource {res.uri} ({res.mime_type or 'unknown type'}), {size} bytes]"
        return note, {"type": "resource", "uri": str(res.uri), "mime_type": res.mime_type, "bytes": size}
    kind = str(getattr(block, "type", type(block).__name__))
    return f"[{kind} content]", {"type": kind}


def observation_of(result: mt.CallToolResult, limit: int) -> tuple[str, Any]:
    """The model's text for a result (every block's, cut at ``limit`` characters in all) and
    the data the step keeps: the structured content when the server gave one, else the
    blocks (their text cut alike, binary data left out)."""
    texts: list[str] = []
    kept: list[dict[str, Any]] = []
    for block in result.content:
        text, data = _block(block)
        texts.append(text)
        if "text" in data:
            data["text"] = cut(data["text"], limit)
        kept.append(data)
    if not texts and result.structured_content is not None:
        texts.append(json.dumps(result.structured_content, ensure_ascii=False, default=str))
    observation = cut("\n".join(texts), limit) if texts else "(the tool returned nothing)"
    if result.structured_content is not None:
        shown = json.dumps(result.structured_content, ensure_ascii=False, default=str)
        if len(shown) <= limit:
            return observation, result.structured_content
    if len(kept) == 1 and kept[0]["type"] == "text":
        return observation, kept[0]["text"]
    return observation, kept
