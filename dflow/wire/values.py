"""Encoding of values that cross a step boundary, and of transport messages.

Values are msgpack data or pydantic models. A model travels as an extension record
holding its class's name and its JSON-mode dump, and is rebuilt with ``model_validate``
on the way back, so the next step sees an instance of the same class.

A value never makes a process import anything: a model is rebuilt only when its class is
registered in the decoding process, by ``dflow.register_model``, by being named in the type
hints of a step function (``def f(order: Order) -> Invoice``), or by having been encoded
there. Otherwise decoding fails, naming the class and how to register it.
"""

from __future__ import annotations

import threading
import typing
from enum import IntEnum
from typing import Any, NamedTuple, TypeVar

import msgpack

from ..errors import SerializationError
from .ids import is_run_id

_EXT_MODEL = 1
T = TypeVar("T")

try:  # pydantic is a core dependency, but keep the codec importable without it
    from pydantic import BaseModel as _BaseModel
except ImportError:  # pragma: no cover
    _BaseModel = None  # type: ignore[assignment,misc]


_INT_RANGE = "-2**63 .. 2**64-1"


_models: dict[str, type[Any]] = {}  #: registered pydantic model classes, by name


def _model_name(cls: type[Any]) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def register_model(cls: type[T]) -> type[T]:
    """Let values of the pydantic model ``cls`` be rebuilt in this process. Use it as a
    class decorator, or call it in a module that the workers import; classes named in
    the type hints of step functions, and classes this process encodes, need no call.
    Returns ``cls``."""
    if _BaseModel is None or not (isinstance(cls, type) and issubclass(cls, _BaseModel)):
        raise TypeError(f"register_model takes a pydantic BaseModel subclass, got {cls!r}")
    _models[_model_name(cls)] = cls
    return cls


def register_hinted_models(fn: Any) -> None:
    """Register the pydantic models named in ``fn``'s type hints (inside ``list[...]``,
    ``Optional[...]`` and other generics too)."""
    if _BaseModel is None:  # pragma: no cover
        return
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # unresolvable forward references, or no annotations at all
        hints = {k: v for k, v in getattr(fn, "__annotations__", {}).items() if not isinstance(v, str)}
    seen: set[int] = set()
    stack = list(hints.values())
    while stack:
        t = stack.pop()
        if id(t) in seen or len(seen) > 200:
            continue
        seen.add(id(t))
        if isinstance(t, type) and issubclass(t, _BaseModel) and t is not _BaseModel:
            _models.setdefault(_model_name(t), t)
        stack.extend(typing.get_args(t))


def _default(obj: Any) -> Any:
    if _BaseModel is not None and isinstance(obj, _BaseModel):
        cls = type(obj)
        name = _model_name(cls)
        if _models.get(name) is not cls:  # this process has the class: it can rebuild its values
            _models[name] = cls
        body = [name, obj.model_dump(mode="json")]
        return msgpack.ExtType(_EXT_MODEL, msgpack.packb(body, use_bin_type=True))
    if isinstance(obj, int):  # msgpack hands over the integers it has no room for
        raise OverflowError(
            f"the integer {_clip(obj)} is outside msgpack's 64-bit range ({_INT_RANGE}); pass it as a string"
        )
    raise TypeError(f"{type(obj).__module__}.{type(obj).__qualname__} is not msgpack data")


def _clip(n: int) -> str:
    text = str(n) if n.bit_length() < 4000 else f"of {n.bit_length()} bits"
    return text if len(text) <= 40 else text[:18] + "…" + text[-18:]


