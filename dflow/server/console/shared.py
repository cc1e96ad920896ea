"""What the console's pages (``routes``) and JSON routes (``api``) share: the
:class:`Console` (the server, the login, the open event streams, the store of this
process's runtime, the static files) and the query of the runs list."""

from __future__ import annotations

from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any, TypeVar

from fastapi import Request

from ...context import RunInfo, RunStatus
from ...errors import ConfigurationError, RunNotFoundError
from ...patterns.rerun import RERUN_KEY, link_of, replayed_until
from ...run_notes import MAX_KEY_LENGTH, RunNotes, check_business_key
from ...run_pages import ANY_TIME, StartedWindow, find_in_window, page_in_window, parse_sort, parse_started
from ...store import RunPage, Store
from ...wire.ids import is_run_id
from ...workers import WorkerBeat
from ..errors import InvalidRequest, MalformedRequest, NotFound
from ..runs import on_runtime, runtime_store
from .auth import ConsoleAuth, Credential
from .html import conversation_html, head_html, waits_html
from .timeline_html import timeline_html
from .tree import RunTree
from .tree_html import tree_html
from .views import conversations

if TYPE_CHECKING:
    from ..server import Server

__all__ = ["STATIC", "Console", "RunsList", "list_runs"]

T = TypeVar("T")

#: the files under /console/static/: nothing else is served from there
STATIC = {"console.css": "text/css; charset=utf-8", "console.js": "text/javascript; charset=utf-8"}
# characters: a pipeline's name has no limit of its own (by default it is its head key, which
# can be long), so any name that fits in a request is taken
_MAX_FILTER = {
    "pipeline": 16_384,
    "cursor": 2048,
    "after": 40,
    "before": 40,
    "id": 300,
    "key": MAX_KEY_LENGTH,
}


class Console:
    """What the console's routes share: the server, who may log in, the open event
    streams, and reading runs from the process's runtime."""

    def __init__(
        self,
        server: Server,
        admin_token: str | None,
        *,
        ttl: float = 8 * 3600.0,
        max_streams: int = 128,
        max_streams_per_login: int = 8,
    ) -> None:
        self.server = server
        self.auth = ConsoleAuth(admin_token, ttl=ttl)
        self.max_streams = max_streams
        self.max_streams_per_login = max_streams_per_login
        self.streams: dict[str, int] = {}  # open event streams by login
        self._static: dict[str, bytes] = {}

    # -- the store of this process's runtime ---------------------------------------------------

    async def on_store(self, work: Coroutine[Any, Any, T]) -> T:
        """Await ``work`` on the runtime's loop (where its store lives)."""
        return await on_runtime(work)

    @property
    def store(self) -> Store:
        """The store of this process's runtime."""
        return runtime_store()

    def check_run_id(self, trace_id: str) -> str:
        """``trace_id`` if it may name a run (a branch's too); 404 otherwise, saying why."""
        if not is_run_id(trace_id):
            raise NotFound(
                f"{trace_id[:80]!r} is not a run id: runs are named with letters, digits and _ . : @ - "
                "(a branch adds /<step>-<index>)"
            )
        return trace_id

    async def run_info(self, trace_id: str) -> RunInfo:
        """The run's state; 404 when there is no such run."""
        info = await self.on_store(self.store.get_run(self.check_run_id(trace_id)))
        if info is None:
            raise RunNotFoundError(
                f"no run {trace_id[:200]!r} (never started, or expired)", trace_id=trace_id
            )
        return info

    async def workers(self) -> list[WorkerBeat]:
        """The workers alive (``dflow.workers``), by id: one read of the store's beats."""
        return await self.on_store(self.store.worker_beats.alive())

    async def tree(self, trace_id: str) -> RunTree:
        """The run's step tree, read."""
        tree = RunTree(self.store, self.check_run_id(trace_id))
        await self.on_store(tree.refresh())
        return tree

    async def parts(self, tree: RunTree) -> dict[str, Any]:
        """A run page's parts (HTML) and state, as the page and its live updates show them."""
        info = tree.root.info
        raw = await self.on_store(self.store.get_data(tree.root.trace_id)) if info is not None else {}
        rerun_of = _rerun_of(raw, tree.root.trace_id)
        replayed_below = replayed_until(raw, tree.root.trace_id)  # (as ``dflow inspect`` marks them)
        return {
            "trace_id": tree.root.trace_id,
            "status": info.status.value if info is not None else None,
            "finished": info is None or (info.status.finished and not tree.live),
            "rerun_of": None if rerun_of is None else {"trace_id": rerun_of[0], "seq": rerun_of[1]},
            "reruns": list(info.reruns) if info is not None else [],
            "business_key": info.business_key if info is not None else None,
            "head": head_html(
                info, tree.root.trace_id, info.pipeline if info is not None else None, rerun_of
            ),
            "waits": waits_html(tree.waits(), tree.root.trace_id),
            "tree": tree_html(tree, replayed_below),
            "timeline": timeline_html(tree, replayed_below),
            "conversation": conversation_html(conversations(raw)),
        }

    # -- requests ---------------------------------------------------------------------------------

    def csrf(self, credential: Credential) -> str:
        """The anti-forgery token of the pages shown to ``credential``."""
        return self.auth.csrf(credential)

    def static(self, name: str) -> bytes:
        """One of the allowed static files; 404 for any other name."""
        if name not in STATIC:
            raise NotFound(
                f"no static file {name[:80]!r}: the console serves only {', '.join(sorted(STATIC))}"
            )
        if name not in self._static:
            folder = resources.files("dflow.server.console").joinpath("static")
            self._static[name] = folder.joinpath(name).read_bytes()
        return self._static[name]


