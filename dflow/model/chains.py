"""Chains that travel between workers.

A chain of a pipeline made by ``init()`` travels as a reference (``p:<head key>``, and
``p:<head key>/<pos>.<branch>`` for its zip/any branches): every worker imports the module
that builds it. A chain built at run time (inside ``flat_map``, by ``direct_run``) exists
only where it was built, so it travels as a cloudpickle blob, content-addressed
(``h:<sha256>``) and signed with the shared secret: a worker refuses a blob whose signature
or digest does not match. Objects declared with ``shared()`` and pipelines travel by name
and resolve to the receiving worker's own instance.

This codec lives with the model, not in ``dflow.wire``: it pickles and checks ``Chain``
objects, walks their nodes to name what cannot be pickled, and resolves pipelines through
the model's registry. A blob names dflow's classes and functions by module path; those
that moved since a blob could have been stored load through ``MOVED_MODULES``.
"""

from __future__ import annotations

import hashlib
import io
import pickle
import types
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import cloudpickle

from ..errors import BuildError, PayloadRejectedError, UnknownStepError
from ..wire.by_name import by_name, shared, shared_by_id, shared_by_name, travels_by_name
from ..wire.signing import Keys
from .fingerprint import global_names as _global_names
from .fingerprint import shape as _chain_shape
from .nodes import Chain, Kind, _site_text, compile_flow
from .registry import chain_by_ref, pipeline_for, ref_of

__all__ = ["ChainCodec", "shared", "travels_by_name"]

# Blobs stored by earlier versions name ``_shared_named`` and ``_pipeline_named`` in this
# module: they stay here. The registries live in ``wire.by_name`` (``model.fingerprint`` reads them too).
_shared_by_name = shared_by_name
_shared_by_id = shared_by_id
_by_name = by_name


class _Pickler(cloudpickle.Pickler):
    # Called for every object but the plain builtins (str, int, dict, list, tuple, ...):
    # keep it to two lookups before cloudpickle's own.
    top: Any = None  #: the chain being stored: its consumed head value is left out

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is Chain:
            return obj.reduced(consumed_head=obj is self.top)
        name = _shared_by_id.get(id(obj))
        if name is not None and _shared_by_name.get(name) is obj:
            return (_shared_named, (name,))
        if type(obj) in _by_name:
            return (_pipeline_named, (obj._chain.keys[0],))
        return super().reducer_override(obj)


def _shared_named(name: str) -> Any:
    """This process's object declared ``shared(obj, name)`` (what a blob refers to)."""
    try:
        return _shared_by_name[name]
    except KeyError:
        raise UnknownStepError(
            f"the shared object {name!r} is not declared in this worker; call "
            f"dflow.shared(obj, {name!r}) in a module the worker imports"
        ) from None


def _pipeline_named(head_key: str) -> Any:
    """This process's pipeline with ``head_key`` (what a blob refers to)."""
    p = pipeline_for(head_key)
    if p is None:
        raise UnknownStepError(f"pipeline {head_key!r} is not built in this worker; import its module")
    return p


