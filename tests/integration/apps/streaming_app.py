"""An agent whose model streams, for the streaming integration tests (``dflow worker``).

The model is an ``OpenAIChatModel(stream=True)`` on the fake OpenAI-compatible server the
test started (``DFLOW_TEST_LLM``, its base URL); the agent has no tools, so its first reply
is its answer. Retryable model errors are asked again at once (``retry_backoff``).
"""

from __future__ import annotations

import os

import dflow
from dflow_agents import ModelCalls, OpenAIChatModel, ToolCallAgent

LLM = os.environ.get("DFLOW_TEST_LLM", "http://127.0.0.1:9/v1")  # (the test process only starts runs)

model = dflow.shared(
    OpenAIChatModel("qwen-plus", base_url=LLM, api_key="EMPTY", stream=True), "streaming-model"
)
agent = ToolCallAgent("streaming-agent", model, [], model_calls=ModelCalls(retry_backoff=0.05))