def _rerun_of(data: Mapping[str, bytes], trace_id: str) -> tuple[str, int] | None:
    link = link_of(data.get(RERUN_KEY))
    return (link.trace_id, link.seq) if link is not None and link.run == trace_id else None


# -- the runs list ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunsList:
    """A page of the runs list, with the counts by status and the query that asked for it."""

    found: RunPage
    counts: dict[RunStatus, int]
    status: RunStatus | None
    pipeline: str | None
    cursor: str | None
    limit: int
    parked: bool = False  #: only the parked runs of the page
    window: StartedWindow = ANY_TIME  #: only the runs started in it
    oldest_first: bool = False  #: the page lists the runs oldest first (``sort=oldest``)
    key: str | None = None  #: only the runs with this business key


def _parked_filter(value: str | None) -> bool:
    if not value:
        return False
    if value not in ("1", "true", "yes", "on"):
        raise InvalidRequest(f"parked is 1 (only parked runs) or left out, got {value[:20]!r}")
    return True


def _status_filter(value: str | None) -> RunStatus | None:
    if not value:
        return None
    try:
        return RunStatus(value)
    except ValueError:
        raise InvalidRequest(
            f"status {value[:40]!r} is not a run status: use one of {', '.join(s.value for s in RunStatus)}"
        ) from None


def _text_filter(name: str, value: str | None) -> str | None:
    if not value:
        return None
    if len(value) > _MAX_FILTER[name]:
        raise InvalidRequest(f"{name} is {len(value)} characters long, over the limit of {_MAX_FILTER[name]}")
    return value


def _window(after: str | None, before: str | None) -> StartedWindow:
    """The runs' start times the query keeps (``after``, ``before``: ISO 8601, UTC)."""
    try:
        return StartedWindow(
            parse_started("after", after) if after else None,
            parse_started("before", before) if before else None,
        )
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None


def _sort(value: str | None) -> bool:
    """Whether the query's ``sort`` (``newest``, the default, or ``oldest``) is oldest first."""
    try:
        return parse_sort(value or None)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None


def _limit(value: str | None) -> int:
    if value is None or value == "":
        return 50
    if not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= 200:
        raise InvalidRequest(f"limit is a number of runs from 1 to 200, got {value[:20]!r}")
    return int(value)


async def list_runs(console: Console, request: Request) -> RunsList:
    """The page of runs the query asks for: one ``page_runs`` and one ``count_runs`` call
    (with ``parked=1``, only the parked runs of that page; with ``after``/``before``, only
    the runs started in that window: see ``run_pages.StartedWindow``; with ``sort=oldest``,
    oldest first, else newest first; with ``id``, the runs whose id starts so, in id order,
    filtered: one ``find_runs`` call and no next page; with ``key``, the first runs with that
    business key that pass the filters, in the order asked: one ``find_by_business_key`` call
    and no next page)."""
    q = request.query_params
    status = _status_filter(q.get("status"))
    pipeline = _text_filter("pipeline", q.get("pipeline"))
    cursor = _text_filter("cursor", q.get("cursor"))
    limit = _limit(q.get("limit"))
    parked = _parked_filter(q.get("parked"))
    window = _window(_text_filter("after", q.get("after")), _text_filter("before", q.get("before")))
    id_start = _text_filter("id", q.get("id"))
    oldest_first = _sort(q.get("sort"))
    key = _key_filter(q.get("key"))
    store = console.store
    try:
        if key is not None:  # the first runs with this business key that pass the filters: one page
            runs = await console.on_store(
                _notes(store).find_by_business_key(
                    key, limit, status=status, pipeline=pipeline, window=window, oldest_first=oldest_first
                )
            )
            found = RunPage(runs, None)
        elif id_start is not None:  # the runs whose id starts so, in id order: one page
            runs = await console.on_store(
                find_in_window(store, id_start, limit, window, status=status, pipeline=pipeline)
            )
            found = RunPage(runs, None)
        else:
            found = await console.on_store(
                page_in_window(
                    store,
                    limit,
                    window,
                    status=status,
                    pipeline=pipeline,
                    cursor=cursor,
                    oldest_first=oldest_first,
                )
            )
    except ValueError as exc:  # a cursor that is not one of the store's (edited, or from elsewhere)
        raise MalformedRequest(f"{exc}" + (" (start again from the first page)" if cursor else "")) from None
    counts = await console.on_store(store.count_runs(pipeline=pipeline))
    if parked:  # (of this page: a parked run is running, its reason in its record)
        found = RunPage([r for r in found.runs if r.parked], found.cursor)
    return RunsList(found, counts, status, pipeline, cursor, limit, parked, window, oldest_first, key)


def _notes(store: Store) -> RunNotes:
    """The store's run notes; 422 for a store that keeps none (so no business keys)."""
    try:
        return store.run_notes
    except ConfigurationError as exc:
        raise InvalidRequest(f"key: {exc}") from None


def _key_filter(value: str | None) -> str | None:
    """``?key=``: the runs with that business key (checked as a key is)."""
    if not value:
        return None
    try:
        return check_business_key(value.strip())
    except ValueError as exc:
        raise InvalidRequest(f"key: {exc}") from None