#: Where the modules that blobs stored by earlier releases name went: stored runs of
#: dflow-runtime 0.2 name classes and functions by these paths (``dflow._model._chain_from``,
#: ``dflow._durable._shared_named``, ``dflow._saga.Undo``, ``dflow.circuit._from_spec``...).
#: An entry may go once no deployment can hold a run stored before its module moved: a run
#: is kept until it ends and then its TTL, so two releases after the move (0.4), when
#: tests/data/compat drops the fixtures of 0.2.0 too. (Public homes that stayed, such as
#: ``dflow.flow``, are listed for the private names their blobs may name there.)
MOVED_MODULES: dict[str, str] = {
    "dflow._codec": "dflow.wire.values",
    "dflow._ids": "dflow.wire.ids",
    "dflow._signing": "dflow.wire.signing",
    "dflow._shared": "dflow.wire.by_name",
    "dflow._urls": "dflow.wire.urls",
    "dflow._runpage": "dflow.run_pages",
    "dflow._model": "dflow.model.nodes",
    "dflow.flow": "dflow.model.flow",
    "dflow._signature": "dflow.model.signature",
    "dflow._calls": "dflow.model.calls",
    "dflow._shape": "dflow.model.fingerprint",
    "dflow._interpret": "dflow.model.interpret",
    "dflow._registry": "dflow.model.registry",
    "dflow._durable": "dflow.model.chains",
    "dflow._frames": "dflow.model.frames",
    "dflow.memory": "dflow.memory.store",
    "dflow._broker": "dflow.memory.transport",
    "dflow._memruns": "dflow.memory.runs",
    "dflow._memblobs": "dflow.memory.blobs",
    "dflow._memends": "dflow.memory.endings",
    "dflow._memindex": "dflow.memory.listings",
    "dflow._followers": "dflow.memory.followers",
    "dflow._memstate": "dflow.memory.state",
    "dflow._saga": "dflow.patterns.saga",
    "dflow._rerun": "dflow.patterns.rerun",
    "dflow.deadlock": "dflow.patterns.deadlock",
    "dflow.state": "dflow.patterns.state",
    "dflow.circuit": "dflow.patterns.circuit",
    "dflow._tree": "dflow.ops.tree",
    "dflow._logs": "dflow.ops.logs",
    "dflow.metrics": "dflow.ops.metrics",
    "dflow.otel": "dflow.ops.otel",
    "dflow._observing": "dflow.ops.worker_flags",
    "dflow.runtime": "dflow.runtime.worker",
    "dflow._step": "dflow.runtime.step",
    "dflow._dispatch": "dflow.runtime.dispatch",
    "dflow._upkeep": "dflow.runtime.upkeep",
    "dflow._host": "dflow.runtime.process",
    "dflow._run": "dflow.runtime.run",
    "dflow._connect": "dflow.runtime.connect",
    "dflow.server._runs": "dflow.server.runs",
    "dflow.server._http": "dflow.server.http",
    "dflow.server._serve": "dflow.server.serve",
    "dflow.server.console": "dflow.server.console.routes",
    "dflow.server.console_api": "dflow.server.console.api",
    "dflow.server.console_auth": "dflow.server.console.auth",
    "dflow.server.console_html": "dflow.server.console.html",
    "dflow.server.console_tree": "dflow.server.console.tree",
    "dflow.server.console_views": "dflow.server.console.views",
    "dflow.testing._made": "dflow.testing.cases",
    "dflow.testing._listing": "dflow.testing.listing",
    "dflow.testing._saga": "dflow.testing.saga",
    "dflow.adapters.redis._errors": "dflow.adapters.redis.client",
    "dflow.adapters.redis._same": "dflow.adapters.redis.fusable",
    "dflow.adapters.redis._waited": "dflow.adapters.redis.replica_writes",
    "dflow.adapters.redis._watch": "dflow.adapters.redis.finish_watch",
    "dflow.adapters.redis._reads": "dflow.adapters.redis.reads",
    "dflow.adapters.redis._store": "dflow.adapters.redis.store",
    "dflow.adapters.redis._transport": "dflow.adapters.redis.transport",
    "dflow.adapters.redis._state": "dflow.adapters.redis.state",
    "dflow.adapters.redis._scripts": "dflow.adapters.redis.scripts",
    "dflow.adapters.redis._keyspace": "dflow.adapters.redis.keyspace",
    "dflow.adapters.kafka._transport": "dflow.adapters.kafka.transport",
}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        return super().find_class(MOVED_MODULES.get(module, module), name)

    # Blobs written before shared objects travelled by reduction name them by persistent id.
    def persistent_load(self, pid: Any) -> Any:
        kind, name = pid
        if kind == "shared":
            return _shared_named(name)
        if kind == "pipeline":
            return _pipeline_named(name)
        raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")


def _dumps(obj: Any) -> bytes:
    buf = io.BytesIO()
    pickler = _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL)
    pickler.top = obj
    pickler.dump(obj)
    return buf.getvalue()


def _diagnose(chain: Chain, exc: Exception) -> str:
    """Name the captured variable that cannot be pickled."""

    for node in _all_nodes(chain):
        where = f"{node._describe()} at {_site_text(node._site)}"
        for role, fn in (("function", node._fn), ("on_error_return", node._on_error)):
            found = _bad_capture(fn, set())
            if found is not None:
                what, var, err = found
                how = "captured by" if what == "variable" else "used by"
                return (
                    f"{what} {var!r} {how} the {role} of {where} cannot be pickled ({err}); declare it "
                    "with dflow.shared(...), or pass the data through ctx or the step's value"
                )
        if node._kind in (Kind.JUST, Kind.DELAY):
            try:
                _dumps(node._value)
            except Exception as err:
                return f"the value of {where} cannot be pickled ({err})"
    return f"the flow cannot be pickled ({exc})"


def _all_nodes(chain: Chain) -> list[Any]:
    out = []
    for node in chain.nodes:
        out.append(node)
        for branch in node._branches:
            out += _all_nodes(compile_flow(branch))
    return out


