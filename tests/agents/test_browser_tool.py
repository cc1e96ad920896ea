"""The browser tool against a local page the test serves, in the system's headless Chromium
(never a downloaded browser: skipped without chromium, failed under ``CI``): reading a page,
typing, clicking and pressing keys, a screenshot, a selector that never comes, private
addresses refused unless allowed, and an agent calling the tool as a step."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import dflow
from dflow_agents import AgentStatus, Tool, ToolCallAgent, browser_tool
from dflow_agents.testing import ScriptedModel, call, reply
from tests.support.console import chromium

from .mcp_probe import in_runtime, run_tool

PAGE = b"""<!doctype html>
<html><head><title>Greeter</title></head>
<body>
<h1>Greeter</h1>
<form id="f" onsubmit="event.preventDefault(); document.getElementById('out').textContent = 'Sent ' + document.getElementById('name').value;">
  <input id="name" name="name">
  <button id="go" type="button"
    onclick="document.getElementById('out').textContent = 'Hello, ' + document.getElementById('name').value">Greet</button>
</form>
<p id="out">nobody yet</p>
<script>setTimeout(() => { const p = document.createElement('p'); p.id = 'late'; p.textContent = 'late news'; document.body.appendChild(p); }, 300);</script>
</body></html>"""


class _Page(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/html; charset=utf-8")
        self.send_header("content-length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("screenshots")


@pytest.fixture(scope="module")
def browser(runtime: dflow.Runtime, shots: Path) -> Iterator[Tool]:
    tool = browser_tool(executable_path=chromium(), allow_private=True, screenshots=shots, timeout=10)
    yield tool

    async def close() -> None:
        from dflow_agents.browser_tool import close_browsers

        await close_browsers()

    in_runtime(close)


def test_a_page_is_opened_and_its_text_read(browser: Tool, site: str) -> None:
    result = run_tool(browser, url=site)
    assert result["ok"], result["observation"]
    assert result["observation"].startswith(f"opened {site} (HTTP 200)\n--- text of body ---\nGreeter\n")
    assert "nobody yet" in result["observation"]


def test_typing_and_clicking_act_on_the_page(browser: Tool, site: str) -> None:
    actions = [{"do": "type", "selector": "#name", "text": "Ada"}, {"do": "click", "selector": "#go"}]
    result = run_tool(browser, url=site, actions=actions, read="#out")
    assert result["observation"].endswith("--- text of #out ---\nHello, Ada"), result["observation"]


def test_pressing_a_key_and_waiting_for_an_element(browser: Tool, site: str) -> None:
    actions = [
        {"do": "type", "selector": "#name", "text": "Grace"},
        {"do": "press", "selector": "#name", "text": "Enter"},
        {"do": "wait", "selector": "#late"},
    ]
    assert run_tool(browser, url=site, actions=actions, read="#out")["observation"].endswith("Sent Grace")
    assert run_tool(browser, url=site, actions=actions[2:], read="#late")["observation"].endswith("late news")


def test_a_screenshot_is_saved_as_a_png_and_described(browser: Tool, site: str, shots: Path) -> None:
    result = run_tool(browser, url=site, screenshot=True)
    last = result["observation"].splitlines()[-1]
    assert last.startswith("[screenshot screenshot-") and last.endswith(" bytes]")
    name = last.split()[1].rstrip(":")
    assert (shots / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_selector_that_never_comes_fails_within_the_timeout(site: str, runtime: dflow.Runtime) -> None:
    quick = browser_tool(executable_path=chromium(), allow_private=True, timeout=1)
    result = run_tool(quick, url=site, actions=[{"do": "click", "selector": "#no-such-button"}])
    assert not result["ok"] and result["error"] == "TimeoutError", result
    assert "no-such-button" in result["observation"]


def test_a_private_address_is_refused_unless_allowed(site: str, runtime: dflow.Runtime) -> None:
    guarded = browser_tool(executable_path=chromium())
    result = run_tool(guarded, url=site)
    assert not result["ok"] and result["error"] == "PermissionError"
    assert (
        "not opened: 127.0.0.1 is a private, loopback, link-local or reserved address"
        in result["observation"]
    )
    assert run_tool(guarded, url="file:///etc/passwd")["error"] == "ValueError"


def test_an_agent_calls_the_browser_as_a_step(browser: Tool, site: str) -> None:
    model = ScriptedModel(
        [
            reply(
                calls=[call("browser", url=site, actions=[{"do": "click", "selector": "#go"}], read="#out")]
            ),
            reply("The page says hello."),
        ]
    )
    result = ToolCallAgent("browser-agent", model, [browser]).run("greet").result(60)
    assert result.status is AgentStatus.FINISHED
    (seen,) = [m.content for m in model.requests[1].messages if m.role == "tool"]
    assert seen.endswith("--- text of #out ---\nHello,")
