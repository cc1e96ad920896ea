"""The Redis store's Lua scripts: each file documents the ARGV layout that Python builds, and
reads its arguments by the names the layout gives them, never by their offsets."""

from __future__ import annotations

import re
from importlib import resources

import pytest

pytest.importorskip("redis")

from dflow.adapters.redis import scripts
from dflow.adapters.redis.notes import SCRIPTS as NOTE_SCRIPTS
from dflow.adapters.redis.rate_limits import SCRIPTS as RATE_SCRIPTS
from dflow.adapters.redis.schedules import SCRIPTS as SCHEDULE_SCRIPTS
from dflow.adapters.redis.scripts import SCRIPTS, Script
from dflow.adapters.redis.state import SCRIPTS as STATE_SCRIPTS
from dflow.adapters.redis.workers import SCRIPTS as WORKER_SCRIPTS

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
