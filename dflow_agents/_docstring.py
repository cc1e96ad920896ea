"""Reading a tool's description and argument descriptions from its docstring."""

from __future__ import annotations

import inspect
import re

__all__ = ["parse_docstring"]

_ARGS_HEADER = re.compile(r"^(\s*)(Args|Arguments|Parameters|Params|Keyword Args|Keyword Arguments)\s*:\s*$")
_SECTION = re.compile(r"^\s*[A-Z][A-Za-z ]*:\s*$")
_ENTRY = re.compile(r"^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_SPHINX = re.compile(r"^:param\s+(?:[^:]*\s)?(\w+)\s*:\s*(.*)$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """The first paragraph (lines joined by spaces) and the per-argument descriptions.

    Arguments come from a Google-style ``Args:`` section (continuation lines indented further
    are joined) or from Sphinx ``:param name:`` lines.
    """
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    summary: list[str] = []
    for line in lines:
        if not line.strip() or _SECTION.match(line) or _SPHINX.match(line.strip()):
            break
        summary.append(line.strip())
    return " ".join(summary), _arguments(lines)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _arguments(lines: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    current: str | None = None
    header_indent: int | None = None
    entry_indent: int | None = None
    for line in lines:
        stripped = line.strip()
        sphinx = _SPHINX.match(stripped)
        if sphinx:
            name: str = sphinx.group(1)
            current, header_indent = name, None
            out[name] = sphinx.group(2).strip()
            continue
        header = _ARGS_HEADER.match(line)
        if header:
            header_indent, entry_indent, current = len(header.group(1)), None, None
            continue
        if header_indent is None:
            if current and stripped and not _SECTION.match(line):  # a Sphinx continuation
                out[current] = f"{out[current]} {stripped}".strip()
            else:
                current = None
            continue
        if not stripped:
            continue
        indent = _indent(line)
        if indent <= header_indent:  # the section ended
            header_indent, current = None, None
            continue
        entry = _ENTRY.match(stripped)
        if entry and (entry_indent is None or indent <= entry_indent):
            entry_indent = indent
            entry_name: str = entry.group(1)
            current = entry_name
            out[entry_name] = entry.group(2).strip()
        elif current is not None:
            out[current] = f"{out[current]} {stripped}".strip()
    return out