def _bad_capture(fn: Any, seen: set[int]) -> tuple[str, str, Exception] | None:
    """("variable" | "global", name, error) for the first thing ``fn`` captures or uses
    that cannot be pickled, looking into the functions it captures and the lambdas and
    inner functions it defines."""
    if not isinstance(fn, types.FunctionType) or id(fn) in seen:
        return None
    seen.add(id(fn))
    for var, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        try:
            value = cell.cell_contents
        except ValueError:  # not assigned yet
            continue
        inner = _bad_capture(value, seen)
        if inner is not None:
            return inner
        try:
            _dumps(value)
        except Exception as err:
            return ("variable", var, err)
    for var in _global_names(fn.__code__):
        if var not in fn.__globals__:
            continue
        value = fn.__globals__[var]
        if isinstance(value, types.ModuleType):
            continue
        inner = _bad_capture(value, seen)
        if inner is not None:
            return inner
        try:
            _dumps(value)
        except Exception as err:
            return ("global", var, err)
    return None


MAX_BLOB_BYTES = 8 * 1024 * 1024  #: a stored flow's size at most, captured values included
_BLOB = b"dflow flow blob"
_FRAMES = b"dflow frames"


def _too_big(chain: Chain, size: int, limit: int) -> str:
    """Name the biggest value the flow carries, which made it too big to store."""

    biggest: tuple[int, str] = (0, "")
    for node in _all_nodes(chain):
        where = f"{node._describe()} at {_site_text(node._site)}"
        for role, fn in (("function", node._fn), ("on_error_return", node._on_error)):
            if isinstance(fn, types.FunctionType):
                for var, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
                    try:
                        n = len(_dumps(cell.cell_contents))
                    except Exception:
                        continue
                    if n > biggest[0]:
                        biggest = (n, f"variable {var!r} captured by the {role} of {where} ({n} bytes)")
        try:
            n = len(_dumps(node._value))
        except Exception:
            n = 0
        if n > biggest[0]:
            biggest = (n, f"the value of {where} ({n} bytes)")
    what = f"; the biggest part is {biggest[1]}" if biggest[1] else ""
    return (
        f"the flow is {size} bytes when stored, over the limit of {limit}{what}. Keep large data in the store's "
        "values (a step's result, ctx.put) or elsewhere, and capture a reference"
    )


