"""When two chains pickle alike: a key of what a chain's pickled form is made of.

A flow built inside ``flat_map`` is a new object each time (an agent's next turn, a
loop's next iteration), but it is usually made of the same functions and the same
captured values as the one before. ``shape(chain)`` is a hashable key that is equal for
two chains exactly when their stored forms would behave the same, so that the second is
not pickled again: functions by their code, names and what they capture (by value for
data, by identity for what travels by name), node values by their msgpack encoding (the
form in which a step sees them). ``None`` when something in the chain can't be keyed
safely (an arbitrary object captured by value): that chain is simply pickled.
"""

from __future__ import annotations

import sys
import types
from collections import OrderedDict
from typing import Any

from ..wire.by_name import travels_by_name
from ..wire.values import pack_key
from .nodes import Chain, Kind, compile_flow

__all__ = ["global_names", "shape"]

_ATOMS = frozenset((str, bytes, int, float, bool, type(None), complex))
_BUDGET = 2000  # values looked at per chain before giving up on a key
_globals_of: dict[types.CodeType, tuple[str, ...]] = {}


class _Unkeyable(Exception):
    pass


def shape(chain: Chain, *, consumed_head: bool = True) -> tuple[Any, ...] | None:
    """A key equal for two chains that pickle alike (see the module), or ``None``.

    Code objects appear in it by id (comparing them by value costs as much as pickling
    them): whoever keeps a key must keep the chain it was made from alive alongside it, so
    that those ids are not reused by other code."""
    try:
        return _chain_key(chain, consumed_head, [_BUDGET, set()])
    except (_Unkeyable, RecursionError):
        return None


_SIMPLE = frozenset((str, int, float, bool, type(None)))


def _chain_key(chain: Chain, consumed_head: bool, budget: list[Any]) -> tuple[Any, ...]:
    out: list[Any] = [chain.keys]
    nodes = chain.nodes
    skip_head = consumed_head and len(nodes) > 1 and nodes[0]._kind == Kind.JUST
    for i, n in enumerate(nodes):
        d = n.__dict__
        value = None if i == 0 and skip_head else _node_value_key(d["_value"])  # (a consumed head: left out)
        if d["_compensate"] is not None or d["_fallback"] is not None:  # (rare: kept out of the common key)
            out.append(_undo_key(d, budget))
        out.append(_node_key(n, d, value, budget))
    return tuple(out)


def _node_value_key(value: Any) -> Any:
    """A node's value as a step sees it: simple values as they are, the rest encoded."""
    if type(value) in _SIMPLE:
        return (type(value), value)
    packed = pack_key(value)  # a step sees its node's value only encoded
    if packed is None:
        raise _Unkeyable
    return packed


def _undo_key(d: dict[str, Any], budget: list[Any]) -> tuple[Any, Any]:
    """A node's compensation and fallback."""
    undo, fb = d["_compensate"], d["_fallback"]
    return (
        None if undo is None else _chain_key(undo, False, budget),
        None if fb is None else (_fn_key(fb.fn, budget), fb.ctx_arg, fb.on),
    )


def _node_key(n: Any, d: dict[str, Any], value: Any, budget: list[Any]) -> tuple[Any, ...]:
    """A node: its kind, functions, value (keyed already), settings and branches."""
    fn, err, branches = d["_fn"], d["_on_error"], d["_branches"]
    return (
        d["_kind"],
        None if fn is None else _fn_key(fn, budget),
        d["_ctx_arg"],
        value,
        d["_name"],
        None if err is None else _fn_key(err, budget),
        d["_err_ctx_arg"],
        d["_retry"],
        d["_timeout"],
        d["_thread"],
        d["_queue"],
        n._rate,
        n._label,
        n._transparent,
        tuple(_chain_key(compile_flow(b), False, budget) for b in branches) if branches else (),
    )


def _spend(budget: list[Any]) -> None:
    budget[0] -= 1
    if budget[0] < 0:
        raise _Unkeyable


def _fn_key(fn: Any, budget: list[Any]) -> Any:
    """Functions: by identity when they travel by reference (importable), else by what
    cloudpickle stores of them."""
    _spend(budget)
    t = type(fn)
    if t is types.FunctionType:
        return _function_key(fn, budget)
    if fn is None or t is types.BuiltinFunctionType or t is type:
        return fn if fn is None or _importable(fn) else _unkeyable()
    if t is types.MethodType:
        return ("method", _fn_key(fn.__func__, budget), _value_key(fn.__self__, budget))
    return _value_key(fn, budget)  # a callable object: only when it travels by name


