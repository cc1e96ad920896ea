"""A forgiving JSON reader for what language models write.

Besides JSON it reads single-quoted strings, unquoted keys, ``True``/``False``/``None``,
trailing commas, raw newlines inside strings and unknown escapes (kept as written). It never
reads a bare word as a value, so prose does not turn into data.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["decode_at", "loads"]

_STRICT = json.JSONDecoder(strict=False)
_NUMBER = re.compile(r"-?(?:\d+)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_WORD = re.compile(r"[A-Za-z_$][\w$-]*")
_CONSTANTS: dict[str, Any] = {
    "true": True,
    "false": False,
    "null": None,
    "True": True,
    "False": False,
    "None": None,
}
_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "b": "\b", "f": "\f", "/": "/", "\\": "\\", '"': '"', "'": "'"}
_MAX_DEPTH = 200


class _Fail(Exception):
    pass


def decode_at(text: str, pos: int) -> tuple[Any, int] | None:
    """The value (an object or array) that starts at ``text[pos]`` and where it ends, or None."""
    try:
        return _STRICT.raw_decode(text, pos)
    except (ValueError, RecursionError):
        pass
    try:
        return _Reader(text).value(pos, 0)
    except (_Fail, IndexError):
        return None


def loads(text: str) -> Any:
    """The whole of ``text`` (surrounding whitespace aside) as a value; ``ValueError`` if it is not one."""
    s = text.strip()
    try:
        return json.loads(s, strict=False)
    except (ValueError, RecursionError):
        pass
    try:
        value, end = _Reader(s).value(0, 0)
    except (_Fail, IndexError):
        raise ValueError("not a JSON value") from None
    if end != len(s):
        raise ValueError("text after the JSON value")
    return value


class _Reader:
    def __init__(self, text: str) -> None:
        self.s = text

    def ws(self, i: int) -> int:
        s = self.s
        while i < len(s) and s[i] in " \t\r\n":
            i += 1
        return i

    def value(self, i: int, depth: int) -> tuple[Any, int]:
        if depth > _MAX_DEPTH:
            raise _Fail
        i = self.ws(i)
        c = self.s[i]
        if c == "{":
            return self.obj(i + 1, depth + 1)
        if c == "[":
            return self.arr(i + 1, depth + 1)
        if c in "\"'":
            return self.string(i)
        m = _NUMBER.match(self.s, i)
        if m:
            t = m.group()
            return (float(t) if any(x in t for x in ".eE") else int(t)), m.end()
        m = _WORD.match(self.s, i)
        if m and m.group() in _CONSTANTS:
            return _CONSTANTS[m.group()], m.end()
        raise _Fail

    def obj(self, i: int, depth: int) -> tuple[dict[str, Any], int]:
        out: dict[str, Any] = {}
        while True:
            i = self.ws(i)
            if self.s[i] == "}":
                return out, i + 1
            if self.s[i] in "\"'":
                key, i = self.string(i)
            else:
                m = _WORD.match(self.s, i)
                if not m:
                    raise _Fail
                key, i = m.group(), m.end()
            i = self.ws(i)
            if self.s[i] != ":":
                raise _Fail
            out[key], i = self.value(i + 1, depth)
            i = self.ws(i)
            if self.s[i] == ",":
                i += 1
            elif self.s[i] != "}":
                raise _Fail

    def arr(self, i: int, depth: int) -> tuple[list[Any], int]:
        out: list[Any] = []
        while True:
            i = self.ws(i)
            if self.s[i] == "]":
                return out, i + 1
            item, i = self.value(i, depth)
            out.append(item)
            i = self.ws(i)
            if self.s[i] == ",":
                i += 1
            elif self.s[i] != "]":
                raise _Fail

    def string(self, i: int) -> tuple[str, int]:
        s, quote = self.s, self.s[i]
        chars: list[str] = []
        i += 1
        while True:
            c = s[i]
            if c == quote:
                return "".join(chars), i + 1
            if c != "\\":
                chars.append(c)
                i += 1
                continue
            e = s[i + 1]
            if e == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", s[i + 2 : i + 6]):
                code = int(s[i + 2 : i + 6], 16)
                i += 6
                if 0xD800 <= code < 0xDC00 and s[i : i + 2] == "\\u":
                    low = s[i + 2 : i + 6]
                    if re.fullmatch(r"[dD][c-fC-F][0-9a-fA-F]{2}", low):
                        code = 0x10000 + ((code - 0xD800) << 10) + (int(low, 16) - 0xDC00)
                        i += 6
                chars.append(chr(code))
            elif e in _ESCAPES:
                chars.append(_ESCAPES[e])
                i += 2
            else:  # an unknown escape (a Windows path, a regex): keep it as written
                chars.append("\\" + e)
                i += 2
