"""The assistant example (``examples/assistant``) in local mode, offline, end to end: the
planning flow over the shopper agent runs in this process, the browser plug-in
(``client.Plugin``) talks to the HTTP API on a real socket, pulls the jobs, fetches the demo
shop's pages over HTTP and reports them; the scripted model decides.

* the plan, every tool of the shopper run, the crawl's pages fetched by the plug-in (and only
  by it), each job reported over HTTP and the answer;
* the user's choice decides the outfit tried on;
* a URL off the shop's host is refused by the plug-in, and the run still ends;
* a wrong token is refused with the server's reason;
* ``python -m examples.assistant`` as a user runs it, with ``redis`` and ``kafka`` made
  unimportable: with the scripted model, and with ``OPENAI_*`` pointing at a local
  OpenAI-compatible server (which answers with the same scripted brain), so the real-model
  path is the scripted one but for the model object.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from dflow import StepStatus
from dflow_agents import ChatMessage, ToolCall, ToolSpec
from dflow_agents.testing import block_network_models
from examples.assistant.client import ClientError, Outcome, Plugin
from examples.assistant.run_local import Local, local
from examples.assistant.scripted import PLAN_STEPS, brain
from tests.support.runs import runs_of

ROOT = Path(__file__).resolve().parent.parent
FIRST_LOOK = "Striped T-shirt, Beige chinos and White canvas sneakers"
SECOND_LOOK = "Striped T-shirt, Straight jeans and White canvas sneakers"
PAGES = ["/", "/c/top", "/p/striped-tee.html"]  # what the crawl reads, level by level


@pytest.fixture(scope="module")
def here() -> Iterator[Local]:
    with block_network_models(), local() as running:
        yield running


def chat(here: Local, query: str = "What should I wear this spring? Something casual.", **kw: Any) -> Outcome:
    lines: list[str] = []
    plugin = Plugin(here.api, out=lines.append, **kw)
    out = asyncio.run(plugin.chat(query, page=here.shop.url, timeout=30))
    tokens[out.session] = str(plugin.token)  # the session's token, as the plug-in holds it
    return out


tokens: dict[str, str] = {}


def tool_calls(trace_id: str) -> list[dict[str, Any]]:
    """The tool calls the shopper made, in no particular order: those of a turn's tool step
    (which takes the turn's state), and each flow tool's (whose step takes its call)."""
    inputs = [
        s.input
        for steps in runs_of(trace_id)
        for s in steps
        if s.status is StepStatus.DONE and s.key.startswith("tool>")
    ]
    return [c for i in inputs for c in i.get("calls", [i])]


def test_a_chat_plans_runs_every_tool_and_the_plugin_does_the_pulled_jobs_over_http(here: Local) -> None:
    before = len(here.shop.paths())
    out = chat(here)
    assert out.status == "done", out.error
    result = out.result
    assert result["status"] == "finished", result["reason"]
    assert result["source"] == "model" and result["plan"]["steps"] == PLAN_STEPS
    assert [(s["index"], s["status"]) for s in result["steps"]] == [
        (0, "finished"),
        (1, "finished"),
        (2, "finished"),
    ]
    assert "Progress: 3/3 steps completed (100.0%)" in result["plan_text"]

    calls = Counter(c["name"] for c in tool_calls(out.trace_id))
    assert calls == {"search": 3, "browser": 1, "dapei": 1, "ask_user": 1, "chuan": 1, "terminate": 1}
    searched = sorted(c["arguments"]["kind"] for c in tool_calls(out.trace_id) if c["name"] == "search")
    assert searched == ["bottom", "shoes", "top"], "three searches in one turn"

    # the pulled jobs went to the plug-in, which reported each over HTTP
    jobs = [(j["tool"], j["http"]) for j in out.jobs]
    assert jobs == [("fetch_page", 200)] * 3 + [("ask_user", 200)]
    assert [j["arguments"]["url"] for j in out.jobs[:3]] == [here.shop.url.rstrip("/") + p for p in PAGES]
    assert here.shop.paths()[before:] == PAGES, (
        "the plug-in fetched each page once; nothing else reached the shop"
    )
    ask = out.jobs[3]
    assert ask["arguments"]["choices"] == [
        FIRST_LOOK,
        SECOND_LOOK,
        "Linen shirt, Beige chinos and White canvas sneakers",
    ]
    assert ask["report"] == {"result": FIRST_LOOK}
    token = {"Authorization": f"Bearer {_token(here, out)}"}
    states = {httpx.get(f"{here.api}/jobs/{j['id']}", headers=token).json()["state"] for j in out.jobs}
    assert states == {"answered"}

    # what each step found, and the answer
    notes = [s["answer"] for s in result["steps"]]
    assert "Striped T-shirt [striped-tee] 19 EUR" in notes[0] and "[beige-chinos]" in notes[0]
    assert notes[1].endswith(
        "The Striped T-shirt is made of organic cotton jersey; it comes in sizes XS to XXL."
    )
    assert notes[2].startswith(
        "Now wearing: Striped T-shirt (top), Beige chinos (bottom), White canvas sneakers (shoes)"
    )
    assert result["answer"].startswith(notes[2]) and notes[1] in result["answer"]
    assert any(s["status"] == "done" and s["key"].startswith("finalize") for s in out.steps), (
        "the events were followed"
    )


def _token(here: Local, out: Outcome) -> str:
    return tokens[out.session]


def test_the_users_choice_decides_the_outfit_tried_on(here: Local) -> None:
    asked: list[tuple[str, list[str]]] = []

    async def second(question: str, choices: Sequence[str]) -> int:
        asked.append((question, list(choices)))
        return 1

    out = chat(here, choose=second)
    assert out.result["status"] == "finished"
    assert asked == [
        (
            "Which outfit would you like to try on?",
            [FIRST_LOOK, SECOND_LOOK, "Linen shirt, Beige chinos and White canvas sneakers"],
        )
    ]
    assert out.result["steps"][2]["answer"].startswith(
        "Now wearing: Striped T-shirt (top), Straight jeans (bottom), White canvas sneakers (shoes). Total 123 EUR. "
        f"That is the {SECOND_LOOK} (you chose it)"
    )
    chuan = [c for c in tool_calls(out.trace_id) if c["name"] == "chuan"]
    assert [c["arguments"] for c in chuan] == [{"outfit": "striped-tee+straight-jeans+canvas-sneakers"}]


@pytest.mark.parametrize("where", ["http://192.0.2.7/admin", "the API"])
def test_the_plugin_refuses_a_page_off_the_shop_and_the_run_still_ends(here: Local, where: str) -> None:
    url = f"{here.api}/pipelines" if where == "the API" else where  # another port of the same host, too
    before = len(here.shop.paths())
    out = chat(here, f"Something casual for spring. My friend says look at {url} first.")
    assert out.result["status"] == "finished"
    fetches = [j for j in out.jobs if j["tool"] == "fetch_page"]
    assert [j["arguments"]["url"] for j in fetches] == [url]
    site = url.split("/")[2] if where == "the API" else "192.0.2.7:80"
    shop = here.shop.url.split("/")[2]
    assert fetches[0]["report"] == {"error": f"this plug-in only opens pages of {shop}, not of {site}"}
    assert here.shop.paths()[before:] == []
    browsed = out.result["steps"][1]["answer"]
    assert "The agent 'assistant-crawler' ended terminated" in browsed, browsed
    assert out.result["steps"][2]["status"] == "finished", "the plan went on"


def test_a_wrong_token_is_refused_with_the_servers_reason(here: Local) -> None:
    with pytest.raises(ClientError, match="starting the chat: HTTP 401: the bearer token is neither"):
        chat(here, admin_token="not-the-admin-token")
    with pytest.raises(ClientError, match="the server is an http"):
        Plugin("ftp://127.0.0.1")
    with pytest.raises(ClientError, match="an allowed site is host:port"):
        Plugin(here.api, allowed_sites=["127.0.0.1"])


def test_the_tools_answer_bad_arguments_with_what_to_fix() -> None:
    from examples.assistant import app

    four = app.ask.validate({"question": "Which?", "choices": ["a", "b", "c", "d"]})
    assert not isinstance(four, dict) and "choices: List should have at most 3 items" in four.observation
    dapei = asyncio.run(app.dapei.run({"items": ["linen-shirt", "ballgown"]}))
    assert (
        not dapei.ok
        and "there is no item 'ballgown' in the catalogue; its ids are: linen-shirt" in dapei.observation
    )
    tops = asyncio.run(app.dapei.run({"items": ["linen-shirt", "striped-tee"]}))
    assert not tops.ok and "an outfit needs at least one top and one bottom" in tops.observation
    chuan = asyncio.run(app.chuan.run({"outfit": " + "}))
    assert not chuan.ok and "an outfit id is item ids joined by '+'" in chuan.observation
    search = asyncio.run(app.search.run({"query": "spring", "kind": "hats"}))
    assert not search.ok and search.error == "ValidationError"
    nothing = asyncio.run(app.search.run({"query": "ballgown"}))
    assert nothing.ok and nothing.observation.startswith("No item matches 'ballgown'")


# -- the command line, with redis and kafka unimportable ---------------------------------------------


class FakeOpenAI:
    """An OpenAI-compatible chat server on 127.0.0.1 whose model is the scripted brain."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, ...]] = []  # the tools offered in each request
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                assert self.path.endswith("/chat/completions"), self.path
                tools = [ToolSpec(name=t["function"]["name"]) for t in body.get("tools") or ()]
                fake.asked.append(tuple(t.name for t in tools))
                reply = brain([_message(m) for m in body["messages"]], tools)
                message: dict[str, Any] = {"role": "assistant", "content": reply.content}
                if reply.tool_calls:
                    message["tool_calls"] = [
                        {
                            "id": f"call_{len(fake.asked)}_{n}",
                            "type": "function",
                            "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
                        }
                        for n, c in enumerate(reply.tool_calls)
                    ]
                data = json.dumps(
                    {
                        "id": "chatcmpl-1",
                        "object": "chat.completion",
                        "created": 1700000000,
                        "model": body["model"],
                        "choices": [
                            {
                                "index": 0,
                                "message": message,
                                "finish_reason": "tool_calls" if reply.tool_calls else "stop",
                            }
                        ],
                        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
                    }
                ).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _message(m: dict[str, Any]) -> ChatMessage:
    calls = [
        ToolCall(id=c["id"], name=c["function"]["name"], arguments=json.loads(c["function"]["arguments"]))
        for c in m.get("tool_calls") or ()
    ]
    return ChatMessage(
        role=m["role"],
        content=m.get("content") or "",
        tool_calls=calls,
        tool_call_id=m.get("tool_call_id"),
        name=m.get("name"),
    )


NO_REDIS = (
    "import sys; sys.modules.update(redis=None, kafka=None); import runpy; "
    "runpy.run_module('examples.assistant', run_name='__main__', alter_sys=True)"
)


def demo(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    return subprocess.run(
        [sys.executable, "-c", NO_REDIS, "--ask", "first"],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**clean, "DFLOW_AGENTS_BLOCK_NETWORK": "1", **env},
    )


@pytest.mark.timeout(90)
def test_the_demo_from_the_command_line_needs_no_redis() -> None:
    done = demo({})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    out = done.stdout
    assert "model: FunctionModel('brain', name='scripted-assistant')" in out
    assert (
        "Progress: 3/3 steps completed (100.0%)" in out
        and "asked: Which outfit would you like to try on?" in out
    )
    assert "FINISHED: Now wearing: Striped T-shirt (top), Beige chinos (bottom)" in out


@pytest.mark.timeout(90)
def test_the_demo_with_a_real_model_is_the_same_path_but_for_the_model() -> None:
    fake = FakeOpenAI()
    try:
        done = demo({"OPENAI_BASE_URL": fake.url, "OPENAI_API_KEY": "sk-test", "OPENAI_MODEL": "qwen-plus"})
    finally:
        fake.close()
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert f"model: OpenAIChatModel(model='qwen-plus', base_url='{fake.url}', mode='chat')" in done.stdout
    assert "FINISHED: Now wearing: Striped T-shirt (top), Beige chinos (bottom)" in done.stdout
    offered = Counter(
        "planner" if "planning" in t else "shopper" if "search" in t else "plain" for t in fake.asked
    )
    # the planner once; the shopper's turns (2 + 2 + 4); research (3 levels), validation, summary, finalizer
    assert offered == {"planner": 1, "shopper": 8, "plain": 6}
