"""PlanningFlow: plan a task, run each step with an executor agent, summarise. A run is a
chain of steps that any worker runs:

1. **plan**: the planner (a ``ChatModel`` or an ``AIFunction``) is offered the ``planning``
   tool and asked for a plan; the plan it creates is kept in the run's data under an id of
   the run's own. A call that fails (bad arguments, a missing title...) goes back to it as
   the observation, up to ``plan_attempts`` replies; a reply without a planning call, or no
   planner at all, gives the default plan (three steps built from the request). A
   :class:`~dflow_agents.PlanDraft` (from a template) skips this step.
2. **steps**, one after the other (a tail ``flat_map``, so a worker that dies mid-plan costs
   only the step it was running): the first step not done is marked in progress and given
   to the executor its ``[TYPE]`` tag names (``[SEARCH] find ...`` goes to
   ``executors["search"]``; no tag or an unknown one: the default executor), run as a child
   run that reads a copy of the run's data and leaves it as it was, with a prompt showing
   the plan (offered only the tools the step names, when it names some). FINISHED marks the step completed with the agent's answer as its note; ERROR
   (``max_steps``, a failing model...) marks it blocked and goes on; TERMINATED (the agent
   gave up) marks it blocked and aborts the plan: the later steps stay not started.
3. **finalize**: the finalizer summarises the plan and the steps' results into the answer,
   once. An aborted plan is not summarised: its answer is the executor's conclusion.
"""

from __future__ import annotations

import hashlib
import inspect
import weakref
from collections.abc import Mapping
from typing import Any

from dflow import ContextStack, DFlow, Pipeline, Run

from ._ask import ask, fresh_call_ids, ids_in
from ._plan_steps import executor_key, routing_problem, step_flow
from ._plan_summary import Finalizer, note, results_text, summarise
from ._planning_options import (
    DIRECT_ANSWER_PROMPT,
    FINALIZE_PROMPT,
    PLANNER_PROMPT,
    PlanningOptions,
    default_step_prompt,
)
from ._planning_parts import checked_executors, checked_finalizer, checked_planner, executor_failed
from .agent import (
    RUNNING,
    Agent,
    AgentResult,
    AgentStatus,
    add_usage,
    check_name,
    check_session,
    dump,
    load,
    run_session,
    share_once,
    stop,
)
from .errors import ModelRetryableError
from .fallback import model_call
from .function import AIFunction
from .messages import ChatMessage, ChatResponse, Usage
from .model import ChatModel
from .options import ModelCalls, check_tool_choice
from .plan_tool import apply_call, planning_tool
from .plans import (
    Plan,
    PlanBook,
    PlanDraft,
    PlanningResult,
    PlanStepStatus,
    StepResult,
)
from .templates import PlanTemplate, PlanTemplates

__all__ = [
    "DIRECT_ANSWER_PROMPT",
    "FINALIZE_PROMPT",
    "PLANNER_PROMPT",
    "PlanningFlow",
    "PlanningOptions",
    "default_step_prompt",
]

_flows: dict[str, weakref.ref[PlanningFlow]] = {}

_DEFAULT_OPTIONS = PlanningOptions()
_DEFAULT_CALLS = ModelCalls()


