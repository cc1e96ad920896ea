"""The Lua scripts of the Redis store: where their source is, how each is assembled, and the
layout of the arguments each reads. Each store operation is one atomic script.

The source is in ``lua/*.lua`` beside this module (package data, read with
``importlib.resources``): one file per script, and fragments that several scripts share
(``listed``, ``emit``, ``blobs``, ``finish``, ``ending``, ``claim_step``). ``Script.files`` names, for
each script, the files that make it, in order: they are joined into one chunk, fragments
first, and a fragment needs only those before it. This module is the only place that
assembles them.

Keys: each script builds every key it touches inside, from the prefix ``P`` (some depend on
what it reads: a run's branches, the runs a timer names). ``P`` is the prefix of one bucket
(``keyspace``): on a Redis Cluster it carries the bucket's hash tag, so all those keys are
in one slot, the one the call is routed to. On a cluster the store also declares in KEYS
every key it can name before the call (``RedisStore._keys``: the run's keys, its parent's,
the bucket's indexes and stream, the blobs): the call goes to the shard that owns the slot,
and while that slot migrates it is refused (TRYAGAIN, retried by the client) rather than
run against half-moved keys. The keys found by reading are not declared: a script that
reaches one that has moved fails at that command (``CANCEL`` of a run with branches, and
``DUE``, during a migration of their slot). On one server no keys are declared. ARGV is laid out by
``Script.args`` from names: first the fixed slots of ``Script.header``, then one slot for each
variable part of ``Script.parts`` with the number of ARGV slots that part takes, then the
parts one after the other. A script reads its fixed slots at fixed positions and finds each
part from those counts, never by counting from the end. A script reads them by name:
``Script.preamble`` binds each slot to a local named as in the layout (``trace``, ``now``,
``n_records``, ``at_records``...) before the script's own file, which never reads ``ARGV``.
The comment at the top of each script's file lists its slots; a test holds that list to
``Script.header`` and ``parts``. The step path's scripts, ``CLAIM`` and ``COMMIT``, are
``packed``: the same slots go as one argument, a msgpack array that the preamble unpacks into
the script's own ``ARGV`` (one value for redis-py to send rather than some thirty it would encode
one by one in Python); the script reads the same strings as unpacked. Their claims come back
packed the same way (``claim_step``; ``codec.claimed``).

Keys, under a bucket's prefix P: ``P:r:<trace>`` run hash, ``P:d:<trace>`` data hash, ``P:s:<trace>``
step records (list), ``P:c:<trace>`` keys a branch run changed (set), ``P:j:<trace>`` join
state, ``P:js:<trace>`` branch results in arrival order, ``P:ja:<trace>`` arrived branch
indexes, ``P:jc:<trace>`` branch run ids, ``P:w:<trace>`` channels of processes waiting for
the run to finish, ``P:e:<trace>`` channels of processes following its step records, ``P:m:<trace>`` its mailbox
(the calls that came before it waited for them, ``mailbox.lua``); global
sorted sets ``P:outbox`` (published, not yet claimed), ``P:timers``, ``P:leases``,
``P:deadlines`` (runs by the time their deadline passes: ``DUE`` ends them), ``P:runs``
(by creation) and ``P:expiry`` (finished runs, by the time their keys expire: ``DUE`` takes
them out of ``P:runs`` and the listings then; ``P:expiryp`` for listed runs of a pipeline,
whose members name it, and for finished runs with a business key, whose members name the key
too: ``DUE`` takes them out of the key's index ``P:bk:<key>`` then; see ``listed.lua``); the
run listings ``P:ix`` (root runs, by the band
of their status, then creation) and ``P:ixp:<pipeline>`` (those of one pipeline), ``P:ids``
(their ids, for a search by an id's start); ``P:b:<ref>`` signed
flow blobs and ``P:bn:<ref>`` how many live runs reference each (a blob no run references
expires after the blob grace). With a stream (``dispatch_via``), step messages go onto it
inside the scripts and the outbox is not used.

A run records the transition it expects next: ``seq``, ``attempt``, ``key``, ``kind`` (what
the message must say: run, continue, join or fail) and ``due`` (a timer's time). A message
that names the current step with another kind, or comes before its time, is refused: a
stream writer without the secret cannot skip a step, fail a run or end a wait early.

Messages are msgpack arrays [trace, seq, key, attempt, kind]; scripts build them with cmsgpack.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from importlib import resources
from keyword import iskeyword
from typing import Any

import msgpack

__all__ = [
    "CANCEL",
    "CLAIM",
    "COMMIT",
    "COUNT",
    "CREATE",
    "DUE",
    "EXTEND",
    "INIT_DONE",
    "PAGE",
    "PARK",
    "RESUME",
    "SCRIPTS",
    "Script",
]


class Script:
    """One script: the files it is made of, and the layout of its ARGV.

    ``header``: the names of the fixed slots, ARGV[1] onwards. ``parts``: the names of the
    variable parts; each has a count slot ``n_<part>`` after the header (how many ARGV slots
    the part takes, so (field, value) pairs count two each), and the parts follow the counts
    in this order.
    """

    __slots__ = ("args", "files", "header", "name", "numbers", "packed", "parts", "slots", "source")

    def __init__(
        self,
        name: str,
        files: tuple[str, ...],
        header: tuple[str, ...],
        parts: tuple[str, ...] = (),
        *,
        packed: bool = False,
        numbers: tuple[str, ...] = (),
    ):
        self.name = name
        self.files = files
        self.header = header
        self.parts = parts
        #: whether ARGV goes as one argument, the slots packed in one msgpack array (``args``)
        self.packed = packed
        #: the fixed slots that take a number (packed only): sent as the text redis-py sends
        self.numbers = numbers
        #: every fixed slot by name, counts included: its ARGV index (from 1, as Lua counts)
        self.slots = {n: i for i, n in enumerate(header + tuple(f"n_{p}" for p in parts), 1)}
        #: the script's Lua: its fragments, then its arguments bound to named locals
        #: (``preamble``), then its own file
        self.source = "\n".join([*(_read(f) for f in files[:-1]), self.preamble(), _read(files[-1])])
        #: ``args(**values) -> list``: ARGV for the script, from a value for each name of
        #: ``header`` and a sequence for each of ``parts`` (keyword-only), laid out as above.
        self.args: Callable[..., list[Any]] = _builder(name, header, parts, packed, numbers)

    def preamble(self) -> str:
        """The Lua that binds each argument to a local named as in the layout, before the
        script's own file: each fixed slot (a string, as Redis passes it), each part's count
        ``n_<part>`` (a number) and where each part starts, ``at_<part>``. A script reads its
        arguments by these names only."""
        lines = [f"-- {self.name}'s arguments by name (scripts.py writes this from its layout)"]
        if self.packed:  # (the script's own ARGV from here: the slots, unpacked)
            lines.append("local ARGV = cmsgpack.unpack(ARGV[1])")
        lines.append(
            f"local {', '.join(self.header)} = {', '.join(f'ARGV[{i}]' for i in range(1, len(self.header) + 1))}"
        )
        if self.parts:
            counts = [f"n_{p}" for p in self.parts]
            lines.append(
                f"local {', '.join(counts)} = {', '.join(f'tonumber(ARGV[{self.slots[c]}])' for c in counts)}"
            )
            start = str(len(self.slots) + 1)
            for p in self.parts:
                lines.append(f"local at_{p} = {start}")
                start = f"at_{p} + n_{p}"
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<Script {self.name}: {' + '.join(self.files)}>"


def _builder(
    name: str, header: tuple[str, ...], parts: tuple[str, ...], packed: bool, numbers: tuple[str, ...]
) -> Callable[..., list[Any]]:
    """The function that lays out ARGV for a script, written out from its layout: a step
    makes one script call, and a plain function with keyword-only parameters costs less per
    call than a generic loop over the names (Python checks the names all the same).

    ``packed``: the slots go as one argument, a msgpack array (old-spec raw strings, the
    only strings Redis's ``cmsgpack`` reads: ``str`` and ``bytes`` reach Lua as the same
    strings as they would in ARGV), which redis-py sends as one value instead of encoding
    each slot in Python. Each slot of ``numbers`` goes as ``repr`` of its value, the text
    redis-py would send; the counts go as integers (the preamble reads them with
    ``tonumber``); every other value must be a ``str`` or ``bytes``."""
    names = header + parts
    every = names + tuple(f"n_{p}" for p in parts)  # the count slots too
    if not all(n.isidentifier() and not iskeyword(n) for n in names) or len(set(every)) != len(every):
        raise ValueError(f"{name}: the names of a layout must be distinct identifiers: {every}")
    if not set(numbers) <= set(header) or (numbers and not packed):
        raise ValueError(f"{name}: numbers must be slots of a packed layout's header: {numbers}")
    items = [
        *(f"repr({h})" if h in numbers else h for h in header),
        *(f"len({p})" for p in parts),
        *(f"*{p}" for p in parts),
    ]
    out = f"[_packb([{', '.join(items)}], use_bin_type=False)]" if packed else f"[{', '.join(items)}]"
    fn = f"{name.lower()}_args"
    namespace: dict[str, Any] = {"_packb": msgpack.packb}
    exec(f"def {fn}(*, {', '.join(names)}):\n    return {out}\n", namespace)
    return namespace[fn]  # type: ignore[no-any-return]


@cache
def _read(name: str) -> str:
    lua = resources.files(__name__.rpartition(".")[0]).joinpath(
        "lua"
    )  # package data: lua/ beside this module
    return lua.joinpath(f"{name}.lua").read_text(encoding="utf-8")


# The fragments a script uses come first, each after those it needs: ending needs finish; finish
# needs listed, emit and blobs; claim_step needs listed; listed, emit and blobs need nothing.
CREATE = Script(
    "CREATE",
    ("listed", "emit", "blobs", "finish", "create"),
    (
        "prefix",
        "trace",
        "now",
        "redispatch",
        "ttl_ms",
        "stream",
        "blob_grace_ms",
        "blobs",
        "frames",
        "value",
        "msg",
        "seq",
        "key",
        "kind",
        "result",
        "parent_trace",
        "parent_seq",
        "parent_index",
        "pipeline",
        "listed_ms",
        "token",
        "compensations",
        "deadline",
    ),
    ("records", "data"),
)
CLAIM = Script(
    "CLAIM",
    ("listed", "claim_step", "claim"),
    ("prefix", "trace", "msg", "seq", "attempt", "key", "kind", "now", "lease", "token", "known"),
    packed=True,
    numbers=("seq", "attempt", "kind", "now", "lease"),
)
# The fields of each transition, in ``fields``, are ``transitions``' (one encoder each).
COMMIT = Script(
    "COMMIT",
    ("listed", "emit", "blobs", "finish", "claim_step", "mailbox", "commit"),
    (
        "prefix",
        "trace",
        "token",
        "now",
        "ttl_ms",
        "redispatch",
        "claim_kind",
        "stream",
        "group",
        "receipt",
        "taker",
        "take_token",
        "take_lease",
        "blob_grace_ms",
        "blob_refs",
        "children",
        "transition",
        "compensations",
        "lean_record",
        "parts_seq",
    ),
    ("records", "sets", "dels", "fields"),
    packed=True,
    numbers=("now", "ttl_ms", "redispatch", "claim_kind", "take_lease", "blob_grace_ms"),
)
RESUME = Script(
    "RESUME",
    ("listed", "emit", "mailbox", "resume"),
    (
        "prefix",
        "trace",
        "call_type",
        "payload",
        "failed",
        "now",
        "redispatch",
        "seq",
        "stream",
        "per_run",
        "per_type",
    ),
)
INIT_DONE = Script("INIT_DONE", ("init_done",), ("prefix", "trace", "seq"))
EXTEND = Script("EXTEND", ("extend",), ("prefix", "now", "lease"), ("claims",))
PARK = Script(
    "PARK", ("park",), ("prefix", "trace", "token", "reason", "now", "msg", "base", "cap", "claimable")
)
DUE = Script(
    "DUE",
    ("listed", "emit", "blobs", "finish", "ending", "due"),
    ("prefix", "now", "limit", "redispatch", "stream", "ttl_ms"),
)
CANCEL = Script(
    "CANCEL",
    ("listed", "emit", "blobs", "finish", "ending", "cancel"),
    ("prefix", "trace", "now", "ttl_ms", "redispatch", "stream", "error"),
)
# Reading the run listings (they only read).
PAGE = Script(
    "PAGE",
    ("listed", "page"),
    ("prefix", "pipeline", "status", "after_ms", "after_trace", "limit", "oldest"),
    ("fields",),
)
COUNT = Script("COUNT", ("listed", "count"), ("prefix", "pipeline"))

SCRIPTS: dict[str, Script] = {
    s.name: s for s in (CREATE, CLAIM, COMMIT, RESUME, INIT_DONE, EXTEND, PARK, DUE, CANCEL, PAGE, COUNT)
}