def _function_key(fn: types.FunctionType, budget: list[Any]) -> Any:
    """A Python function: remembered while what it refers to is unchanged; by identity when
    importable; else by its code and what it captures."""
    memo = _memo.get(id(fn))
    if memo is not None and memo[0] is fn and memo[1] == _snapshot(fn):
        return memo[2]
    if _importable(fn):
        return fn
    if id(fn) in budget[1]:  # it refers to itself (a recursive flat_map function)
        return ("self", id(fn.__code__))
    budget[1].add(id(fn))
    key = _code_key(fn, budget)
    budget[1].discard(id(fn))
    snap = _snapshot(fn)
    if snap is not None:
        _memo[id(fn)] = (fn, snap, key)
        if len(_memo) > 256:  # the functions built anew each time (lambdas) only pass through
            _memo.popitem(last=False)
    return key


def _code_key(fn: types.FunctionType, budget: list[Any]) -> tuple[Any, ...]:
    """What cloudpickle stores of a function that is not importable."""
    code = fn.__code__
    g = fn.__globals__
    return (
        "fn",
        id(code),
        fn.__name__,
        fn.__qualname__,
        fn.__module__,
        fn.__doc__,
        _value_key(fn.__defaults__, budget),
        _value_key(fn.__kwdefaults__, budget),
        _value_key(fn.__dict__, budget),
        _value_key(fn.__annotations__, budget),
        tuple(_value_key(_cell(c), budget) for c in fn.__closure__ or ()),
        tuple((k, _value_key(g[k], budget)) for k in _names(code) if k in g),
    )


# The key of a function, kept while what it refers to is the same objects, each of a kind
# that can't change in place (a function, a class, a module, a str, a number...).
_memo: OrderedDict[int, tuple[Any, tuple[Any, ...], Any]] = OrderedDict()
_STABLE = (
    types.FunctionType,
    types.ModuleType,
    types.BuiltinFunctionType,
    type,
    str,
    bytes,
    int,
    float,
    bool,
    type(None),
    complex,
)


def _snapshot(fn: Any, depth: int = 0) -> tuple[Any, ...] | None:
    """The identities of what ``fn`` refers to, and of what the functions it refers to
    refer to; ``None`` when one of them could change in place."""
    if fn.__defaults__ or fn.__kwdefaults__ or fn.__dict__ or depth > 4:
        return None
    refs = [_cell(c) for c in fn.__closure__] if fn.__closure__ else []
    g = fn.__globals__
    refs += [g.get(k) for k in _names(fn.__code__)]
    out: list[Any] = []
    for r in refs:
        if not isinstance(r, _STABLE):
            return None
        out.append(id(r))
        if type(r) is types.FunctionType and r is not fn and not _importable(r):
            inner = _snapshot(r, depth + 1)
            if inner is None:
                return None
            out.append(inner)
    return tuple(out)


def _names(code: types.CodeType) -> tuple[str, ...]:
    names = _globals_of.get(code)
    if names is None:
        names = _globals_of[code] = tuple(sorted(set(global_names(code))))
        if len(_globals_of) > 10_000:
            _globals_of.clear()
    return names


def _value_key(v: Any, budget: list[Any]) -> Any:
    """Data by value (with its type: a tuple is not a list), shared objects and what is
    importable by identity; anything else can't be keyed."""
    _spend(budget)
    t = type(v)
    if t in _ATOMS:
        return (t, v)
    if t in _CONTAINERS:
        return _container_key(t, v, budget)
    return _shared_key(t, v, budget)


_CONTAINERS = frozenset((tuple, list, frozenset, set, dict))


def _container_key(t: type, v: Any, budget: list[Any]) -> Any:
    """A tuple, list, set or dict: its type and its items' keys (a set's sorted)."""
    if t is dict:
        return (t, tuple((_value_key(k, budget), _value_key(x, budget)) for k, x in v.items()))
    items = sorted(v, key=repr) if t in (set, frozenset) else v
    return (t, tuple(_value_key(x, budget) for x in items))


def _shared_key(t: type, v: Any, budget: list[Any]) -> Any:
    """What is not data: by its name when it travels by name, functions by their key,
    modules, classes and builtins by identity when importable."""
    name = travels_by_name(v)
    if name is not None:
        return ("by-name", name)
    if t is types.FunctionType or t is types.MethodType:
        return _fn_key(v, budget)
    if t is types.ModuleType:
        return ("module", v.__name__) if v.__name__ in sys.modules else _unkeyable()
    if isinstance(v, type) or t is types.BuiltinFunctionType:
        return v if _importable(v) else _unkeyable()
    return _unkeyable()


def _unkeyable() -> Any:
    raise _Unkeyable


def _cell(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return _EMPTY


_EMPTY = ("empty-cell",)


def _importable(obj: Any) -> bool:
    """Whether pickle stores ``obj`` as a reference to a module attribute."""
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if not module or not qualname or module == "__main__" or "<locals>" in qualname:
        return False
    found: Any = sys.modules.get(module)
    if found is None:
        return False
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return found is obj


def global_names(code: types.CodeType) -> list[str]:
    names = list(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):  # a lambda or function defined inside
            names += global_names(const)
    return names