class PlanningFlow:
    """Plans a task, runs each step with an executor agent, and summarises. See the
    module's docstring.

    Args:
        name: names its pipeline (``planning.<name>``), its shared object and its keys in a
            run's data; unique per process.
        executors: the agents that carry out steps: one agent, or a mapping from tag
            (``"search"`` for steps tagged ``[SEARCH]``; letters, digits, ``_`` ``-``,
            matched without regard to case) to agent.
        model: the planner and the finalizer, unless ``planner`` / ``finalizer`` say
            otherwise. ``None``: the default plan and a plain list of results.
        planner: a ``ChatModel`` or an ``AIFunction`` (returning a ``ChatResponse``) offered
            the ``planning`` tool.
        finalizer: a ``ChatModel``, an ``AIFunction`` (returning a ``ChatResponse`` or a
            ``str``), or ``fn(request, plan, steps) -> str`` (sync or async).
        options: the default executor, the executors' descriptions, the prompts, the
            default plan and the planner's attempts (:class:`PlanningOptions`).
        model_calls: a planner or finalizer call that fails with a retryable error (rate
            limit, timeout) is made again, on a store timer; request options for a
            ``ChatModel``; the planner's ``tool_choice`` (``"planning"`` or ``"required"``
            make it call the planning tool, where the server honours it) and whether it
            reads calls written as text (:class:`ModelCalls`).
    """

    def __init__(
        self,
        name: str,
        executors: Agent | Mapping[str, Agent],
        model: ChatModel | AIFunction[Any] | None = None,
        *,
        planner: ChatModel | AIFunction[Any] | None = None,
        finalizer: ChatModel | AIFunction[Any] | Finalizer | None = None,
        options: PlanningOptions = _DEFAULT_OPTIONS,
        model_calls: ModelCalls = _DEFAULT_CALLS,
    ) -> None:
        self.name = check_name(name, "planning flow")
        if not isinstance(options, PlanningOptions):
            raise TypeError(f"options is a PlanningOptions(...), got {options!r:.80}")
        if not isinstance(model_calls, ModelCalls):
            raise TypeError(f"model_calls is a ModelCalls(...), got {model_calls!r:.80}")
        self.executors = checked_executors(executors)
        self.default_executor = options.routed(self.executors)
        self.planner = checked_planner(planner if planner is not None else model)
        if not callable(model_calls.tool_choice):
            check_tool_choice(model_calls.tool_choice, [planning_tool.name])
        self.finalizer = checked_finalizer(finalizer if finalizer is not None else model)
        self.options = options
        self.model_calls = model_calls
        self._state_key = f"dflow_agents/planning/{name}"
        share_once(
            _flows,
            self,
            name,
            f"dflow_agents.planning:{name}",
            "planning flow",
            "runs of either go to the second (give each its own name)",
            stacklevel=2,
        )
        entry = f"planning.{name}"
        self.pipeline: Pipeline[PlanningResult] = self._retrying(
            DFlow.from_call(entry).map(self._start).id("start").flat_map(self._plan).id("plan")
        ).init(entry)

    def _retrying(self, flow: DFlow[Any]) -> DFlow[Any]:
        """``flow`` (a planner or finalizer call last) retried on a retryable model error."""
        calls = self.model_calls
        return flow.retry(calls.attempts, backoff=calls.retry_backoff, on=ModelRetryableError)

    def __repr__(self) -> str:
        return f"<PlanningFlow {self.name!r}: {', '.join(self.executors)}>"

    # -- running -----------------------------------------------------------------------

    def run(
        self, request: str | PlanDraft, *, session: str | None = None, trace_id: str | None = None
    ) -> Run[PlanningResult]:
        """Start a run on ``request`` (a ``PlanDraft``: run that plan, no planner call);
        ``run.result()`` is the :class:`PlanningResult`. ``session`` goes to the executors."""
        return self.pipeline.call(self._request(request, session), trace_id=trace_id)

    async def arun(
        self, request: str | PlanDraft, *, session: str | None = None, trace_id: str | None = None
    ) -> Run[PlanningResult]:
        """``run`` for async code."""
        return await self.pipeline.acall(self._request(request, session), trace_id=trace_id)

    def run_template(
        self,
        template: PlanTemplate,
        parameters: Mapping[str, str],
        *,
        session: str | None = None,
        trace_id: str | None = None,
    ) -> Run[PlanningResult]:
        """Run the plan of ``template`` filled with ``parameters`` (``ValueError`` when one is
        missing or unknown)."""
        return self.run(template.fill(parameters), session=session, trace_id=trace_id)

    async def arun_template(
        self,
        templates: PlanTemplates,
        name: str,
        parameters: Mapping[str, str],
        *,
        version: int | None = None,
        session: str | None = None,
        trace_id: str | None = None,
    ) -> Run[PlanningResult]:
        """Load template ``name`` (its latest version unless ``version``) from ``templates``
        and run its plan filled with ``parameters``."""
        template = await templates.get(name, version)
        return await self.arun(template.fill(parameters), session=session, trace_id=trace_id)

    def flow(self, request: str | PlanDraft, *, session: str | None = None) -> DFlow[PlanningResult]:
        """The planning flow to embed in another flow (in a ``flat_map``): its plan is kept
        in the caller's run."""
        return self._retrying(
            DFlow.just(self._request(request, session))
            .map(self._start)
            .id(f"{self.name}.start")
            .flat_map(self._plan)
            .id(f"{self.name}.plan")
        )

    def _request(self, request: str | PlanDraft, session: str | None) -> dict[str, Any]:
        if isinstance(request, PlanDraft):
            return {
                "request": request.request or request.title,
                "session": check_session(session),
                "draft": request.model_dump(mode="json"),
            }
        if not isinstance(request, str):
            raise TypeError(
                "a planning flow starts from a request (str) or a PlanDraft, "
                f"got {type(request).__qualname__}"
            )
        if not request.strip():
            raise ValueError("the request is empty: say what the plan is for")
        return {"request": request, "session": check_session(session), "draft": None}

    # -- planning ----------------------------------------------------------------------

    def _start(self, ctx: ContextStack, request: Any) -> dict[str, Any]:
        """The run's state; a given plan (a draft) is stored at once."""
        if isinstance(request, str):  # pipeline.call("the request")
            request = self._request(request, None)
        if not isinstance(request, dict) or not isinstance(request.get("request"), str):
            raise TypeError(
                f"{self!r} starts from a request (str) or {{'request': str, ...}}, got {request!r:.200}"
            )
        plan_id = "plan_" + hashlib.sha256(ctx.idempotency_key.encode()).hexdigest()[:12]
        state: dict[str, Any] = {
            "plan_id": plan_id,
            "request": request["request"],
            "session": run_session(ctx, request.get("session")),
            "status": RUNNING,
            "reason": "",
            "answer": "",
            "source": "model",
            "template": None,
            "attempt": 0,
            "messages": [],
            "steps": [],
            "current": None,
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        }
        if request.get("draft") is not None:
            draft = PlanDraft.model_validate(request["draft"])
            PlanBook(ctx).create(plan_id, draft.title, draft.steps)
            state.update(source="template" if draft.template else "given", template=draft.template)
        return state

    async def _plan(self, ctx: ContextStack, state: dict[str, Any]) -> DFlow[PlanningResult]:
        """One reply of the planner, then the first step; or another reply, after a failed call."""
        book = PlanBook(ctx)
        if book.get(state["plan_id"]) is not None:
            return await self._next(ctx, state)
        if self.planner is None:
            return await self._next(ctx, self._fallback(book, state, "no planner was given"))
        state = dict(state)
        messages = load(state["messages"]) or self._planner_messages(state["request"])
        try:
            response = await self._ask_planner(messages, state["attempt"])
        except ModelRetryableError as exc:
            if ctx.attempt + 1 < self.model_calls.attempts:
                raise  # the plan step's retry policy calls again
            why = f"the planner failed {self.model_calls.attempts} times; last: {exc}"
            return self._end(stop(state, AgentStatus.ERROR, why))
        except Exception as exc:
            why = f"the planner failed: {type(exc).__name__}: {exc}"
            return self._end(stop(state, AgentStatus.ERROR, why))
        add_usage(state, response.usage)
        state["model_call"] = model_call(response)  # which model planned, and those skipped
        calls = fresh_call_ids(response.tool_calls, state["attempt"], ids_in(messages))
        if not calls:
            if self.options.direct_answer and response.content.strip():
                state["source"] = "direct"
                why = "the planner answered at once: the request needed no plan"
                return self._end(stop(state, AgentStatus.FINISHED, why, response.content))
            state = self._fallback(book, state, "the planner did not call the planning tool")
            return await self._next(ctx, state)
        observations = [self._apply(book, call, state["plan_id"]) for call in calls]
        if book.get(state["plan_id"]) is not None:
            return await self._next(ctx, state)
        state["attempt"] += 1
        if state["attempt"] >= self.options.plan_attempts:
            why = f"the planner's calls failed {self.options.plan_attempts} times; last: {observations[-1].content}"
            return await self._next(ctx, self._fallback(book, state, why))
        state["messages"] = dump([*messages, ChatMessage.assistant(response.content, calls), *observations])
        return self._retrying(DFlow.just(state).flat_map(self._plan).id("plan"))

    def _apply(self, book: PlanBook, call: Any, plan_id: str) -> ChatMessage:
        """A planning call carried out; a plan naming an agent or tool the flow does not
        have is taken back, and the call's observation says what to change."""
        observation = apply_call(book, call, plan_id=plan_id)
        plan = book.get(plan_id)
        problem = plan and routing_problem(
            plan.steps, plan.step_details, self.executors, self.default_executor
        )
        if not problem:
            return observation
        book.delete(plan_id)
        text = f"Error: {problem}. Call the planning tool again with corrected arguments."
        return observation.model_copy(update={"content": text})

    def _planner_messages(self, request: str) -> list[ChatMessage]:
        system = self.options.planner_prompt
        if len(self.executors) > 1:
            lines = [
                f"[{k.upper()}]: {self.options.descriptions.get(k, 'the ' + a.name + ' agent')}"
                + (f" (tools: {', '.join(getattr(a, 'tools', {}))})" if getattr(a, "tools", None) else "")
                for k, a in self.executors.items()
            ]
            system += (
                "\n\nEach step is carried out by one of these agents. Start a step's text with the tag of "
                "the agent that should do it; a step without a tag goes to "
                f"[{self.default_executor.upper()}].\n" + "\n".join(lines)
            )
        if self.options.direct_answer:
            system += "\n\n" + DIRECT_ANSWER_PROMPT
        return [
            ChatMessage.system(system),
            ChatMessage.user(f"Create a plan with clear steps to accomplish this task: {request}"),
        ]

    async def _ask_planner(self, messages: list[ChatMessage], attempt: int) -> ChatResponse:
        assert self.planner is not None
        return await ask(
            self.planner, messages, [planning_tool.spec], self.model_calls, turn=attempt, who="the planner"
        )

    def _fallback(self, book: PlanBook, state: dict[str, Any], why: str) -> dict[str, Any]:
        draft = self.options.default_plan(state["request"])
        if not isinstance(draft, PlanDraft):
            raise TypeError(f"default_plan returned {type(draft).__name__}, not a PlanDraft")
        book.create(state["plan_id"], draft.title, draft.steps)
        return {**state, "source": "default", "reason": f"the default plan was used: {why}"}

    # -- the steps ---------------------------------------------------------------------

    def _executor_for(self, plan: Plan, index: int) -> str:
        key = executor_key(plan.steps[index], plan.step_details[index], self.executors, self.default_executor)
        return key if key in self.executors else self.default_executor

    async def _step_prompt(self, state: dict[str, Any], plan: Plan, index: int) -> str:
        prompt = self.options.step_prompt(state["request"], plan, index)
        if inspect.isawaitable(prompt):
            prompt = await prompt
        if not isinstance(prompt, str):
            raise TypeError(f"step_prompt returned {type(prompt).__name__}, not a str")
        return prompt

    async def _next(self, ctx: ContextStack, state: dict[str, Any]) -> DFlow[PlanningResult]:
        """Give the first step not done to its executor (a child run), with the parallel
        steps right after it (a zip of child runs); or finalize."""
        if state["status"] != RUNNING:
            return self._end(state)
        book = PlanBook(ctx)
        plan = book.get(state["plan_id"])
        if plan is None:
            why = f"the plan {state['plan_id']!r} is gone from the run"
            return self._end(stop(dict(state), AgentStatus.ERROR, why))
        index = plan.next_step()
        if index is None:
            return self._retrying(DFlow.just(state).map(self._finalize).id("finalize"))
        group = plan.parallel_group(index)
        keys = [self._executor_for(plan, i) for i in group]
        for i in group:
            plan = plan.with_step(i, PlanStepStatus.IN_PROGRESS)
        book.put(plan)
        prompts = [await self._step_prompt(state, plan, i) for i in group]
        ctx.put(self._state_key, {**state, "current": [[i, k] for i, k in zip(group, keys)]})
        details = [plan.step_details[i] for i in group]
        flows = [
            step_flow(self.executors[k], p, d, state["session"]) for k, p, d in zip(keys, prompts, details)
        ]
        executor: DFlow[Any]
        if len(flows) == 1:
            executor = DFlow.any(flows[0], merge=False).id("executor").on_error_return(executor_failed)
        else:
            branches = [f.on_error_return(executor_failed) for f in flows]
            executor = DFlow.zip(branches, merge=False).id("executors")
        return executor.map(self._record).id("record").flat_map(self._next).id("next")

    def _record(self, ctx: ContextStack, outcome: Any) -> dict[str, Any]:
        """Mark the steps just run with how their agents ended (in plan order); a
        TERMINATED agent aborts the plan."""
        state = dict(ctx.get(self._state_key))
        current = state["current"]
        if isinstance(current, dict):  # a run started before parallel steps
            current = [[current["index"], current["executor"]]]
        outcomes = outcome if len(current) > 1 else [outcome]
        book = PlanBook(ctx)
        results = [self._mark(book, state, i, k, o) for (i, k), o in zip(current, outcomes)]
        state["steps"] = [*state["steps"], *(r.model_dump(mode="json") for r in results)]
        state["current"] = None
        gave_up = next((r for r in results if r.status is AgentStatus.TERMINATED), None)
        if gave_up is not None:
            stop(
                state,
                AgentStatus.TERMINATED,
                f"the plan was aborted at step {gave_up.index} ({gave_up.step!r}): "
                f"the agent {gave_up.agent!r} gave up: "
                f"{gave_up.reason}",
                gave_up.answer,
            )
        return state

    def _mark(self, book: PlanBook, state: dict[str, Any], index: int, key: str, outcome: Any) -> StepResult:
        """Step ``index`` marked with how its agent ended; its usage added to ``state``."""
        plan = book.get(state["plan_id"])
        assert plan is not None, "the plan of a running step is in the run's data"
        if isinstance(outcome, AgentResult):
            result = outcome
            add_usage(state, result.usage)
        else:
            result = AgentResult(status=AgentStatus.ERROR, reason=str(outcome.get("__error__", outcome)))
        if result.status is AgentStatus.FINISHED:
            book.put(plan.with_step(index, PlanStepStatus.COMPLETED, note(result.answer or "(no answer)")))
        else:
            said = f"{result.status.value}: {result.reason}" + (f". {result.answer}" if result.answer else "")
            book.put(plan.with_step(index, PlanStepStatus.BLOCKED, note(said)))
        return StepResult(
            index=index,
            step=plan.steps[index],
            executor=key,
            agent=self.executors[key].name,
            status=result.status,
            answer=result.answer,
            reason=result.reason,
        )

    # -- the end -----------------------------------------------------------------------

    async def _finalize(self, ctx: ContextStack, state: dict[str, Any]) -> PlanningResult:
        """Summarise the plan and its results into the answer."""
        state = dict(state)
        plan = PlanBook(ctx).get(state["plan_id"])
        assert plan is not None
        steps = [StepResult.model_validate(s) for s in state["steps"]]
        try:
            answer = await self._summary(state, plan, steps)
        except ModelRetryableError as exc:
            if ctx.attempt + 1 < self.model_calls.attempts:
                raise
            answer = results_text(steps)
            state["reason"] = (
                f"every step was run; the finalizer failed {self.model_calls.attempts} times: {exc}"
            )
        except Exception as exc:
            answer = results_text(steps)
            state["reason"] = f"every step was run; the finalizer failed: {type(exc).__name__}: {exc}"
        else:
            state["reason"] = state["reason"] or "every step was run and the plan summarised"
        stop(state, AgentStatus.FINISHED, state["reason"], answer)
        return self._result(ctx, state)

    async def _summary(self, state: dict[str, Any], plan: Plan, steps: list[StepResult]) -> str:
        answer, usage = await summarise(
            self.finalizer,
            prompt=self.options.finalize_prompt,
            options=self.model_calls.options,
            request=state["request"],
            plan=plan,
            steps=steps,
        )
        if usage is not None:
            add_usage(state, usage)
        return answer

    def _end(self, state: dict[str, Any]) -> DFlow[PlanningResult]:
        return DFlow.just(state).map(self._result).id("result")

    def _result(self, ctx: ContextStack, state: dict[str, Any]) -> PlanningResult:
        plan = PlanBook(ctx).get(state["plan_id"])
        return PlanningResult(
            status=AgentStatus(state["status"]),
            answer=state["answer"],
            reason=state["reason"],
            plan=plan,
            plan_text=plan.text() if plan is not None else "",
            source=state["source"],
            template=state["template"],
            steps=[StepResult.model_validate(s) for s in state["steps"]],
            usage=Usage.model_validate(state["usage"]),
            session=state["session"],
        )