class PlainModel(dict):  # type: ignore[type-arg]
    """A pydantic model's value decoded as its fields (a ``dict``), by ``decode(...,
    plain=True)`` in a process where its class is not registered: what ``dflow inspect``
    and the console show. ``model`` is the class's name (``module:Qualname``)."""

    __slots__ = ("model",)

    def __init__(self, model: str, fields: dict[str, Any]) -> None:
        super().__init__(fields)
        self.model = model

    def __repr__(self) -> str:
        if all(isinstance(k, str) and k.isidentifier() for k in self):
            args = ", ".join(f"{k}={v!r}" for k, v in self.items())
        else:
            args = dict.__repr__(self)
        return f"{self.model.rpartition(':')[2].rpartition('.')[2]}({args})"


def _model_fields(data: bytes) -> tuple[Any, Any]:
    try:
        name, dumped = msgpack.unpackb(data, raw=False)
    except Exception as exc:
        raise SerializationError(f"a pydantic model value is malformed ({exc})") from None
    return name, dumped


def _plain_ext_hook(code: int, data: bytes) -> Any:
    """``_ext_hook``, giving a model whose class is not registered as a ``PlainModel``."""
    if code == _EXT_MODEL:
        name, dumped = _model_fields(data)
        if isinstance(name, str) and name not in _models:
            return PlainModel(name[:200], dumped if isinstance(dumped, dict) else {"value": dumped})
    return _ext_hook(code, data)


def _ext_hook(code: int, data: bytes) -> Any:
    if code != _EXT_MODEL:
        raise SerializationError(f"unknown msgpack extension type {code}")
    name, dumped = _model_fields(data)
    cls = _models.get(name) if isinstance(name, str) else None
    if cls is None:
        shown = name if isinstance(name, str) and len(name) <= 200 else repr(name)[:200]
        raise SerializationError(
            f"cannot rebuild a value of the pydantic model {shown}: that class is not registered in this "
            "process. Name it in a step function's type hints, or call dflow.register_model(TheClass) in a "
            "module the workers import"
        )
    return cls.model_validate(dumped)


_local = threading.local()


def _packer() -> msgpack.Packer:
    packer = getattr(_local, "packer", None)
    if packer is None:  # one per thread: a Packer keeps a buffer and is not thread-safe
        packer = _local.packer = msgpack.Packer(default=_default, use_bin_type=True, datetime=True)
    return packer


_FLAT = frozenset((str, int, float, bool, type(None), bytes))


def encode(value: Any, what: str = "value", key: str | None = None) -> bytes:
    """Encode ``value``; raise ``SerializationError`` naming ``what`` (and the step
    ``key``) when it can't be, or when what it encodes to cannot be read back."""
    try:
        data = _packer().pack(value)
    except (TypeError, ValueError, OverflowError) as exc:
        _packer().reset()
        where = f"{what} {key!r}" if key is not None else what
        if isinstance(exc, OverflowError):
            raise SerializationError(f"{where}: {exc}") from None
        raise SerializationError(
            f"{where}: {_what_fails(value)} cannot be serialised ({exc}). Use msgpack "
            "data (dict, list, str, bytes, int, float, bool, None, tz-aware datetime) or a "
            "pydantic model."
        ) from None
    if type(value) not in _FLAT:  # a container: make sure the next step can read it
        try:
            decode(data)
        except SerializationError as exc:
            where = f"{what} {key!r}" if key is not None else what
            raise SerializationError(f"{where}: {_unreadable(value) or exc}") from None
    return data


def _type_name(cls: type) -> str:
    """``cls`` by its qualified name (``numpy.bool``, not ``bool``); builtins by their own."""
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _what_fails(value: Any) -> str:
    """The value that cannot be packed, by its path within ``value`` and its qualified type."""
    found = _first_unpackable(value, "", 0)
    if found is None or not found[0]:
        return f"a value of type {_type_name(type(value))}"
    path, bad = found
    return f"the value at {path} (of type {_type_name(type(bad))}, in a {_type_name(type(value))})"


def _step(path: str, key: Any) -> str:
    if isinstance(key, int) and not isinstance(key, bool):
        return f"{path}[{key}]"
    if isinstance(key, str) and key.isidentifier():
        return f"{path}.{key}" if path else key
    return f"{path}[{key!r}]"


