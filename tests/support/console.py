"""Helpers for tests of the web console (``dflow.server.console``): logging in, the page's
anti-forgery token, requests sent byte for byte (paths no client would normalise), the
console's server-sent events, and the system's chromium for browser tests."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
from typing import Any, NoReturn
from urllib.parse import urlsplit

import httpx
import pytest

CSRF = re.compile(r'<meta name="dflow-csrf" content="([^"]*)">')


def login(api: httpx.Client, admin: str) -> str:
    """Log ``api`` in with the ``admin`` token through the form; the cookie's value."""
    r = api.post("/console/login", data={"token": admin, "next": "/console/"})
    assert r.status_code == 303 and r.headers["location"] == "/console/", r.text
    value = api.cookies.get("dflow_console", path="/console")
    assert value, r.headers
    return value


def csrf_of(api: httpx.Client, path: str = "/console/") -> str:
    """The anti-forgery token of the console page at ``path``."""
    r = api.get(path)
    assert r.status_code in (200, 404), r.text
    found = CSRF.search(r.text)
    assert found is not None and found.group(1), r.text[:500]
    return found.group(1)


def raw_request(base_url: str, request_line: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    """Send ``request_line`` (``"GET /path HTTP/1.1"``) exactly as given, over a socket of
    its own; the status code and the body of the answer."""
    parts = urlsplit(base_url)
    assert parts.hostname and parts.port, base_url
    head = {"Host": parts.netloc, "Connection": "close", **(headers or {})}
    data = request_line + "\r\n" + "".join(f"{k}: {v}\r\n" for k, v in head.items()) + "\r\n"
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall(data.encode("latin-1"))
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    answer = b"".join(chunks).decode("utf-8", "replace")
    status_line, _, rest = answer.partition("\r\n")
    return int(status_line.split()[1]), rest.partition("\r\n\r\n")[2]


def stream_events(
    api: httpx.Client, path: str, *, until: str = "end", limit: int = 50
) -> list[tuple[str, Any]]:
    """(event, data) of the console stream at ``path``, read until an ``until`` event (or
    ``limit`` events, or the stream's end)."""
    out: list[tuple[str, Any]] = []
    with api.stream("GET", path) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        fields: dict[str, str] = {}
        for line in r.iter_lines():
            if not line:
                if "data" in fields:
                    out.append((fields.get("event", "message"), json.loads(fields["data"])))
                    if out[-1][0] == until or len(out) >= limit:
                        return out
                fields = {}
            elif not line.startswith(":"):
                name, _, value = line.partition(": ")
                fields[name] = value
    return out


def _missing(message: str) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(message + " (CI is set: the browser tests must run)")
    pytest.skip(message)


def chromium() -> str:
    """The system's chromium (never a downloaded browser), and Playwright to drive it: skips
    the test when either is missing, and fails it when ``CI`` is set."""
    try:
        import playwright.sync_api  # noqa: F401 - only whether it is there
    except ImportError as exc:
        _missing(f"playwright is not installed (pip install -e '.[dev]'): {exc}")
    found = shutil.which("chromium")
    if found is None:
        _missing("chromium is not installed (apt-get install chromium)")
    return found
