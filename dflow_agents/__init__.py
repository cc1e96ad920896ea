"""LLM agents written as dflow flows: the LLM layer and the tools.

* chat types (:class:`ChatMessage`, :class:`ToolCall`, :class:`ChatResponse`...), JSON data
  that agent state carries across steps;
* the :class:`ChatModel` protocol and :class:`OpenAIChatModel` (native tool calls, or the
  Qwen2.5 raw-prompt mode), whose retryable failures are :class:`ModelRetryableError`;
* the Qwen2.5 prompt renderer and tolerant parser (:mod:`dflow_agents.qwen`);
* :class:`AIFunction`: formatter, template, model and parser as replaceable callables;
* ``@tool``: typed functions (plain, async, or returning a ``DFlow``) as model tools;
* conversation memory per session (:class:`ChatMemory`, :class:`InMemoryChatMemory`,
  :class:`RedisChatMemory`) and :func:`context_window`, what of it fits the model;
* the text ReAct format: :func:`render_react_prompt` and :func:`parse_react_output`;
* the agents, each a flow of steps that any worker runs: :class:`ToolCallAgent` (think,
  then every tool call of the turn at once), :class:`ConversationAgentExecutor` (text
  ReAct), with :class:`LoopGuard`; :func:`agent_tool` makes an agent the tool of another.

Test doubles live in :mod:`dflow_agents.testing`.
"""

from __future__ import annotations

from .agent import Agent, AgentResult, AgentStatus
from .agent_tool import AgentDepthError, agent_tool
from .errors import (
    ModelConfigError,
    ModelConnectionError,
    ModelError,
    ModelRateLimitError,
    ModelRequestBlockedError,
    ModelResponseError,
    ModelRetryableError,
    ModelServerError,
    ModelStatusError,
    ModelTimeoutError,
)
from .executor import ConversationAgentExecutor
from .function import (
    AIFunction,
    ModelConfig,
    chat_formatter,
    chat_template,
    qwen_parser,
    qwen_template,
    response_parser,
)
from .loopguard import STRATEGY_PROMPT, LoopGuard
from .memory import ChatMemory, InMemoryChatMemory, RedisChatMemory, context_window, estimate_tokens
from .messages import ChatMessage, ChatResponse, Role, ToolCall, ToolSpec, Usage, to_openai_messages
from .model import ChatModel, CompletionModel
from .openai_model import OpenAIChatModel
from .qwen import QWEN_DEFAULT_SYSTEM, QWEN_STOP, parse_qwen_completion, render_qwen_prompt
from .react import (
    REACT_STOP,
    REACT_TEMPLATE,
    ReActAction,
    ReActFinalAnswer,
    ReActParseFailure,
    ReActStep,
    parse_react_output,
    render_react_prompt,
    render_react_scratchpad,
)
from .terminate import TERMINATE_DESCRIPTION, TerminateStatus, terminate, terminate_tool
from .toolcall import DEFAULT_SYSTEM_PROMPT, ToolCallAgent
from .tools import Tool, ToolResult, tool

__all__ = [  # noqa: RUF022 - plain sorted(), as tests/test_exports.py checks
    "AIFunction",
    "Agent",
    "AgentDepthError",
    "AgentResult",
    "AgentStatus",
    "ChatMemory",
    "ChatMessage",
    "ChatModel",
    "ChatResponse",
    "CompletionModel",
    "ConversationAgentExecutor",
    "DEFAULT_SYSTEM_PROMPT",
    "InMemoryChatMemory",
    "LoopGuard",
    "ModelConfig",
    "ModelConfigError",
    "ModelConnectionError",
    "ModelError",
    "ModelRateLimitError",
    "ModelRequestBlockedError",
    "ModelResponseError",
    "ModelRetryableError",
    "ModelServerError",
    "ModelStatusError",
    "ModelTimeoutError",
    "OpenAIChatModel",
    "QWEN_DEFAULT_SYSTEM",
    "QWEN_STOP",
    "REACT_STOP",
    "REACT_TEMPLATE",
    "ReActAction",
    "ReActFinalAnswer",
    "ReActParseFailure",
    "ReActStep",
    "RedisChatMemory",
    "Role",
    "STRATEGY_PROMPT",
    "TERMINATE_DESCRIPTION",
    "TerminateStatus",
    "Tool",
    "ToolCall",
    "ToolCallAgent",
    "ToolResult",
    "ToolSpec",
    "Usage",
    "agent_tool",
    "chat_formatter",
    "chat_template",
    "context_window",
    "estimate_tokens",
    "parse_qwen_completion",
    "parse_react_output",
    "qwen_parser",
    "qwen_template",
    "render_qwen_prompt",
    "render_react_prompt",
    "render_react_scratchpad",
    "response_parser",
    "terminate",
    "terminate_tool",
    "to_openai_messages",
    "tool",
]