def _first_unpackable(value: Any, path: str, depth: int) -> tuple[str, Any] | None:
    """The path and the value of the first part of ``value`` msgpack cannot pack."""
    if depth > 100:
        return None
    if isinstance(value, dict):
        for k, v in value.items():
            if _first_unpackable(k, "", depth + 1) is not None:
                return f"{path or 'the top'} (a dict key, {_short(k)})", k
            found = _first_unpackable(v, _step(path, k), depth + 1)
            if found is not None:
                return found
        return None
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            found = _first_unpackable(v, _step(path, i), depth + 1)
            if found is not None:
                return found
        return None
    try:
        _packer().pack(value)
    except Exception:
        _packer().reset()
        return path, value
    return None


def _unreadable(value: Any, depth: int = 0) -> str | None:
    """Why ``value`` encodes but cannot be decoded, when its shape says so."""
    if depth > 100:
        return None
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, (str, int, float, bool, bytes, type(None))):
                return (
                    f"a dict key of type {type(k).__qualname__} ({_short(k)}) cannot be read back: it "
                    "decodes as a list, which cannot be a key; use str keys"
                )
            why = _unreadable(v, depth + 1)
            if why:
                return why
    elif isinstance(value, (list, tuple)):
        for v in value:
            why = _unreadable(v, depth + 1)
            if why:
                return why
    return None


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:39] + "…"


def pack_key(value: Any) -> bytes | None:
    """``value`` encoded, as a key for comparing values; ``None`` when it can't be."""
    try:
        return _packer().pack(value)
    except Exception:
        _packer().reset()
        return None


class Limits:
    """Bounds on what decoding a stored value may cost: its size (``max_bytes``, set from
    the runtime's ``max_value_bytes``), and for a value over ``dense_from`` bytes, one list
    or map per ``bytes_per_container`` bytes at most. A value written by dflow stays within
    them; a hand-made one of many tiny containers would take some 70 times its size in
    memory once decoded (text and numbers take at most about 20 times)."""

    max_bytes = 8 * 1024 * 1024 + 1024
    dense_from = 1024 * 1024
    bytes_per_container = 8


limits = Limits()


class _TooDense(Exception):
    pass


_unpackb = msgpack.unpackb


