"""The Redis store's Lua scripts: each file documents the ARGV layout that Python builds, and
reads its arguments by the names the layout gives them, never by their offsets."""

from __future__ import annotations

import re
from functools import partial
from importlib import resources
from types import SimpleNamespace
from typing import Any, cast

import msgpack
import pytest

pytest.importorskip("redis")

from redis._parsers.encoders import Encoder

from dflow.adapters.redis import commits, scripts
from dflow.adapters.redis.codec import encode_transition
from dflow.adapters.redis.notes import SCRIPTS as NOTE_SCRIPTS
from dflow.adapters.redis.rate_limits import SCRIPTS as RATE_SCRIPTS
from dflow.adapters.redis.schedules import SCRIPTS as SCHEDULE_SCRIPTS
from dflow.adapters.redis.scripts import SCRIPTS, Script
from dflow.adapters.redis.state import SCRIPTS as STATE_SCRIPTS
from dflow.adapters.redis.workers import SCRIPTS as WORKER_SCRIPTS
from dflow.context import StepRecord, StepStatus
from dflow.store import Claim, Fail, Finish, Fork, NewRun, Parent, Transition, Wait
from dflow.testing.cases import advance, frames_of
from dflow.wire.values import JOIN, Message, encode

SLOT = re.compile(r"^--\s+ARGV\[(\d+)\]\s+(\w+)", re.MULTILINE)
PARTS = re.compile(r"^--\s+ARGV\[(\d+)\.\.\]\s+(\w+(?:, \w+)*)", re.MULTILINE)
FRAGMENTS = {"listed", "emit", "blobs", "finish", "ending", "claim_step", "mailbox"}


def _lua(name: str) -> str:
    return (
        resources.files("dflow.adapters.redis")
        .joinpath("lua")
        .joinpath(f"{name}.lua")
        .read_text(encoding="utf-8")
    )


def _code(lua: str) -> str:
    """The Lua without its comments (none of the scripts has ``--`` inside a string)."""
    return "\n".join(line.split("--", 1)[0] for line in lua.splitlines())


def test_every_lua_file_is_used_and_every_script_is_assembled_from_its_files() -> None:
    lua = resources.files("dflow.adapters.redis").joinpath("lua")
    on_disk = {p.name[:-4] for p in lua.iterdir() if p.name.endswith(".lua")}
    used = {f for s in SCRIPTS.values() for f in s.files}
    # (shared State, circuits, token buckets, schedules, notes and beats load theirs one per file)
    one_per_file = {*STATE_SCRIPTS, *RATE_SCRIPTS, *SCHEDULE_SCRIPTS, *NOTE_SCRIPTS, *WORKER_SCRIPTS}
    assert used | one_per_file == on_disk
    assert set(SCRIPTS) == {
        "CREATE",
        "CLAIM",
        "COMMIT",
        "RESUME",
        "INIT_DONE",
        "EXTEND",
        "PARK",
        "DUE",
        "CANCEL",
        "PAGE",
        "COUNT",
    }
    for s in SCRIPTS.values():
        assert s.files[-1] not in FRAGMENTS and set(s.files[:-1]) <= FRAGMENTS
        assert s.source == "\n".join([*(_lua(f) for f in s.files[:-1]), s.preamble(), _lua(s.files[-1])])
    # a fragment comes after those it uses
    for s in SCRIPTS.values():
        if "finish" in s.files:
            assert (
                s.files.index("listed")
                < s.files.index("emit")
                < s.files.index("blobs")
                < s.files.index("finish")
            )
        if "ending" in s.files:
            assert s.files.index("finish") < s.files.index("ending")
        if "claim_step" in s.files:
            assert s.files.index("listed") < s.files.index("claim_step")
    # every script that writes a run's status keeps the listings: it has the fragment that does
    for s in SCRIPTS.values():
        if "'status'," in _code(s.source) and "HSET" in _code(s.source):
            assert "listed" in s.files, s.name


