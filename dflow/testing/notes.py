"""What a store's run notes (``dflow.run_notes.RunNotes``, a store's ``run_notes``) must do:
a run names the reruns noted on it, oldest first; a second rerun is refused, naming the
first, unless insisted on; of reruns noted at once only one passes; a dropped rerun frees
the run; a run that is not there has no notes."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable

import pytest

from ..errors import RunNotFoundError
from ..run_notes import MAX_RERUNS
from ..store import Store
from .cases import new_run, sync

__all__ = ["RunNotesContract"]


class RunNotesContract:
    """The notes on runs. Needs ``make_store(**options) -> Store`` (see ``StoreContract``)."""

    @pytest.fixture
    def make_store(self) -> Callable[..., Store]:  # pragma: no cover - provided by subclasses
        raise NotImplementedError

    @sync
    async def test_a_run_names_the_reruns_noted_on_it_oldest_first(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store()
        trace = uuid.uuid4().hex
        await store.create_run(new_run(trace))
        info = await store.get_run(trace)
        assert info is not None and info.reruns == (), "a run that was never rerun names none"
        assert await store.run_notes.note_rerun(trace, "first") is None
        assert await store.run_notes.note_rerun(trace, "second", again=True) is None
        info = await store.get_run(trace)
        assert info is not None and info.reruns == ("first", "second")
        await store.close()

    @sync
    async def test_a_second_rerun_is_refused_naming_the_newest_unless_insisted_on(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store()
        trace = uuid.uuid4().hex
        await store.create_run(new_run(trace))
        notes = store.run_notes
        await notes.note_rerun(trace, "first")
        assert await notes.note_rerun(trace, "second") == "first", "refused, naming the rerun it has"
        await notes.note_rerun(trace, "third", again=True)
        assert await notes.note_rerun(trace, "fourth") == "third"
        info = await store.get_run(trace)
        assert info is not None and info.reruns == ("first", "third"), "a refused rerun is not noted"
        await store.close()

    @sync
    async def test_of_reruns_noted_at_once_only_one_passes(self, make_store: Callable[..., Store]) -> None:
        store = make_store()
        trace = uuid.uuid4().hex
        await store.create_run(new_run(trace))
        asked = [f"rerun-{i}" for i in range(20)]  # (at once: on a connection each, for a pool)
        got = await asyncio.gather(*(store.run_notes.note_rerun(trace, r) for r in asked))
        passed = [r for r, g in zip(asked, got, strict=True) if g is None]
        assert len(passed) == 1, f"{len(passed)} reruns asked at once passed: {passed}"
        assert all(g == passed[0] for g in got if g is not None), "each refused one names the one that passed"
        info = await store.get_run(trace)
        assert info is not None and info.reruns == (passed[0],)
        await store.close()

    @sync
    async def test_a_dropped_rerun_frees_the_run_and_the_others_stay(
        self, make_store: Callable[..., Store]
    ) -> None:
        store = make_store()
        trace = uuid.uuid4().hex
        await store.create_run(new_run(trace))
        notes = store.run_notes
        await notes.note_rerun(trace, "first")
        await notes.drop_rerun(trace, "first")
        assert await notes.note_rerun(trace, "second") is None, "the run has no rerun again"
        await notes.note_rerun(trace, "third", again=True)
        await notes.drop_rerun(trace, "third")
        await notes.drop_rerun(trace, "never-noted")
        await notes.drop_rerun(uuid.uuid4().hex, "x")  # (no such run: nothing to do)
        info = await store.get_run(trace)
        assert info is not None and info.reruns == ("second",)
        await store.close()

    @sync
    async def test_a_run_names_its_last_reruns_only(self, make_store: Callable[..., Store]) -> None:
        store = make_store()
        trace = uuid.uuid4().hex
        await store.create_run(new_run(trace))
        for i in range(MAX_RERUNS + 3):
            await store.run_notes.note_rerun(trace, f"r{i}", again=True)
        info = await store.get_run(trace)
        assert info is not None and info.reruns == tuple(f"r{i}" for i in range(3, MAX_RERUNS + 3))
        await store.close()

    @sync
    async def test_a_run_that_is_not_there_takes_no_notes(self, make_store: Callable[..., Store]) -> None:
        store = make_store()
        trace = uuid.uuid4().hex
        with pytest.raises(RunNotFoundError, match=trace):
            await store.run_notes.note_rerun(trace, "r")
        assert await store.get_run(trace) is None, "nothing was made of it"
        await store.close()