def decode(data: bytes, *, plain: bool = False) -> Any:
    """Decode bytes made by ``encode``, within ``limits``. With ``plain``, a pydantic model
    whose class is not registered here decodes as a :class:`PlainModel` of its fields
    instead of failing (for showing values, never for running steps on them)."""
    size = len(data)
    ext_hook = _plain_ext_hook if plain else _ext_hook
    if size <= 4096:  # most values: nothing to check
        try:
            return _unpackb(data, raw=False, ext_hook=ext_hook, timestamp=3, strict_map_key=False)
        except SerializationError:
            raise
        except Exception as exc:
            raise SerializationError(f"cannot decode a stored value: {exc}") from exc
    if size > limits.max_bytes:
        raise SerializationError(
            f"a stored value of {size} bytes is over the limit of {limits.max_bytes} bytes; it is not decoded"
        )
    try:
        if size <= limits.dense_from:
            return msgpack.unpackb(data, raw=False, ext_hook=ext_hook, timestamp=3, strict_map_key=False)
        budget = [size // limits.bytes_per_container]

        def count(container: Any) -> Any:
            budget[0] -= 1
            if budget[0] < 0:
                raise _TooDense
            return container

        return msgpack.unpackb(
            data,
            raw=False,
            ext_hook=ext_hook,
            timestamp=3,
            strict_map_key=False,
            list_hook=count,
            object_hook=count,
        )
    except SerializationError:
        raise
    except _TooDense:
        raise SerializationError(
            f"a stored value of {size} bytes holds more than one list or map per {limits.bytes_per_container} "
            "bytes: decoding it would take many times its size in memory; it is not decoded"
        ) from None
    except Exception as exc:
        raise SerializationError(f"cannot decode a stored value: {exc}") from exc


NONE = encode(None)


class MessageKind(IntEnum):
    """What a step message asks of its step, given the run's stored value. (The node kinds,
    ``Kind``, say what a node is; these say what its step does this time.) Messages carry
    the plain integers below, which the Redis scripts read too (an enum member would reach
    a Redis argument as its repr)."""

    RUN = 0  #: run the node's function on the stored value
    CONTINUE = 1  #: the stored value is the node's output (a call arrived, a delay ended)
    JOIN = 2  #: the node's output comes from its zip/any branches
    FAIL = 3  #: the stored value is an error the node raised elsewhere (an ``on_init``)


RUN, CONTINUE, JOIN, FAIL = (int(k) for k in MessageKind)


def _plain_packer() -> msgpack.Packer:
    packer = getattr(_local, "plain", None)
    if packer is None:
        packer = _local.plain = msgpack.Packer(use_bin_type=True)
    return packer


_LUA_INT = 2**53  # counts stay below it: a Lua number holds them exactly
_tuple_new = tuple.__new__


MAX_MESSAGE = 16384  #: bytes of a step message at most (a trace id, a key and three numbers)
MAX_KEY = 3000  #: characters of a step key at most (the runtime refuses flows nested deeper), so a
# message of the longest run id and key (UTF-8: up to 4 bytes a character) fits in MAX_MESSAGE


class Message(NamedTuple):
    """A step message: which run, which step, which attempt. Values stay in the store.
    (A named tuple: made at every step, it must be cheap to make.)"""

    trace_id: str
    seq: int
    key: str
    attempt: int = 0
    kind: int = RUN

    def encode(self) -> bytes:
        return _plain_packer().pack(self)

    @classmethod
    def decode(cls, data: bytes) -> Message:
        """Decode a message; raise ``SerializationError`` saying why it is not one.

        A step message is exactly what ``encode`` makes (the commit script of the Redis
        store applies the same rules to the messages it takes): a msgpack array of a trace
        id (a run id, see ``dflow.wire.ids``), a sequence number, a step key (a non-empty str),
        an attempt (integers from 0 below 2**53) and a kind (``RUN`` .. ``FAIL``), in the
        shortest encoding of each field."""
        if type(data) is not bytes or len(data) > MAX_MESSAGE:
            if isinstance(data, bytearray) and len(data) <= MAX_MESSAGE:
                return cls.decode(bytes(data))
            raise SerializationError(
                f"not a dflow step message ({type(data).__name__}"
                f"{f' of {len(data)} bytes' if isinstance(data, (bytes, bytearray)) else ''})"
            )
        try:
            fields = _unpackb(data, raw=False)
        except Exception as exc:
            raise SerializationError(f"not a dflow step message ({exc})") from None
        if type(fields) is not list or len(fields) != 5:
            raise SerializationError("not a dflow step message (not an array of 5 fields)")
        if not _well_typed(*fields):
            raise SerializationError("not a dflow step message (wrong field types)")
        msg = _tuple_new(cls, fields)
        if _plain_packer().pack(msg) != data:
            raise SerializationError("not a dflow step message (not in its shortest encoding)")
        return msg

    @property
    def ident(self) -> str:
        """Unique id of this delivery intent: trace, sequence and attempt."""
        return f"{self.trace_id}#{self.seq}.{self.attempt}"


def _well_typed(trace_id: Any, seq: Any, key: Any, attempt: Any, kind: Any) -> bool:
    """Whether the fields of a step message have their types and ranges (see ``Message.decode``)."""
    return (
        type(seq) is int
        and type(attempt) is int
        and type(kind) is int
        and 0 <= seq < _LUA_INT
        and 0 <= attempt < _LUA_INT
        and 0 <= kind <= FAIL
        and type(key) is str
        and bool(key)
        and is_run_id(trace_id)
    )
