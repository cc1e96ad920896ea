"""LLM agents written as dflow flows: the LLM layer and the tools.

* chat types (:class:`ChatMessage`, :class:`ToolCall`, :class:`ChatResponse`...), JSON data
  that agent state carries across steps;
* the :class:`ChatModel` protocol and :class:`OpenAIChatModel` (native tool calls, or the
  Qwen2.5 raw-prompt mode), whose retryable failures are :class:`ModelRetryableError`;
* the Qwen2.5 prompt renderer and tolerant parser (:mod:`dflow_agents.qwen`);
* :class:`AIFunction`: formatter, template, model and parser as replaceable callables;
* ``@tool``: typed functions (plain, async, or returning a ``DFlow``) as model tools;
* built-in tools, each bounded: :func:`shell_tool` (allowed commands, no shell),
  :func:`file_tools` (read, write, list under a root), :func:`browser_tool` (Chromium
  through Playwright);
* tools of Model Context Protocol servers (:class:`McpServer`, :class:`McpTool`), over stdio
  or streamable HTTP;
* conversation memory per session (:class:`ChatMemory`, :class:`InMemoryChatMemory`,
  :class:`RedisChatMemory`) and :func:`context_window`, what of it fits the model;
* long-term memory per user (:class:`LongTermMemory`, :class:`StateLongTermMemory`): facts
  de-duplicated on write, recalled into an agent's prompt within a token budget;
* the text ReAct format: :func:`render_react_prompt` and :func:`parse_react_output`;
* the agents, each a flow of steps that any worker runs: :class:`ToolCallAgent` (think,
  then every tool call of the turn at once), :class:`ConversationAgentExecutor` (text
  ReAct), with :class:`LoopGuard`; :func:`agent_tool` makes an agent the tool of another;
  their constructors take settings in groups (:class:`AgentLimits`, :class:`ModelCalls`,
  :class:`LongTermRecall`, :class:`ReActLimits`, :class:`PlanningOptions`).

Test doubles live in :mod:`dflow_agents.testing`.
"""

from __future__ import annotations

