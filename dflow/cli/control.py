"""The commands that act on runs: ``dflow cancel``, ``dflow rerun`` and ``dflow call`` (the
answer to a run's ``from_call``). Each changes the store, then publishes what the change
released (a store that dispatches in its own scripts needs no transport)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING

from ..errors import RunError
from ..ops.tree import safe
from .options import add_store, add_transport, store_url

if TYPE_CHECKING:
    from ..store import Store
    from ..transport import Transport
    from ..wire.values import Message

_MAX_PAYLOAD = 8 * 1024 * 1024  # bytes: a worker's default max_value_bytes
_RELEASED = (
    " (to publish at once what it releases; else the store's outbox hands it out within its redispatch time)"
)


def register_cancel(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    c = sub.add_parser("cancel", help="cancel a run: it ends CANCELLED, with its waits, timers and branches")
    c.add_argument("trace_id", metavar="TRACE_ID")
    c.add_argument("--reason", default="cancelled from the command line", help="recorded on the run")
    add_store(c)
    add_transport(c, _RELEASED)


def register_rerun(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    rr = sub.add_parser(
        "rerun",
        help="rerun an ended run from a step: the steps before it replayed from its "
        "records, the rest run with the code deployed now; prints the new trace id",
    )
    rr.add_argument("trace_id", metavar="TRACE_ID")
    rr.add_argument(
        "--from",
        dest="seq",
        type=int,
        required=True,
        metavar="SEQ",
        help="the step to rerun from (its number, #SEQ in dflow inspect)",
    )
    rr.add_argument(
        "--again",
        action="store_true",
        help="rerun a run that was rerun already (else refused, naming its rerun: its steps would run twice)",
    )
    add_store(rr)
    add_transport(rr, _RELEASED)


def register_call(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cl = sub.add_parser(
        "call",
        help="answer a run waiting in from_call(CALL_TYPE) with a JSON value",
        description="Deliver PAYLOAD (JSON; default null) to run TRACE_ID, waiting in "
        "from_call(CALL_TYPE): the run goes on with it, as DFlow.call(CALL_TYPE, payload, "
        "TRACE_ID) does. A run that goes on but does not wait for the call yet keeps it in its "
        "mailbox until it does (--if-waiting: refuse it instead, exit status 1).",
    )
    cl.add_argument("trace_id", metavar="TRACE_ID")
    cl.add_argument("call_type", metavar="CALL_TYPE")
    cl.add_argument(
        "payload", metavar="PAYLOAD", nargs="?", default="null", help="a JSON value (default null)"
    )
    cl.add_argument(
        "--if-waiting",
        action="store_true",
        help="deliver the call only if the run waits for it now; else fail (exit status 1)",
    )
    add_store(cl)
    add_transport(cl, _RELEASED)


def _checked_id(trace_id: str) -> None:
    from ..wire.ids import check_trace_id, is_run_id

    if not is_run_id(trace_id):
        check_trace_id(trace_id)  # says what is wrong with it


async def _publish(store: Store, transport_url: str | None, messages: list[Message]) -> None:
    from ..runtime.connect import transport_from_url
    from ..store import FusedDispatch

    if not messages or not transport_url or isinstance(store, FusedDispatch):
        return
    transport = transport_from_url(transport_url)
    try:
        await _send(transport, messages)
    finally:
        await transport.close()


async def _send(transport: Transport, messages: list[Message]) -> None:
    from ..runtime.dispatch import route

    await transport.publish_many([(m.encode(), route(m)) for m in messages])


async def cancel(args: argparse.Namespace) -> int:
    from ..runtime.connect import store_from_url

    _checked_id(args.trace_id)
    store = store_from_url(store_url(args))
    try:
        before = await store.get_run(args.trace_id)
        if before is None:
            print(f"dflow cancel: no run {safe(args.trace_id)} in this store", file=sys.stderr)
            return 1
        if before.status.finished:
            print(
                f"dflow cancel: run {safe(args.trace_id)} has already ended {before.status.value}: "
                "nothing to cancel",
                file=sys.stderr,
            )
            return 1
        info, publish = await store.cancel(args.trace_id, args.reason)
        if info is None:  # (it expired in between)
            print(f"dflow cancel: no run {safe(args.trace_id)} in this store", file=sys.stderr)
            return 1
        await _publish(store, args.transport, publish)
        print(f"{safe(args.trace_id)}: {info.status.value}")
        return 0
    finally:
        await store.close()


async def rerun(args: argparse.Namespace) -> int:
    from ..model.chains import ChainCodec
    from ..patterns.rerun import start_rerun
    from ..runtime.connect import store_from_url

    _checked_id(args.trace_id)
    chains = ChainCodec(
        os.environ.get("DFLOW_SECRET")
    )  # the new run's frames are signed: the workers' secret
    store = store_from_url(store_url(args))
    try:
        try:
            trace_id, publish = await start_rerun(store, chains, args.trace_id, args.seq, again=args.again)
        except RunError as exc:
            print(f"dflow rerun: {safe(exc)}", file=sys.stderr)
            return 1
        await _publish(store, args.transport, publish)
        print(trace_id)
        return 0
    finally:
        await store.close()


async def call(args: argparse.Namespace) -> int:
    from ..mailbox import DEFAULT_MAILBOX
    from ..runtime.connect import store_from_url
    from ..store import FusedDispatch
    from ..wire.values import encode

    _checked_id(args.trace_id)
    try:
        payload = json.loads(args.payload)
    except json.JSONDecodeError as exc:
        print(
            f"dflow call: PAYLOAD is not JSON ({exc}): quote it for the shell, e.g. '{{\"ok\": true}}' "
            "or '\"a string\"'",
            file=sys.stderr,
        )
        return 2
    body = encode(payload, f"the payload of call {args.call_type!r}")
    if len(body) > _MAX_PAYLOAD:
        print(
            f"dflow call: the payload is {len(body)} bytes, over the limit of {_MAX_PAYLOAD}", file=sys.stderr
        )
        return 2
    store = store_from_url(store_url(args))
    try:
        try:
            keep = None if args.if_waiting else DEFAULT_MAILBOX
            publish = await store.resume(args.trace_id, args.call_type, body, keep=keep)
        except RunError as exc:  # no such run, it has ended, does not wait (--if-waiting), a full mailbox
            print(f"dflow call: {safe(exc)}", file=sys.stderr)
            return 1
        await _publish(store, args.transport, publish)
        if publish or isinstance(store, FusedDispatch):  # (a fused store publishes itself)
            print(f"{safe(args.trace_id)}: delivered {safe(args.call_type)!s}")
        else:
            print(f"{safe(args.trace_id)}: kept {safe(args.call_type)!s} until the run waits for it")
        return 0
    finally:
        await store.close()