@pytest.mark.parametrize("script", sorted(SCRIPTS.values(), key=lambda s: s.name), ids=lambda s: s.name)
def test_each_script_documents_the_layout_python_builds(script: Script) -> None:
    own = _lua(script.files[-1])
    documented = [(int(i), name) for i, name in SLOT.findall(own)]
    assert documented == [(i, name) for name, i in script.slots.items()], (
        f"the ARGV comment of {script.files[-1]}.lua is not {script.name}'s layout in scripts.py"
    )
    parts = PARTS.findall(own)
    if script.parts:
        assert parts == [(str(len(script.slots) + 1), ", ".join(script.parts))]
    else:
        assert parts == []


@pytest.mark.parametrize("script", sorted(SCRIPTS.values(), key=lambda s: s.name), ids=lambda s: s.name)
def test_scripts_read_their_arguments_by_name_never_by_offset(script: Script) -> None:
    code = _code(_lua(script.files[-1]))
    assert "#ARGV" not in code and "KEYS" not in code
    assert not re.findall(r"ARGV\[\d", code), "a fixed slot read by its number: read it by its name"
    for name in script.header:
        assert re.search(rf"\b{name}\b", code), f"{script.name} never reads {name!r}"
    for f in script.files[:-1]:
        assert "ARGV" not in _code(_lua(f)), f"the fragment {f}.lua reads ARGV: pass it what it needs"


@pytest.mark.parametrize("script", sorted(SCRIPTS.values(), key=lambda s: s.name), ids=lambda s: s.name)
def test_the_preamble_binds_each_slot_to_its_name_between_the_fragments_and_the_script(
    script: Script,
) -> None:
    preamble = script.preamble()
    header = ", ".join(script.header)
    slots = ", ".join(f"ARGV[{i}]" for i in range(1, len(script.header) + 1))
    assert f"local {header} = {slots}" in preamble
    assert script.source == "\n".join(
        [*(_lua(f) for f in script.files[:-1]), preamble, _lua(script.files[-1])]
    )


def test_args_lays_out_the_header_then_the_counts_then_the_parts() -> None:
    s = Script("DEMO", ("emit",), ("prefix", "trace"), ("records", "pairs"))
    assert s.slots == {"prefix": 1, "trace": 2, "n_records": 3, "n_pairs": 4}
    assert s.args(trace="t", prefix="P", pairs=["k", "v"], records=[b"r1", b"r2", b"r3"]) == [
        "P",
        "t",
        3,
        2,
        b"r1",
        b"r2",
        b"r3",
        "k",
        "v",
    ]
    assert s.args(prefix="P", trace="t", records=[], pairs=[]) == ["P", "t", 0, 0]
    with pytest.raises(TypeError):
        s.args(prefix="P", trace="t", records=[])  # a part missing
    with pytest.raises(TypeError):
        s.args(prefix="P", trace="t", records=[], pairs=[], extra=1)  # a name it does not have
    with pytest.raises(TypeError):
        s.args("P", "t", [], [])  # names only
    with pytest.raises(ValueError):
        Script("BAD", ("emit",), ("n_records",), ("records",))  # a slot named like a count
    with pytest.raises(ValueError):
        Script("BAD", ("emit",), ("prefix", "prefix"))


@pytest.mark.parametrize("script", [s for s in SCRIPTS.values() if s.parts], ids=lambda s: s.name)
def test_parts_start_after_the_header_and_are_read_by_their_counts(script: Script) -> None:
    """Each part starts where the one before it ends, the first after the counts; the
    script reads each part from its start over its count."""
    preamble = script.preamble()
    counts = ", ".join(f"tonumber(ARGV[{script.slots['n_' + p]}])" for p in script.parts)
    assert f"local {', '.join('n_' + p for p in script.parts)} = {counts}" in preamble
    first, *rest = script.parts
    assert f"local at_{first} = {len(script.slots) + 1}" in preamble
    for before, part in zip(script.parts, rest):
        assert f"local at_{part} = at_{before} + n_{before}" in preamble
    code = _code(_lua(script.files[-1]))
    for part in script.parts:
        assert f"at_{part}" in code, f"{script.name} never reads its part {part!r}"
    if script is scripts.COMMIT:
        assert "local i = at_fields" in code and "if transition == 'advance' then" in code


