"""Tools: typed Python functions a model can call, with schemas from their type hints.

``@tool`` turns a function (plain or ``async def``) into a :class:`Tool`. The model sees a
:class:`ToolSpec` built from the signature (pydantic) and the docstring; a call's arguments
are validated before the function runs, and everything that can go wrong (bad arguments, an
exception, a timeout) comes back as a failed :class:`ToolResult` whose observation the model
can read, never as an exception that ends the agent's loop.

A function annotated to return a ``DFlow`` is a *flow tool* (``Tool.is_flow``): calling it
returns the flow for the agent to embed as steps, so it may run anywhere and suspend.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import math
import re
import sys
import typing
import warnings
from collections.abc import Callable, Mapping
from typing import Annotated, Any, overload

import pydantic
from pydantic import BaseModel, ConfigDict, Field
from pydantic.fields import FieldInfo
from pydantic.json_schema import PydanticJsonSchemaWarning
from pydantic_core import PydanticSerializationError, to_jsonable_python

from dflow import DFlow

from ._docstring import parse_docstring
from ._schema import clean_schema, strict_schema
from .messages import ChatMessage, ToolCall, ToolSpec

__all__ = ["Tool", "ToolResult", "tool"]

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_INPUT_SHOWN = 60


class ToolResult(BaseModel):
    """The outcome of one tool call: the text the model reads, and the data behind it.

    ``observation`` is what goes back to the model. ``ok`` is False when the call failed;
    ``error`` then names the kind of failure (``"ValidationError"``, ``"TimeoutError"`` or
    the exception's type). ``output`` is the function's return value as JSON data.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    observation: str
    ok: bool = True
    error: str | None = None
    output: Any = None
    call_id: str | None = None

    @classmethod
    def of(cls, name: str, value: Any, *, call_id: str | None = None) -> ToolResult:
        """The result for a function's return value (JSON-encoded unless it is text)."""
        if isinstance(value, ToolResult):
            return value.model_copy(update={"name": name, "call_id": call_id or value.call_id})
        if value is None:
            return cls(name=name, observation="(the tool returned nothing)", call_id=call_id)
        if isinstance(value, str):
            return cls(name=name, observation=value, output=value, call_id=call_id)
        try:
            data = to_jsonable_python(value)
        except (TypeError, ValueError, PydanticSerializationError):
            data = str(value)
        text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
        return cls(name=name, observation=text, output=data, call_id=call_id)

    @classmethod
    def failure(cls, name: str, observation: str, *, error: str, call_id: str | None = None) -> ToolResult:
        """A failed call; ``observation`` tells the model what went wrong."""
        return cls(name=name, observation=observation, ok=False, error=error, call_id=call_id)

    def to_message(self) -> ChatMessage:
        """The tool message that answers the call."""
        return ChatMessage.tool(self.observation, tool_call_id=self.call_id, name=self.name)


class _Param:
    __slots__ = ("field", "name")

    def __init__(self, name: str, field: str) -> None:
        self.name, self.field = name, field


class Tool:
    """A function the model can call. Build one with :func:`tool`.

    ``spec`` is what the model is told. ``await tool.run(arguments)`` validates and calls a
    plain tool; ``tool.flow(arguments)`` builds a flow tool's ``DFlow`` (or returns the failed
    ``ToolResult`` when the arguments are invalid). Calling the ``Tool`` itself calls the
    function directly. A tool pickles when its function does (by reference when it is a
    module-level ``@tool``).
    """

    __slots__ = (
        "_args_model",
        "_is_async",
        "_params",
        "description",
        "fn",
        "in_thread",
        "is_flow",
        "name",
        "parameters",
        "strict",
        "timeout",
    )

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        strict: bool = False,
        timeout: float | None = None,
        flow: bool | None = None,
        in_thread: bool = False,
    ) -> None:
        if not callable(fn):
            raise TypeError(f"@tool needs a function, got {fn!r}")
        self.fn = fn
        self.name: str = _checked_name(name or str(getattr(fn, "__name__", "")))
        summary, arg_docs = parse_docstring(inspect.getdoc(fn))
        self.description = description if description is not None else summary
        self.strict = bool(strict)
        self._is_async = _is_async(fn)
        signature = _signature(fn, self.name)
        self.is_flow = bool(flow) if flow is not None else _returns_flow(signature.return_annotation)
        self.timeout = _checked_timeout(self.name, timeout)
        if self.is_flow and (timeout is not None or in_thread or self._is_async):
            raise ValueError(
                f"tool {self.name!r} is a flow tool (it returns a DFlow): build the flow in a plain def, "
                "and put .timeout(seconds) / .in_thread() on the flow's own steps"
            )
        self.in_thread = bool(in_thread)
        self._params, self._args_model = _arguments_model(signature, self.name, arg_docs, self.strict)
        with warnings.catch_warnings():  # a default that is not JSON is left out of the schema
            warnings.simplefilter("ignore", PydanticJsonSchemaWarning)
            schema = clean_schema(self._args_model.model_json_schema())
        self.parameters = strict_schema(schema) if self.strict else schema

    @property
    def spec(self) -> ToolSpec:
        """The name, description and JSON-schema parameters sent to the model."""
        return ToolSpec(
            name=self.name, description=self.description, parameters=self.parameters, strict=self.strict
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the function directly, without validation."""
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        kind = "flow tool" if getattr(self, "is_flow", False) else "tool"
        return f"<{kind} {getattr(self, 'name', '?')!r}>"

    def __reduce__(self) -> tuple[Any, ...]:
        module = getattr(self.fn, "__module__", None)
        qualname = getattr(self.fn, "__qualname__", "")
        if (
            module
            and module != "__main__"
            and "<locals>" not in qualname
            and _lookup(module, qualname) is self
        ):
            return (_tool_by_reference, (module, qualname))
        options = {
            "name": self.name,
            "description": self.description,
            "strict": self.strict,
            "timeout": self.timeout,
            "flow": self.is_flow,
            "in_thread": self.in_thread,
        }
        return (_rebuild_tool, (self.fn, options))

    def validate(self, arguments: Mapping[str, Any] | ToolCall | None = None) -> dict[str, Any] | ToolResult:
        """The keyword arguments for the function, or a failed ``ToolResult`` saying what is wrong."""
        call_id: str | None = None
        if isinstance(arguments, ToolCall):
            call_id = arguments.id
            if arguments.raw_arguments is not None:
                return ToolResult.failure(
                    self.name,
                    f"Error: the arguments for tool '{self.name}' are not a JSON object: "
                    f"{_shorten(arguments.raw_arguments, 200)}. Call the tool again with a JSON object "
                    "of arguments.",
                    error="ValidationError",
                    call_id=call_id,
                )
            arguments = arguments.arguments
        data = dict(arguments or {})
        if self.strict:  # strict schemas send null for an optional argument: use its default
            defaulted = {
                p.name for p in self._params if not self._args_model.model_fields[p.field].is_required()
            }
            data = {k: v for k, v in data.items() if not (v is None and k in defaulted)}
        try:
            validated = self._args_model.model_validate(data)
        except pydantic.ValidationError as exc:
            return ToolResult.failure(
                self.name, _explain(self.name, exc), error="ValidationError", call_id=call_id
            )
        return {p.name: getattr(validated, p.field) for p in self._params}

    async def run(
        self,
        arguments: Mapping[str, Any] | ToolCall | None = None,
        *,
        call_id: str | None = None,
        default_timeout: float | None = None,
    ) -> ToolResult:
        """Validate ``arguments`` and call the tool; every failure becomes a failed result.

        ``default_timeout`` (seconds) applies when the tool has no ``timeout`` of its own
        (agents pass theirs, 10 s by default); a tool made with ``timeout=math.inf`` is never
        abandoned."""
        if self.is_flow:
            raise TypeError(
                f"tool {self.name!r} is a flow tool: embed tool.flow(arguments) in the agent's flow"
            )
        call_id = call_id or (arguments.id if isinstance(arguments, ToolCall) else None)
        kwargs = self.validate(arguments)
        if isinstance(kwargs, ToolResult):
            return kwargs.model_copy(update={"call_id": call_id})
        timeout = self.timeout if self.timeout is not None else default_timeout
        if timeout is not None and math.isinf(timeout):
            timeout = None
        try:
            value = await self._invoke(kwargs, timeout)
            if inspect.isawaitable(value):  # a plain callable that returned a coroutine
                value = await value
        except _TimedOut:
            return ToolResult.failure(
                self.name,
                f"Error: tool '{self.name}' did not finish within {timeout:g} seconds and was abandoned.",
                error="TimeoutError",
                call_id=call_id,
            )
        except Exception as exc:
            return self._error(exc, call_id)
        return ToolResult.of(self.name, value, call_id=call_id)

    def flow(
        self, arguments: Mapping[str, Any] | ToolCall | None = None, *, call_id: str | None = None
    ) -> DFlow[Any] | ToolResult:
        """A flow tool's ``DFlow`` for these arguments; a failed ``ToolResult`` if they are
        invalid or building the flow fails. Turn the flow's value into a result with
        :meth:`result`."""
        if not self.is_flow:
            raise TypeError(f"tool {self.name!r} is not a flow tool: use await tool.run(arguments)")
        call_id = call_id or (arguments.id if isinstance(arguments, ToolCall) else None)
        kwargs = self.validate(arguments)
        if isinstance(kwargs, ToolResult):
            return kwargs.model_copy(update={"call_id": call_id})
        try:
            built = self.fn(**kwargs)
        except Exception as exc:
            return self._error(exc, call_id)
        if not isinstance(built, DFlow):
            return ToolResult.failure(
                self.name,
                f"Error: flow tool '{self.name}' returned {type(built).__name__}, not a DFlow.",
                error="TypeError",
                call_id=call_id,
            )
        return built

    def result(self, value: Any, *, call_id: str | None = None) -> ToolResult:
        """The ``ToolResult`` for a value this tool produced (a flow tool's final value)."""
        return ToolResult.of(self.name, value, call_id=call_id)

    def _error(self, exc: Exception, call_id: str | None) -> ToolResult:
        kind = type(exc).__name__
        return ToolResult.failure(
            self.name,
            f"Error: tool '{self.name}' failed: {kind}: {_shorten(str(exc), 500)}",
            error=kind,
            call_id=call_id,
        )

    async def _invoke(self, kwargs: dict[str, Any], timeout: float | None) -> Any:
        if self._is_async:
            work: Any = self.fn(**kwargs)
        elif self.in_thread or timeout is not None:
            work = asyncio.to_thread(self.fn, **kwargs)
        else:
            return self.fn(**kwargs)
        if timeout is None:
            return await work
        task = asyncio.ensure_future(work)
        try:
            done, _ = await asyncio.wait({task}, timeout=timeout)
        except asyncio.CancelledError:  # the caller gave up (a step timeout): so does the tool
            task.cancel()
            raise
        if not done:
            task.cancel()  # an async tool is cancelled; a thread cannot be, it finishes alone
            await asyncio.wait({task}, timeout=1.0)
            raise _TimedOut
        return task.result()


class _TimedOut(Exception):
    pass


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    strict: bool = False,
    timeout: float | None = None,
    flow: bool | None = None,
    in_thread: bool = False,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    strict: bool = False,
    timeout: float | None = None,
    flow: bool | None = None,
    in_thread: bool = False,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a :class:`Tool` of a typed function: ``@tool`` or ``@tool(timeout=5, ...)``.

    The schema comes from the type hints (pydantic), the description from the docstring's
    first paragraph, argument descriptions from its ``Args:`` section or from
    ``Annotated[..., Field(description=...)]``.

    Args:
        name: the name the model calls (default: the function's name).
        description: replaces the docstring's first paragraph.
        strict: send an OpenAI strict schema (closed objects, every field required, optional
            fields nullable) and refuse unknown arguments.
        timeout: seconds before the call is abandoned with a failed result; a sync tool with
            a timeout runs in a thread. ``None``: the caller's default (an agent's
            ``AgentLimits.tool_timeout``, 10 s unless set; none for ``tool.run`` alone);
            ``math.inf``: never abandoned, a sync tool then runs in the event loop's thread
            unless ``in_thread``.
        flow: force (or deny) flow-tool mode; by default a return annotation ``DFlow[...]``
            makes a flow tool.
        in_thread: run a blocking sync function in a thread.
    """
    options: dict[str, Any] = {
        "name": name,
        "description": description,
        "strict": strict,
        "timeout": timeout,
        "flow": flow,
        "in_thread": in_thread,
    }
    if fn is not None:
        return Tool(fn, **options)
    return lambda f: Tool(f, **options)


def _tool_by_reference(module: str, qualname: str) -> Tool:
    found = _lookup(module, qualname, load=True)
    if not isinstance(found, Tool):
        raise TypeError(f"{module}.{qualname} is no longer a tool in this process")
    return found


def _rebuild_tool(fn: Callable[..., Any], options: dict[str, Any]) -> Tool:
    return Tool(fn, **options)


def _lookup(module: str, qualname: str, *, load: bool = False) -> Any:
    obj: Any = importlib.import_module(module) if load else sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return obj


def _checked_name(name: str) -> str:
    if not _NAME.match(name):
        raise ValueError(
            f"tool name {name!r} is not accepted by model APIs: use 1-64 letters, digits, "
            "'_' or '-' (pass @tool(name=...))"
        )
    return name


def _checked_timeout(name: str, timeout: object) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"tool {name!r}: timeout must be a number of seconds > 0, got {timeout!r}")
    return float(timeout)


def _is_async(fn: Callable[..., Any]) -> bool:
    """Whether calling ``fn`` gives a coroutine (an ``async def``, or an object whose
    ``__call__`` is one)."""
    if inspect.iscoroutinefunction(fn):
        return True
    return not inspect.isroutine(fn) and inspect.iscoroutinefunction(type(fn).__call__)


def _signature(fn: Callable[..., Any], name: str) -> inspect.Signature:
    """The signature with its annotations evaluated (functions, partials, callable objects)."""
    try:
        return inspect.signature(fn, eval_str=True)
    except Exception as exc:
        raise TypeError(f"tool {name!r}: cannot resolve the type hints of {fn!r}: {exc}") from exc


def _returns_flow(hint: Any) -> bool:
    return hint is DFlow or typing.get_origin(hint) is DFlow


def _has_description(annotation: Any, default: Any) -> bool:
    infos = [default] if isinstance(default, FieldInfo) else []
    if typing.get_origin(annotation) is Annotated:
        infos += [m for m in annotation.__metadata__ if isinstance(m, FieldInfo)]
    return any(info.description for info in infos)


def _arguments_model(
    signature: inspect.Signature, name: str, docs: dict[str, str], strict: bool
) -> tuple[tuple[_Param, ...], type[BaseModel]]:
    """A pydantic model of the function's parameters. Fields are named ``p0``, ``p1``... with
    the parameter names as aliases, so any name works (``json``, ``model_config``...)."""
    params: list[_Param] = []
    fields: dict[str, Any] = {}
    for i, p in enumerate(signature.parameters.values()):
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            raise TypeError(
                f"tool {name!r}: parameter {p} cannot be given by name; tools take named parameters only"
            )
        annotation = Any if p.annotation is p.empty else p.annotation
        default = ... if p.default is p.empty else p.default
        extra: dict[str, Any] = {"alias": p.name}
        if p.name in docs and not _has_description(annotation, default):
            extra["description"] = docs[p.name]
        field = f"p{i}"
        fields[field] = (Annotated[annotation, Field(**extra)], default)
        params.append(_Param(p.name, field))
    config = ConfigDict(extra="forbid" if strict else "ignore", arbitrary_types_allowed=False)
    try:
        model = pydantic.create_model(f"{name}_arguments", __config__=config, **fields)
    except (pydantic.PydanticSchemaGenerationError, TypeError) as exc:
        raise TypeError(f"tool {name!r}: a parameter type has no JSON schema ({exc})") from exc
    return tuple(params), model


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _explain(name: str, exc: pydantic.ValidationError) -> str:
    problems = []
    for err in exc.errors(include_url=False):
        where = ".".join(str(part) for part in err["loc"]) or "arguments"
        problem = f"{where}: {err['msg']}"
        if err["type"] not in ("missing", "extra_forbidden"):
            problem += f" (got {_shorten(repr(err.get('input')), _INPUT_SHOWN)})"
        problems.append(problem)
    return (
        f"Error: invalid arguments for tool '{name}': "
        + "; ".join(problems)
        + ". Call the tool again with corrected arguments."
    )