from . import _extra_installed  # noqa: F401 - first: names the extra when its packages are missing
from .agent import Agent, AgentResult, AgentStatus
from .agent_definitions import (
    AgentDefinition,
    AgentDefinitionNotFoundError,
    InMemoryAgentDefinitions,
    RedisAgentDefinitions,
    build_agents,
    descriptions_of,
)
from .agent_tool import AgentDepthError, agent_tool
from .browser_tool import BrowserAction, browser_tool
from .compression import SUMMARY_PROMPT, ContextCompression
from .crawler import (
    CrawlBudget,
    CrawlFunctions,
    CrawlScope,
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
from .exchanges import CallRecording
from .executor import ConversationAgentExecutor, ReActLimits
from .fallback import DEFAULT_FALLBACK_ON, ModelFallback, ModelFallbackError
from .fetch import USER_AGENT, Fetcher, Page, Robots, html_to_markdown, normalize_url
from .file_tools import file_tools
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
from .loopguard import REPEAT_NOTE, STRATEGY_PROMPT, LoopGuard, call_signature
from .mcp_tools import McpLimits, McpServer, McpTool
from .memory import ChatMemory, InMemoryChatMemory, RedisChatMemory, context_window, estimate_tokens
from .messages import (
    ChatMessage,
    ChatResponse,
    Role,
    SkippedModel,
    ToolCall,
    ToolSpec,
    Usage,
    to_openai_messages,
)
from .model import ChatModel, CompletionModel
from .openai_model import OpenAIChatModel
from .options import DEFAULT_TOOL_TIMEOUT, AgentLimits, LongTermRecall, ModelCalls, ToolChoice
from .plan_tool import PLANNING_DESCRIPTION, planning_tool
from .planning import (
    DIRECT_ANSWER_PROMPT,
    FINALIZE_PROMPT,
    PLANNER_PROMPT,
    PlanningFlow,
    PlanningOptions,
    default_step_prompt,
)
from .plans import (
    MAX_PLAN_STEPS,
    Plan,
    PlanBook,
    PlanDraft,
    PlanningError,
    PlanningResult,
    PlanStepStatus,
    StepDetail,
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
from .qwen import (
    QWEN_DEFAULT_SYSTEM,
    QWEN_STOP,
    calls_as_text,
    parse_qwen_completion,
    read_text_tool_calls,
    render_qwen_prompt,
    tool_responses_text,
)
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
from .shell_tool import shell_tool
from .templates import (
    InMemoryPlanTemplates,
    PlanTemplate,
    PlanTemplateNotFoundError,
    PlanTemplates,
    RedisPlanTemplates,
)
from .terminate import (
    FAILURE_WORDS,
    SUCCESS_WORDS,
    TERMINATE_DESCRIPTION,
    TerminateStatus,
    terminate,
    terminate_status,
    terminate_tool,
)
from .toolcall import DEFAULT_SYSTEM_PROMPT, ToolCallAgent
from .tools import Tool, ToolResult, tool

__all__ = [  # noqa: RUF022 - plain sorted(), as tests/test_exports.py checks
    "AIFunction",
    "Agent",
    "AgentDefinition",
    "AgentDefinitionNotFoundError",
    "AgentDepthError",
    "AgentLimits",
    "AgentResult",
    "AgentStatus",
    "BrowserAction",
    "CallRecording",
    "ChatMemory",
    "ChatMessage",
    "ChatModel",
    "ChatResponse",
    "CompletionModel",
    "ContextCompression",
    "ConversationAgentExecutor",
    "CrawlBudget",
    "CrawlFunctions",
    "CrawlScope",
    "DEFAULT_FALLBACK_ON",
    "DEFAULT_SYSTEM_PROMPT",
    "DEFAULT_TOOL_TIMEOUT",
    "DIRECT_ANSWER_PROMPT",
    "DeepCrawlerAgent",
    "FAILURE_WORDS",
    "FINALIZE_PROMPT",
    "Fact",
    "Fetcher",
    "InMemoryAgentDefinitions",
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
    "LongTermRecall",
    "LoopGuard",
    "MAX_PLAN_STEPS",
    "McpLimits",
    "McpServer",
    "McpTool",
    "ModelCalls",
    "ModelConfig",
    "ModelConfigError",
    "ModelConnectionError",
    "ModelError",
    "ModelFallback",
    "ModelFallbackError",
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
    "PlanningOptions",
    "PlanningResult",
    "PullingJobTool",
    "QWEN_DEFAULT_SYSTEM",
    "QWEN_STOP",
    "REACT_STOP",
    "REACT_TEMPLATE",
    "REPEAT_NOTE",
    "ReActAction",
    "ReActFinalAnswer",
    "ReActLimits",
    "ReActParseFailure",
    "ReActStep",
    "RedisAgentDefinitions",
    "RedisChatMemory",
    "RedisJobBoard",
    "RedisPlanTemplates",
    "Research",
    "Robots",
    "Role",
    "RouteHost",
    "SESSION_KEY",
    "STRATEGY_PROMPT",
    "SUCCESS_WORDS",
    "SUMMARY_PROMPT",
    "SkippedModel",
    "StateLongTermMemory",
    "StepDetail",
    "StepResult",
    "TERMINATE_DESCRIPTION",
    "TerminateStatus",
    "Tool",
    "ToolCall",
    "ToolCallAgent",
    "ToolChoice",
    "ToolResult",
    "ToolSpec",
    "USER_AGENT",
    "UrlMap",
    "Usage",
    "Validation",
    "agent_routes",
    "agent_tool",
    "answer_job",
    "browser_tool",
    "build_agents",
    "call_signature",
    "calls_as_text",
    "chat_formatter",
    "chat_template",
    "context_window",
    "default_plan",
    "default_step_prompt",
    "descriptions_of",
    "estimate_tokens",
    "facts_prompt",
    "file_tools",
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
    "read_text_tool_calls",
    "render_qwen_prompt",
    "render_react_prompt",
    "render_react_scratchpad",
    "research_function",
    "response_parser",
    "same_text",
    "shell_tool",
    "step_tag",
    "summary_function",
    "terminate",
    "terminate_status",
    "terminate_tool",
    "to_openai_messages",
    "tool",
    "tool_responses_text",
    "user_statements",
    "validation_function",
    "word_overlap",
]
