"""What ``dflow serve`` and the ``dflow worker`` processes of the pulling tests import.

``browser``: a :class:`ToolCallAgent` whose :class:`FunctionModel` reads the task: ``fetch
URL ...`` calls the pulled tool ``fetch_page`` once per URL (at once), ``ask Q`` calls the
pulled tool ``ask_user`` (a short timeout, ``DFLOW_TEST_ASK_TIMEOUT`` seconds); once the
results are in, the answer is ``observed: `` and the observations joined with `` | ``.

The jobs live in Redis (``DFLOW_TEST_REDIS``) under ``DFLOW_TEST_PREFIX``; ``DFLOW_ROUTES``
gives ``dflow serve`` the job routes and the agent's chat route.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from dflow_agents import ChatMessage, ChatResponse, ToolCall, ToolCallAgent, ToolSpec
from dflow_agents.pulling import PullingJobTool, RedisJobBoard, agent_routes, job_routes
from dflow_agents.testing import FunctionModel

REDIS = os.environ.get("DFLOW_TEST_REDIS", "redis://127.0.0.1:6379/11")
PREFIX = os.environ.get("DFLOW_TEST_PREFIX", "t")
ASK_TIMEOUT = float(os.environ.get("DFLOW_TEST_ASK_TIMEOUT", "1.5"))

board = RedisJobBoard(REDIS, prefix=f"{PREFIX}:jobs")


def fetch_page(url: str) -> str:
    """Fetch a page in the user's browser; its text.

    Args:
        url: the page's address
    """


def ask_user(question: str) -> str:
    """Ask the user.

    Args:
        question: what to ask
    """


fetch = PullingJobTool(fetch_page, board, timeout=60)
ask = PullingJobTool(ask_user, board, timeout=ASK_TIMEOUT)


def decide(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ChatResponse:
    results = [m.content for m in messages if m.role == "tool"]
    if results:
        return ChatResponse(content="observed: " + " | ".join(results))
    kind, _, rest = messages[-1].content.partition(" ")
    if kind == "fetch":
        calls = [ToolCall(id="", name="fetch_page", arguments={"url": u}) for u in rest.split()]
    else:
        calls = [ToolCall(id="", name="ask_user", arguments={"question": rest})]
    return ChatResponse(tool_calls=calls)


browser = ToolCallAgent("browser", FunctionModel(decide), [fetch, ask])

DFLOW_ROUTES = [job_routes(board), agent_routes(browser)]