def test_a_packed_layout_sends_its_slots_as_one_msgpack_array_with_numbers_as_redis_py_writes_them() -> None:
    s = Script(
        "DEMO", ("emit",), ("prefix", "now", "count"), ("records",), packed=True, numbers=("now", "count")
    )
    (packed,) = s.args(prefix="P", now=1765115430.123456, count=7, records=[b"\x00\xff", "é"])
    assert msgpack.unpackb(packed, raw=True) == [
        b"P",
        b"1765115430.123456",
        b"7",
        2,
        b"\x00\xff",
        "é".encode(),
    ]
    with pytest.raises(ValueError):
        Script("BAD", ("emit",), ("prefix",), numbers=("prefix",))  # numbers of a layout that is not packed
    with pytest.raises(ValueError):
        Script("BAD", ("emit",), ("prefix",), ("records",), packed=True, numbers=("records",))  # not a slot


@pytest.mark.parametrize("script", [s for s in SCRIPTS.values() if s.packed], ids=lambda s: s.name)
def test_a_packed_script_unpacks_its_argument_into_argv_before_it_binds_the_slots(script: Script) -> None:
    lines = script.preamble().splitlines()
    assert lines[1] == "local ARGV = cmsgpack.unpack(ARGV[1])"
    assert lines[2].startswith(f"local {', '.join(script.header)} = ARGV[1], ")
    assert not [s for s in SCRIPTS.values() if not s.packed and "cmsgpack.unpack(ARGV" in s.preamble()]


def _transitions(claim: Claim) -> dict[str, Transition]:
    m = claim.message
    branch = f"{m.trace_id}/2-0"
    child = NewRun(
        branch, frames_of("branch"), encode(0), Message(branch, 0, "b[0]"), parent=Parent(m.trace_id, 2, 0)
    )
    return {
        "advance": advance(claim, 1),
        "advance at a time": advance(claim, 1, at=1765115430.987654),
        "wait": Wait("approval", init_pending=True),
        "fork": Fork("zip", [child], Message(m.trace_id, 2, "a>b", 0, JOIN), frames_of("forked")),
        "finish": Finish(encode(2)),
        "fail": Fail({"type": "ValueError", "message": "no"}, compensated=True),
    }


@pytest.mark.parametrize("kind", list(_transitions(Claim(Message("run-1", 1, "a"), "tok", b"f", b"v", {}))))
def test_a_packed_commit_reaches_the_script_as_the_strings_redis_py_would_have_sent_one_by_one(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the script reads in each slot of its unpacked ARGV is what it read in ARGV when
    redis-py encoded each slot itself (the counts, read with tonumber, are integers)."""
    claim = Claim(Message("run-1", 1, "a"), "tok", b"f", b"v", {}, blobs=("b1",))
    transition = _transitions(claim)[kind]
    store = SimpleNamespace(
        _prefixes=("dflow",),
        ttl=7 * 86400.0,
        redispatch_after=30.0,
        _streams=("dflow:steps",),
        _group="g",
        _consumer="c",
        blob_ttl=3600.0,
    )
    record = StepRecord("a", 1, StepStatus.DONE, 0, "w", 1765115430.5, 0.25, None, encode(1))
    changes = {"k": b"\x00\xff\xfe", "gone": None, "dflow/saga/000000000001": b"entry"}
    monkeypatch.setattr(commits.time, "time", lambda: 1765115430.123456)
    args = partial(
        commits.commit_args,
        cast(Any, store),
        0,
        claim,
        [record],
        changes,
        encode_transition(transition, claim),
        b"1765115430123-0",
        "take-tok",
        30.0,
    )
    (packed,) = args()
    unpacked = msgpack.unpackb(packed, raw=True)
    plain = Script("PLAIN", scripts.COMMIT.files, scripts.COMMIT.header, scripts.COMMIT.parts)
    monkeypatch.setattr(scripts, "COMMIT", plain)
    encoder = Encoder("utf-8", "strict", False)
    one_by_one = [encoder.encode(v) for v in args()]
    counts = range(len(plain.header), len(plain.slots))
    assert all(type(unpacked[i]) is int for i in counts)
    assert [str(v).encode() if i in counts else v for i, v in enumerate(unpacked)] == one_by_one
