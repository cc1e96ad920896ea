"""``dflow circuits`` (the circuit breakers in use, with their state), and the lines on
circuits that ``dflow inspect`` adds under a run whose steps a circuit refused."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import re
import sys
import time
from typing import TYPE_CHECKING

from ..errors import ConfigurationError, DFlowError
from ..ops.tree import safe
from .options import add_store, store_url

if TYPE_CHECKING:
    from ..patterns.circuit import CircuitState
    from ..store import Store


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cb = sub.add_parser(
        "circuits", help="list the circuit breakers used within the last day, with their state"
    )
    add_store(cb)
    cb.add_argument("--json", action="store_true", help="print JSON (times in seconds since the epoch)")


#: what a step that a circuit refused recorded: the type and the start of the message
_OPEN_ERROR = "dflow.errors.CircuitOpenError"
_OPEN_MESSAGE = re.compile(r"circuit ('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\") is (open|a probe is out)")


async def _failed_fast(store: Store, trace_id: str, found: dict[str, list[str]], depth: int = 0) -> None:
    """Add to ``found`` the steps of run ``trace_id`` (and of its branches) that a circuit
    refused: by circuit name, the state each found it in."""
    from ..ops.tree import branch_runs

    for rec in await store.get_steps(trace_id):
        error = rec.error or {}
        match = (
            _OPEN_MESSAGE.match(str(error.get("message", ""))) if error.get("type") == _OPEN_ERROR else None
        )
        try:
            name = ast.literal_eval(match.group(1)) if match is not None else None
        except (ValueError, SyntaxError):  # (not a message of ours)
            name = None
        if match is not None and isinstance(name, str):
            found.setdefault(name, []).append(
                "open" if match.group(2) == "open" else "half-open (a probe out)"
            )
        if depth < 8:
            for child in branch_runs(rec):
                await _failed_fast(store, child, found, depth + 1)


async def circuit_notes(store: Store, trace_id: str) -> list[str]:
    """For ``dflow inspect``: the circuits that refused steps of the run, and their state now."""
    from ..patterns.circuit import _known_circuits

    found: dict[str, list[str]] = {}
    await _failed_fast(store, trace_id, found)
    if not found:
        return []
    try:
        now: dict[str, CircuitState] | None = {c.name: c for c in await _known_circuits(store.shared_state)}
    except DFlowError:  # a store without circuits, or it failed: the records still say what happened
        now = None
    lines = ["circuits that failed steps fast (the call was refused, the dependency not called):"]
    for name, states in sorted(found.items()):
        seen = " or ".join(sorted(set(states)))
        state = "unknown" if now is None else _circuit_now(now.get(name), time.time())
        lines.append(
            f"  {safe(name)}: {len(states)} step{'s' if len(states) > 1 else ''} refused while {seen}; "
            f"now {state}"
        )
    return lines


def _circuit_now(c: CircuitState | None, now: float) -> str:
    if c is None:
        return "not used within the last day"
    window = f" in {c.config.window:g}s" if c.config else ""
    if c.state == "closed":
        return f"closed ({c.failures}{'/' + str(c.config.failures) if c.config else ''} failures{window})"
    if c.state == "open":
        return f"open (a probe may go in {max(0.0, c.retry_at - now):.1f}s)"
    return "half-open (a probe is out)" if c.probing else "half-open (the next call is the probe)"


async def run(args: argparse.Namespace) -> int:
    from ..patterns.circuit import _known_circuits
    from ..runtime.connect import store_from_url
    from ..wire.urls import redact_url

    store = store_from_url(store_url(args))
    try:
        circuits = await _known_circuits(store.shared_state)
    except ConfigurationError:
        raise
    except DFlowError as exc:
        print(
            f"dflow circuits: cannot read the circuits of {redact_url(args.store)}: {safe(exc)}",
            file=sys.stderr,
        )
        return 2
    finally:
        await store.close()
    if args.json:
        print(json.dumps([dataclasses.asdict(c) for c in circuits], indent=2))
        return 0
    if not circuits:
        print("no circuit breaker was used with this store within the last day")
        return 0
    now = time.time()
    width = min(40, max(7, *(len(safe(c.name)) for c in circuits)))
    print(f"{'CIRCUIT':<{width}} {'STATE':<9} {'FAILURES':<14} {'OPENED':<19}  PROBE")
    for c in circuits:
        name = safe(c.name)
        name = name if len(name) <= width else name[: width - 1] + "~"
        failures = (
            f"{c.failures}/{c.config.failures} in {c.config.window:g}s" if c.config else str(c.failures)
        )
        opened = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(c.opened_at)) if c.opened_at else "-"
        if c.state == "open":
            probe = f"may go in {max(0.0, c.retry_at - now):.1f}s"
        elif c.state == "half_open":
            probe = f"out (lease {max(0.0, c.retry_at - now):.1f}s)" if c.probing else "may go now"
        else:
            probe = "-"
        state = "half-open" if c.state == "half_open" else c.state
        print(f"{name:<{width}} {state:<9} {failures:<14} {opened:<19}  {probe}")
    return 0
