"""File tools: read, write and list files under one root directory, and nowhere else.

``file_tools("/srv/work")`` gives ``read_file``, ``write_file`` and ``list_files`` (and only
``read_file`` and ``list_files`` with ``read_only=True``). A path the model gives is taken
relative to the root; it is resolved (``..``, symbolic links) and refused when it lands
outside the root. The file itself is then opened without following a link (``O_NOFOLLOW``,
relative to its checked directory), so a link swapped in after the check is refused too.
Reads are cut at ``max_read_chars`` (saying how much was left), a file that is not text is
described, not read; writes larger than ``max_write_bytes`` are refused whole.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

from pydantic import Field

from .tools import Tool

__all__ = ["file_tools"]

_LISTED = 200


class _Root:
    """The directory the tools may touch, and their bounds (a plain object: it pickles)."""

    def __init__(self, root: Path, max_read_chars: int, max_write_bytes: int) -> None:
        self.root = root
        self.max_read_chars = max_read_chars
        self.max_write_bytes = max_write_bytes

    def inside(self, path: str) -> Path:
        """``path`` resolved under the root (what exists of it: links followed);
        ``PermissionError`` when it is outside."""
        if "\x00" in path:
            raise ValueError("a path cannot hold a NUL character")
        resolved = (self.root / path).resolve()
        if resolved != self.root and self.root not in resolved.parents:
            raise PermissionError(
                f"{path!r} is outside the directory these tools may use; give a path relative to it"
            )
        return resolved

    @contextlib.contextmanager
    def opened(self, target: Path, flags: int) -> Iterator[int]:
        """A descriptor of ``target`` (inside the root), opened relative to its directory and
        without following a link at the last step."""
        directory = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fd = os.open(target.name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=directory)
        except OSError as exc:
            if exc.errno == 40:  # ELOOP: a link where a file was checked
                raise PermissionError(f"{target.name!r} is a symbolic link: not followed") from None
            raise
        finally:
            os.close(directory)
        try:
            yield fd
        finally:
            os.close(fd)

    def shown(self, path: Path) -> str:
        return str(path.relative_to(self.root)) or "."


class _Read:
    def __init__(self, root: _Root) -> None:
        self.root = root

    def __call__(
        self,
        path: Annotated[str, Field(description="the file, relative to the working directory")],
        offset: Annotated[int, Field(ge=0, description="the character to start at (to read on)")] = 0,
    ) -> str:
        root = self.root
        target = root.inside(path)
        if not target.is_file():
            raise IsADirectoryError(f"{path!r} is not a file") if target.is_dir() else FileNotFoundError(path)
        limit = root.max_read_chars
        with root.opened(target, os.O_RDONLY) as fd:
            size = os.fstat(fd).st_size
            raw = os.read(fd, min(size, (offset + limit) * 4 + 4))
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            if exc.start < len(raw) - 4:
                return f"[{root.shown(target)} is not UTF-8 text: {size} bytes]"
            text = raw[: exc.start].decode("utf-8")
        if "\x00" in text[:4096]:
            return f"[{root.shown(target)} is a binary file: {size} bytes]"
        part = text[offset : offset + limit]
        rest = size - len(text[: offset + len(part)].encode())
        if rest > 0:
            return f"{part}\n[... about {rest} more bytes: read on with offset={offset + len(part)}]"
        return part


class _Write:
    def __init__(self, root: _Root) -> None:
        self.root = root

    def __call__(
        self,
        path: Annotated[str, Field(description="the file, relative to the working directory")],
        content: Annotated[str, Field(description="the text to write")],
        append: Annotated[bool, Field(description="add to the end instead of replacing")] = False,
    ) -> str:
        root = self.root
        data = content.encode("utf-8")
        if len(data) > root.max_write_bytes:
            raise ValueError(f"{len(data)} bytes is more than the {root.max_write_bytes} a write may take")
        target = root.inside(path)
        if target == root.root or target.is_dir():
            raise IsADirectoryError(f"{path!r} is a directory")
        target.parent.mkdir(parents=True, exist_ok=True)
        root.inside(str(target.parent.relative_to(root.root)))  # made: check again, links resolved
        flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
        with root.opened(target, flags) as fd:
            written = os.write(fd, data)
        return f"{'appended' if append else 'wrote'} {written} bytes to {root.shown(target)}"


class _List:
    def __init__(self, root: _Root) -> None:
        self.root = root

    def __call__(
        self, path: Annotated[str, Field(description="the directory, relative to the working one")] = "."
    ) -> str:
        root = self.root
        target = root.inside(path)
        if not target.is_dir():
            raise NotADirectoryError(f"{path!r} is not a directory")
        entries = sorted(os.scandir(target), key=lambda e: e.name)
        lines = []
        for entry in entries[:_LISTED]:
            if entry.is_symlink():
                lines.append(f"{entry.name} -> (link)")
            elif entry.is_dir():
                lines.append(f"{entry.name}/")
            else:
                lines.append(f"{entry.name} ({entry.stat().st_size} bytes)")
        if len(entries) > _LISTED:
            lines.append(f"[... {len(entries) - _LISTED} more entries]")
        return "\n".join(lines) or "(empty)"


def file_tools(
    root: str | os.PathLike[str],
    *,
    read_only: bool = False,
    max_read_chars: int = 20_000,
    max_write_bytes: int = 1_000_000,
    prefix: str = "",
) -> list[Tool]:
    """``read_file``, ``write_file`` (unless ``read_only``) and ``list_files`` under ``root``
    (see the module). ``prefix`` goes before each tool's name."""
    where = Path(root).resolve()
    if not where.is_dir():
        raise ValueError(f"root {str(root)!r} is not a directory")
    for what, value in [("max_read_chars", max_read_chars), ("max_write_bytes", max_write_bytes)]:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{what} must be a whole number >= 1, got {value!r}")
    bounds = _Root(where, max_read_chars, max_write_bytes)
    tools = [
        Tool(
            _Read(bounds),
            name=f"{prefix}read_file",
            description=f"Read a text file of the working directory (at most {max_read_chars} characters a call).",
        ),
        Tool(
            _List(bounds),
            name=f"{prefix}list_files",
            description="List a directory of the working directory.",
        ),
    ]
    if not read_only:
        tools.insert(
            1,
            Tool(
                _Write(bounds),
                name=f"{prefix}write_file",
                description=(
                    f"Write (or append) text to a file of the working directory, making its folders; "
                    f"at most {max_write_bytes} bytes."
                ),
            ),
        )
    return tools
