"""Chains that travel between workers.

A chain of a pipeline made by ``init()`` travels as a reference (``p:<head key>``, and
``p:<head key>/<pos>.<branch>`` for its zip/any branches): every worker imports the module
that builds it. A chain built at run time (inside ``flat_map``, by ``direct_run``) exists
only where it was built, so it travels as a cloudpickle blob, content-addressed
(``h:<sha256>``) and signed with the shared secret: a worker refuses a blob whose signature
or digest does not match. Objects declared with ``shared()`` and pipelines travel by name
and resolve to the receiving worker's own instance.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import pickle
import types
from collections import OrderedDict
from typing import Any, TypeVar

import cloudpickle

from .errors import BuildError, ConfigurationError, PayloadRejectedError, UnknownStepError
from .flow import Chain, compile_flow

__all__ = ["ChainCodec", "shared"]

T = TypeVar("T")

_shared_by_name: dict[str, Any] = {}
_shared_by_id: dict[int, str] = {}


def shared(obj: T, name: str | None = None) -> T:
    """Declare ``obj`` shared: flows that capture it carry its name, not a copy, and each
    worker resolves the name to its own instance (an HTTP client, a model, a pool).

    Call it at import time in the module the workers import, with the same ``name`` on
    every worker (default: the object's type, qualified). Returns ``obj``.
    """
    key = name or f"{type(obj).__module__}.{type(obj).__qualname__}"
    old = _shared_by_name.get(key)
    if old is not None and old is not obj:
        _shared_by_id.pop(id(old), None)
    _shared_by_name[key] = obj
    _shared_by_id[id(obj)] = key
    return obj


class _Pickler(cloudpickle.Pickler):
    def persistent_id(self, obj: Any) -> Any:  # noqa: D102 - pickle protocol
        name = _shared_by_id.get(id(obj))
        if name is not None and _shared_by_name.get(name) is obj:
            return ("shared", name)
        from .client import Pipeline

        if type(obj) is Pipeline:
            return ("pipeline", obj._chain.keys[0])
        return None


class _Unpickler(pickle.Unpickler):
    def persistent_load(self, pid: Any) -> Any:  # noqa: D102 - pickle protocol
        kind, name = pid
        if kind == "shared":
            try:
                return _shared_by_name[name]
            except KeyError:
                raise UnknownStepError(
                    f"the shared object {name!r} is not declared in this worker; call "
                    f"dflow.shared(obj, {name!r}) in a module the worker imports"
                ) from None
        if kind == "pipeline":
            from ._registry import pipeline_for

            p = pipeline_for(name)
            if p is None:
                raise UnknownStepError(f"pipeline {name!r} is not built in this worker; import its module")
            return p
        raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")


def _dumps(obj: Any) -> bytes:
    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


def _diagnose(chain: Chain, exc: Exception) -> str:
    """Name the captured variable that cannot be pickled."""
    from .flow import _site_text

    for node in chain.nodes:
        where = f"{node._describe()} at {_site_text(node._site)}"
        for role, fn in (("function", node._fn), ("on_error_return", node._on_error)):
            if not isinstance(fn, types.FunctionType):
                continue
            for var, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
                try:
                    _dumps(cell.cell_contents)
                except Exception as err:
                    return (
                        f"variable {var!r} captured by the {role} of {where} cannot be pickled ({err}); "
                        "declare it with dflow.shared(...) or pass the data through ctx / the step's value"
                    )
            for var in fn.__code__.co_names:
                if var in fn.__globals__ and not isinstance(fn.__globals__[var], types.ModuleType):
                    try:
                        _dumps(fn.__globals__[var])
                    except Exception as err:
                        return (
                            f"global {var!r} used by the {role} of {where} cannot be pickled ({err}); "
                            "declare it with dflow.shared(...)"
                        )
        if node._kind == 0:  # just
            try:
                _dumps(node._value)
            except Exception as err:
                return f"the value of {where} cannot be pickled ({err})"
    return f"the flow cannot be pickled ({exc})"


class ChainCodec:
    """Turns chains into references (and blobs to store), and back, for one shared secret."""

    def __init__(self, secret: str | bytes | None, *, cache_size: int = 10_000) -> None:
        if not secret:
            raise ConfigurationError(
                "distributed mode needs a shared secret to sign the flows workers exchange: set the "
                "DFLOW_SECRET environment variable (the same on every worker and client) or pass secret="
            )
        self._key = secret.encode() if isinstance(secret, str) else bytes(secret)
        self._refs: dict[int, tuple[Chain, str, bytes | None]] = {}
        self._loaded: OrderedDict[str, Chain] = OrderedDict()
        self._cache_size = cache_size

    def ref(self, chain: Chain) -> tuple[str, bytes | None]:
        """The reference of ``chain`` and, for a chain built at run time, its signed blob.
        Raises ``BuildError`` naming the captured variable that cannot be pickled."""
        hit = self._refs.get(id(chain))
        if hit is not None and hit[0] is chain:
            return hit[1], hit[2]
        from ._registry import ref_of

        static = ref_of(chain)
        if static is not None:
            out: tuple[str, bytes | None] = (static, None)
        else:
            try:
                payload = _dumps(chain)
            except Exception as exc:
                raise BuildError(_diagnose(chain, exc)) from exc
            ref = "h:" + hashlib.sha256(payload).hexdigest()
            blob = hmac.new(self._key, payload, hashlib.sha256).digest() + payload
            out = (ref, blob)
            if len(self._refs) >= self._cache_size:
                self._refs.clear()
            self._remember(ref, chain, blob)
        self._refs[id(chain)] = (chain, *out)
        return out

    def cached(self, ref: str) -> Chain | None:
        """The chain for ``ref`` if this process has it (static, built here, or loaded)."""
        if ref.startswith("p:"):
            from ._registry import chain_by_ref

            chain = chain_by_ref(ref)
            if chain is None:
                raise UnknownStepError(
                    f"no pipeline here has the step chain {ref[2:]!r}: this worker does not import the "
                    "module that builds it (or its ids changed since the run started)"
                )
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

    def load(self, ref: str, blob: bytes | None) -> Chain:
        """Verify and unpickle the blob stored for ``ref`` (for a branch: its parent's blob)."""
        head = self.blob_of(ref)
        if blob is None:
            raise PayloadRejectedError(f"the stored flow {head} is missing (expired or deleted)")
        sig, payload = blob[:32], blob[32:]
        good = hmac.new(self._key, payload, hashlib.sha256).digest()
        if not hmac.compare_digest(sig, good) or "h:" + hashlib.sha256(payload).hexdigest() != head:
            raise PayloadRejectedError(
                f"the stored flow {head} fails its signature check: it was tampered with, or written "
                "with another DFLOW_SECRET; it is not executed"
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
            raise PayloadRejectedError(f"the stored flow {head} cannot be loaded: {type(exc).__name__}: {exc}") from exc
        if not isinstance(chain, Chain):
            raise PayloadRejectedError(f"the stored flow {head} is not a flow")
        self._remember(head, chain, blob)
        self._refs[id(chain)] = (chain, head, None)  # stored already
        found = self._loaded.get(ref)
        if found is None:
            raise PayloadRejectedError(f"the stored flow {head} has no branch {ref[len(head):]!r}")
        return found

    def _remember(self, ref: str, chain: Chain, blob: bytes) -> None:
        """Keep ``chain`` under ``ref``, and each of its zip/any branches under
        ``ref/<pos>.<branch>``: a branch travels inside its parent's ``blob``, which goes
        with its reference so that a store writes it if it has not yet (branches of
        registered pipelines keep their static references)."""
        from ._registry import ref_of

        self._loaded[ref] = chain
        if "/" in ref and ref_of(chain) is None:
            self._refs[id(chain)] = (chain, ref, blob)
        for pos, node in enumerate(chain.nodes):
            for i, branch in enumerate(node._branches):
                self._remember(f"{ref}/{pos}.{i}", compile_flow(branch), blob)
        while len(self._loaded) > self._cache_size:
            self._loaded.popitem(last=False)