class ChainCodec:
    """Turns chains into references (and blobs to store), and back, for one shared secret."""

    def __init__(
        self,
        secret: str | bytes | Sequence[str | bytes] | None,
        *,
        cache_size: int = 10_000,
        max_blob_bytes: int = MAX_BLOB_BYTES,
    ) -> None:
        self.keys = Keys(secret)
        self.max_blob_bytes = max_blob_bytes
        # By the chain's id, holding the chain weakly: a chain built at run time is dropped
        # once its run moved on, and its entry with it (a plain dict: this is on every step).
        self._refs: dict[int, tuple[weakref.ref[Chain], tuple[str, bytes | None]]] = {}
        # shape -> (reference, blob, the chain it was made from: it keeps the ids in the shape valid)
        self._shapes: OrderedDict[tuple[Any, ...], tuple[str, bytes, Chain]] = OrderedDict()
        self._loaded: OrderedDict[str, Chain] = OrderedDict()
        self._cache_size = cache_size

    def ref(self, chain: Chain) -> tuple[str, bytes | None]:
        """The reference of ``chain`` and, for a chain built at run time, its signed blob.
        Raises ``BuildError`` naming the captured variable that cannot be pickled."""
        hit = self._refs.get(id(chain))
        if hit is not None and hit[0]() is chain:
            return hit[1]

        static = ref_of(chain)
        if static is not None:
            out: tuple[str, bytes | None] = (static, None)
        else:
            shape = _chain_shape(chain)
            known = self._shapes.get(shape) if shape is not None else None
            if known is not None:  # an earlier chain of this shape (a loop's next turn)
                self._shapes.move_to_end(shape)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # known: shape is not None
                out = known[:2]
            else:
                try:
                    payload = _dumps(chain)
                except Exception as exc:
                    raise BuildError(_diagnose(chain, exc)) from exc
                if len(payload) > self.max_blob_bytes:
                    raise BuildError(_too_big(chain, len(payload), self.max_blob_bytes))
                ref = "h:" + hashlib.sha256(payload).hexdigest()
                blob = self.keys.sign(_BLOB, payload)
                out = (ref, blob)
                self._remember(ref, chain, blob, loaded=False)
                if shape is not None:
                    self._shapes[shape] = (ref, blob, chain)
                    if len(self._shapes) > self._cache_size:
                        self._shapes.popitem(last=False)
        self._keep(chain, out)
        return out

    def _keep(self, chain: Chain, out: tuple[str, bytes | None]) -> None:
        key = id(chain)
        refs = self._refs
        # (mypy cannot infer a lambda with a default argument)
        self._refs[key] = (weakref.ref(chain, lambda _, key=key: refs.pop(key, None)), out)  # type: ignore[misc]

    def runnable(self, chain: Chain) -> Chain:
        """The chain a run continues with: a pipeline's own, or for a chain built at run
        time the copy loaded from its signed blob, as any worker would load it (so what
        it captured behaves the same wherever the run goes on)."""
        ref, blob = self.ref(chain)
        if ref[:2] != "h:":
            return chain
        hit = self._loaded.get(ref)
        if hit is not None:
            return hit
        if blob is None:  # a loaded copy itself, gone from the cache
            return chain
        return self.load(ref, blob)

    def cached(self, ref: str) -> Chain | None:
        """The chain for ``ref`` if this process has it: a pipeline's, or one loaded."""
        if ref.startswith("p:"):
            chain = chain_by_ref(ref)
            if chain is None:
                missing = UnknownStepError(
                    f"no pipeline in this worker has the chain {ref}: it does not import the module that "
                    "builds it (or its ids changed since the run started)"
                )
                missing.chain_ref = ref  # (the runtime names the pipeline and the step: registry)
                raise missing
            return chain
        chain = self._loaded.get(ref)
        if chain is not None:
            self._loaded.move_to_end(ref)
        return chain

    @staticmethod
    def blob_of(ref: str) -> str:
        """The reference of the stored blob that holds ``ref``: a zip/any branch of a chain
        built at run time (``h:<sha256>/<pos>.<branch>``) travels inside its parent's blob."""
        return ref.split("/", 1)[0]

    def seal_frames(self, trace_id: str, payload: bytes) -> bytes:
        """A run's frames record, signed for that run: a store writer cannot point a run at
        another run's code, or at another pipeline's step."""
        return self.keys.sign(_FRAMES, payload, trace_id.encode())

    def open_frames(self, trace_id: str, record: bytes) -> bytes:
        """The frames record of run ``trace_id``, verified (see ``seal_frames``)."""
        return self.keys.open(record, _FRAMES, f"the frames record of run {trace_id!r}", trace_id.encode())

    def load(self, ref: str, blob: bytes | None) -> Chain:
        """Verify and unpickle the blob stored for ``ref`` (for a branch: its parent's blob)."""
        head = self.blob_of(ref)
        if blob is None:
            raise PayloadRejectedError(f"the stored flow {head} is missing (expired or deleted)")
        if len(blob) > self.max_blob_bytes + 64:
            raise PayloadRejectedError(
                f"the stored flow {head} is {len(blob)} bytes, over the limit of {self.max_blob_bytes}; not loaded"
            )
        payload = self.keys.open(blob, _BLOB, f"the stored flow {head}", legacy=True)
        if "h:" + hashlib.sha256(payload).hexdigest() != head:
            raise PayloadRejectedError(
                f"the stored flow {head} fails its signature check: its content is not what its name says; "
                "it is not executed"
            )
        try:
            chain = _Unpickler(io.BytesIO(payload)).load()
        except (ImportError, AttributeError) as exc:  # another worker may have what it needs
            raise UnknownStepError(
                f"the stored flow {head} needs code this worker does not have ({type(exc).__name__}: {exc}); "
                "deploy the same modules on every worker"
            ) from exc
        except UnknownStepError:
            raise
        except Exception as exc:
            raise PayloadRejectedError(
                f"the stored flow {head} cannot be loaded: {type(exc).__name__}: {exc}"
            ) from exc
        if not isinstance(chain, Chain):
            raise PayloadRejectedError(f"the stored flow {head} is not a flow")
        self._remember(head, chain, None)  # stored already: its references need no blob
        found = self._loaded.get(ref)
        if found is None:
            raise PayloadRejectedError(f"the stored flow {head} has no branch {ref[len(head) :]!r}")
        return found

    def _remember(self, ref: str, chain: Chain, blob: bytes | None, *, loaded: bool = True) -> None:
        """Know ``chain`` by ``ref``, and each of its zip/any branches by
        ``ref/<pos>.<branch>``: a branch travels inside its parent's ``blob``, which goes
        with its reference so that a store writes it if it has not yet (``None`` for a
        chain loaded from the store; branches of registered pipelines keep their static
        references). A ``loaded`` chain (and its branches) is also kept for ``cached``."""

        entries: list[tuple[str, Chain]] = []
        _walk(ref, chain, entries)
        if loaded:  # make room first: the entries of one blob stay together even past the cache size
            while self._loaded and len(self._loaded) + len(entries) > self._cache_size:
                self._loaded.popitem(last=False)
        for r, c in entries:
            if loaded:
                self._loaded[r] = c
            if r == ref and blob is None:
                self._keep(c, (r, None))
            elif "/" in r and ref_of(c) is None:
                self._keep(c, (r, blob))


def _walk(ref: str, chain: Chain, out: list[tuple[str, Chain]]) -> None:
    out.append((ref, chain))
    for pos, node in enumerate(chain.nodes):
        for i, branch in enumerate(node._branches):
            _walk(f"{ref}/{pos}.{i}", compile_flow(branch), out)
