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

from dflow_agents import ToolCallAgent
from dflow_agents.pulling import PullingJobTool, RedisJobBoard, agent_routes, job_routes
from dflow_agents.testing import FunctionModel
from tests.support.pulled import ask_user, fetch_or_ask, fetch_page

REDIS = os.environ.get("DFLOW_TEST_REDIS", "redis://127.0.0.1:6379/11")
PREFIX = os.environ.get("DFLOW_TEST_PREFIX", "t")
ASK_TIMEOUT = float(os.environ.get("DFLOW_TEST_ASK_TIMEOUT", "1.5"))

board = RedisJobBoard(REDIS, prefix=f"{PREFIX}:jobs")


fetch = PullingJobTool(fetch_page, board, timeout=60)
ask = PullingJobTool(ask_user, board, timeout=ASK_TIMEOUT)
browser = ToolCallAgent("browser", FunctionModel(fetch_or_ask("fetch_page", "ask_user")), [fetch, ask])

DFLOW_ROUTES = [job_routes(board), agent_routes(browser)]
