"""Trace ids: what a run may be called, and the ids its zip/any branches get.

A user's trace id is 1 to 128 characters from ``A-Z a-z 0-9 _ . : @ -``. A branch run is
named ``<parent>/<fork step seq>-<branch index>`` (nested branches append again), a form
no user id can take, so a user's run can never be overwritten by, or read as, a branch.
Step messages carry ids of either kind; the store's scripts apply the same rule.
"""

from __future__ import annotations

import re

from ..errors import InvalidTraceIdError

__all__ = ["MAX_ID", "branch_id", "check_trace_id", "is_run_id"]

MAX_ID = 128  #: characters of a user's trace id
MAX_RUN_ID = 1024  #: characters of any run id, branches of branches included
_USER = re.compile(r"[A-Za-z0-9_.:@-]{1,128}")
_RUN = re.compile(r"[A-Za-z0-9_.:@-]{1,128}(?:/[0-9]+-[0-9]+)*")
ALLOWED = "letters, digits and _ . : @ -"


def check_trace_id(trace_id: object, what: str = "trace id") -> str:
    """``trace_id`` if a user may name a run so; ``InvalidTraceIdError`` saying why not."""
    if not isinstance(trace_id, str):
        raise InvalidTraceIdError(
            f"a {what} is a str, got {type(trace_id).__qualname__}", trace_id=repr(trace_id)
        )
    if _USER.fullmatch(trace_id) is None:
        shown = trace_id if len(trace_id) <= 60 else trace_id[:57] + "..."
        why = (
            "is empty"
            if not trace_id
            else (
                f"is {len(trace_id)} characters long (at most {MAX_ID})"
                if len(trace_id) > MAX_ID
                else "contains '/', which only branch runs of zip/any have"
                if "/" in trace_id
                else f"may only contain {ALLOWED}"
            )
        )
        raise InvalidTraceIdError(f"the {what} {shown!r} {why}", trace_id=shown)
    return trace_id


def is_run_id(trace_id: object) -> bool:
    """Whether ``trace_id`` can name a run: a user's id or a branch's."""
    if type(trace_id) is str and len(trace_id) <= MAX_ID and trace_id.isascii() and trace_id.isalnum():
        return bool(trace_id)  # the common case (a uuid's hex), without the pattern
    return isinstance(trace_id, str) and len(trace_id) <= MAX_RUN_ID and _RUN.fullmatch(trace_id) is not None


def branch_id(parent: str, seq: int, index: int) -> str:
    """The id of branch ``index`` of the zip/any at step ``seq`` of run ``parent``."""
    return f"{parent}/{seq}-{index}"
