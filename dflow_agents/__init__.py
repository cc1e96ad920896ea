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
* long-term memory per user (:class:`LongTermMemory`, :class:`StateLongTermMemory`): facts
  de-duplicated on write, recalled into an agent's prompt within a token budget;
* the text ReAct format: :func:`render_react_prompt` and :func:`parse_react_output`;
* the agents, each a flow of steps that any worker runs: :class:`ToolCallAgent` (think,
  then every tool call of the turn at once), :class:`ConversationAgentExecutor` (text
  ReAct), with :class:`LoopGuard`; :func:`agent_tool` makes an agent the tool of another.

Test doubles live in :mod:`dflow_agents.testing`.
"""

from __future__ import annotations

from .agent import Agent, AgentResult, AgentStatus
from .agent_tool import AgentDepthError, agent_tool
from .crawler import (
    DeepCrawlerAgent,
    Research,
    UrlMap,
    Validation,
    research_function,
    summary_function,
    validation_function,
)
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
from .fetch import USER_AGENT, Fetcher, Page, Robots, html_to_markdown, normalize_url
from .function import (
    AIFunction,
    ModelConfig,
    chat_formatter,
    chat_template,
    qwen_parser,
    qwen_template,
    response_parser,
)
from .longterm import (
    Fact,
    LongTermMemory,
    StateLongTermMemory,
    facts_prompt,
    same_text,
    user_statements,
    word_overlap,
)
from .loopguard import STRATEGY_PROMPT, LoopGuard
from .memory import ChatMemory, InMemoryChatMemory, RedisChatMemory, context_window, estimate_tokens
from .messages import ChatMessage, ChatResponse, Role, ToolCall, ToolSpec, Usage, to_openai_messages
from .model import ChatModel, CompletionModel
from .openai_model import OpenAIChatModel
from .plan_tool import PLANNING_DESCRIPTION, planning_tool
from .planning import FINALIZE_PROMPT, PLANNER_PROMPT, PlanningFlow, default_step_prompt
from .plans import (
    MAX_PLAN_STEPS,
    Plan,
    PlanBook,
    PlanDraft,
    PlanningError,
    PlanningResult,
    PlanStepStatus,
    StepResult,
    default_plan,
    format_plan,
    step_tag,
)
from .pulling import (
    SESSION_KEY,
    InMemoryJobBoard,
    Job,
    JobAnsweredError,
    JobBoard,
    JobError,
    JobExpiredError,
    JobFailedError,
    JobForbiddenError,
    JobNotFoundError,
    JobTimeoutError,
    PullingJobTool,
    RedisJobBoard,
    RouteHost,
    agent_routes,
    answer_job,
    job_routes,
    pulling_tool,
)
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
from .templates import (
    InMemoryPlanTemplates,
    PlanTemplate,
    PlanTemplateNotFoundError,
    PlanTemplates,
    RedisPlanTemplates,
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
    "DeepCrawlerAgent",
    "FINALIZE_PROMPT",
    "Fact",
    "Fetcher",
    "InMemoryChatMemory",
    "InMemoryJobBoard",
    "InMemoryPlanTemplates",
    "Job",
    "JobAnsweredError",
    "JobBoard",
    "JobError",
    "JobExpiredError",
    "JobFailedError",
    "JobForbiddenError",
    "JobNotFoundError",
    "JobTimeoutError",
    "LongTermMemory",
    "LoopGuard",
    "MAX_PLAN_STEPS",
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
    "PLANNER_PROMPT",
    "PLANNING_DESCRIPTION",
    "Page",
    "Plan",
    "PlanBook",
    "PlanDraft",
    "PlanStepStatus",
    "PlanTemplate",
    "PlanTemplateNotFoundError",
    "PlanTemplates",
    "PlanningError",
    "PlanningFlow",
    "PlanningResult",
    "PullingJobTool",
    "QWEN_DEFAULT_SYSTEM",
    "QWEN_STOP",
    "REACT_STOP",
    "REACT_TEMPLATE",
    "ReActAction",
    "ReActFinalAnswer",
    "ReActParseFailure",
    "ReActStep",
    "RedisChatMemory",
    "RedisJobBoard",
    "RedisPlanTemplates",
    "Research",
    "Robots",
    "Role",
    "RouteHost",
    "SESSION_KEY",
    "STRATEGY_PROMPT",
    "StateLongTermMemory",
    "StepResult",
    "TERMINATE_DESCRIPTION",
    "TerminateStatus",
    "Tool",
    "ToolCall",
    "ToolCallAgent",
    "ToolResult",
    "ToolSpec",
    "USER_AGENT",
    "UrlMap",
    "Usage",
    "Validation",
    "agent_routes",
    "agent_tool",
    "answer_job",
    "chat_formatter",
    "chat_template",
    "context_window",
    "default_plan",
    "default_step_prompt",
    "estimate_tokens",
    "facts_prompt",
    "format_plan",
    "html_to_markdown",
    "job_routes",
    "normalize_url",
    "parse_qwen_completion",
    "parse_react_output",
    "planning_tool",
    "pulling_tool",
    "qwen_parser",
    "qwen_template",
    "render_qwen_prompt",
    "render_react_prompt",
    "render_react_scratchpad",
    "research_function",
    "response_parser",
    "same_text",
    "step_tag",
    "summary_function",
    "terminate",
    "terminate_tool",
    "to_openai_messages",
    "tool",
    "user_statements",
    "validation_function",
    "word_overlap",
]
