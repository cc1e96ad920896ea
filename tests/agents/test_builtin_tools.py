"""The built-in tools against the real system: the shell tool (argv, never a shell; the
allow-list; the working directory; the timeout and the output cap killing the process group;
its own environment) and the file tools (paths kept under the root, symbolic links
included; size caps; text and binary), and an agent calling them as steps."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest

import dflow
from dflow_agents import AgentStatus, Tool, ToolCallAgent, file_tools, shell_tool
from dflow_agents.testing import ScriptedModel, call, reply


def run(tool: Tool, **arguments: Any) -> Any:
    return asyncio.run(tool.run(arguments))


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "notes.txt").write_text("first line\nsecond line\n")
    (tmp_path / "secret.txt").write_text("outside the root")
    return tmp_path / "work"


# -- the shell tool ---------------------------------------------------------------------------


def test_an_allowed_command_runs_in_the_working_directory(work: Path) -> None:
    shell = shell_tool(allow=["ls", "cat"], cwd=work)
    result = run(shell, command=["cat", "notes.txt"])
    assert result.ok
    assert result.observation == "exit code 0\n--- stdout ---\nfirst line\nsecond line\n"


def test_arguments_are_never_read_by_a_shell(work: Path) -> None:
    shell = shell_tool(allow=["echo"], cwd=work)
    result = run(shell, command=["echo", "a; touch pwned", "$(touch pwned2)", "*"])
    assert result.observation == "exit code 0\n--- stdout ---\na; touch pwned $(touch pwned2) *\n"
    assert not (work / "pwned").exists() and not (work / "pwned2").exists()


def test_a_command_off_the_allow_list_is_refused_saying_what_may_run(work: Path) -> None:
    shell = shell_tool(allow=["ls"], cwd=work)
    result = run(shell, command=["rm", "-rf", "."])
    assert not result.ok and result.error == "PermissionError"
    assert "'rm' is not an allowed command; the allowed ones are: ls" in result.observation
    assert (work / "notes.txt").exists()
    assert not run(shell, command=["/bin/ls"]).ok, "an allowed name is not an allowed path"


def test_a_failing_command_reports_its_exit_code_and_stderr(work: Path) -> None:
    result = run(shell_tool(allow=["ls"], cwd=work), command=["ls", "no-such-file"])
    assert result.ok, "a non-zero exit is a result the model reads"
    assert result.observation.startswith("exit code 2\n--- stderr ---\n")
    assert "no-such-file" in result.observation


def test_a_command_past_its_timeout_is_killed_with_its_children(work: Path) -> None:
    shell = shell_tool(allow=["sh"], cwd=work, timeout=1.0)
    t0 = time.monotonic()
    result = run(shell, command=["sh", "-c", "sleep 30 & echo $! > child.pid; wait"])
    assert time.monotonic() - t0 < 8
    assert "did not finish within 1 seconds and was killed" in result.observation
    child = int((work / "child.pid").read_text())
    time.sleep(0.2)
    assert gone(child), "the whole process group went, the command's children too"


def gone(pid: int) -> bool:
    """Whether ``pid`` no longer runs (exited, or a zombie no one has reaped yet)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


def test_output_past_the_cap_stops_the_command_and_is_cut(work: Path) -> None:
    shell = shell_tool(allow=["yes"], cwd=work, max_output_chars=1000, timeout=30)
    t0 = time.monotonic()
    result = run(shell, command=["yes"])
    assert time.monotonic() - t0 < 10, "stopped at the cap, not at the timeout"
    assert "the output passed 1000 characters and the command was killed" in result.observation
    assert len(result.observation) < 1200


def test_the_command_gets_an_environment_of_its_own(work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("API_KEY", "do-not-leak")
    result = run(shell_tool(allow=["env"], cwd=work), command=["env"])
    assert "do-not-leak" not in result.observation and "PATH=" in result.observation


def test_a_shell_string_is_taken_only_when_asked_for(work: Path) -> None:
    shell = shell_tool(allow=["echo"], cwd=work, shell=True)
    assert run(shell, command="echo one | tr o 0").observation.startswith("exit code 0"), "a pipe runs"
    assert "command" in shell.spec.parameters["properties"]
    assert shell.spec.parameters["properties"]["command"]["type"] == "string"
    assert not run(shell, command="rm -rf /").ok


def test_the_shell_tool_checks_its_settings() -> None:
    with pytest.raises(ValueError, match="allow is a list"):
        shell_tool(allow="ls", cwd=".")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="is not a directory"):
        shell_tool(allow=["ls"], cwd="/no/such/dir")


# -- the file tools ---------------------------------------------------------------------------


def tools_of(root: Path, **options: Any) -> dict[str, Tool]:
    return {t.name: t for t in file_tools(root, **options)}


def test_files_are_read_written_and_listed_under_the_root(work: Path) -> None:
    t = tools_of(work)
    assert run(t["read_file"], path="notes.txt").observation == "first line\nsecond line\n"
    assert run(t["write_file"], path="out/report.md", content="# done\n").observation == (
        "wrote 7 bytes to out/report.md"
    )
    assert (work / "out" / "report.md").read_text() == "# done\n"
    run(t["write_file"], path="out/report.md", content="more\n", append=True)
    assert (work / "out" / "report.md").read_text() == "# done\nmore\n"
    assert run(t["list_files"]).observation == "notes.txt (23 bytes)\nout/"


@pytest.mark.parametrize("path", ["../secret.txt", "/etc/passwd", "out/../../secret.txt"])
def test_a_path_outside_the_root_is_refused(work: Path, path: str) -> None:
    t = tools_of(work)
    for tool, args in [("read_file", {}), ("write_file", {"content": "x"})]:
        result = run(t[tool], path=path, **args)
        assert not result.ok and result.error == "PermissionError", result
        assert "outside the directory these tools may use" in result.observation
    assert (work.parent / "secret.txt").read_text() == "outside the root"


def test_a_symbolic_link_out_of_the_root_is_refused(work: Path) -> None:
    (work / "link.txt").symlink_to(work.parent / "secret.txt")
    (work / "linkdir").symlink_to(work.parent)
    t = tools_of(work)
    for path in ["link.txt", "linkdir/secret.txt"]:
        assert run(t["read_file"], path=path).error == "PermissionError"
        assert run(t["write_file"], path=path, content="overwritten").error == "PermissionError"
    assert (work.parent / "secret.txt").read_text() == "outside the root"


def test_a_symbolic_link_swapped_in_after_the_check_is_not_followed(work: Path) -> None:
    from dflow_agents.file_tools import _Root

    bounds = _Root(work.resolve(), 100, 100)
    checked = bounds.inside("notes.txt")
    (work / "notes.txt").unlink()
    (work / "notes.txt").symlink_to(work.parent / "secret.txt")  # the race's other side
    with pytest.raises(PermissionError, match="symbolic link"), bounds.opened(checked, os.O_RDONLY):
        pass


def test_reads_are_cut_and_read_on_and_binary_files_are_described(work: Path) -> None:
    (work / "long.txt").write_text("x" * 250)
    (work / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(100))
    t = tools_of(work, max_read_chars=100)
    first = run(t["read_file"], path="long.txt").observation
    assert first == "x" * 100 + "\n[... about 150 more bytes: read on with offset=100]"
    assert run(t["read_file"], path="long.txt", offset=200).observation == "x" * 50
    assert run(t["read_file"], path="image.png").observation == "[image.png is not UTF-8 text: 116 bytes]"


def test_a_write_past_the_cap_is_refused_whole(work: Path) -> None:
    t = tools_of(work, max_write_bytes=10)
    result = run(t["write_file"], path="big.txt", content="y" * 11)
    assert not result.ok and "11 bytes is more than the 10 a write may take" in result.observation
    assert not (work / "big.txt").exists()


def test_read_only_file_tools_cannot_write(work: Path) -> None:
    assert set(tools_of(work, read_only=True)) == {"read_file", "list_files"}


# -- in an agent ------------------------------------------------------------------------------


def test_an_agent_calls_the_built_in_tools_each_as_a_step(local: dflow.Runtime, work: Path) -> None:
    model = ScriptedModel(
        [
            reply(calls=[call("shell", command=["wc", "-l", "notes.txt"])]),
            reply(calls=[call("write_file", path="count.txt", content="2")]),
            reply("notes.txt has 2 lines"),
        ]
    )
    tools = [shell_tool(allow=["wc"], cwd=work), *file_tools(work)]
    result = ToolCallAgent("builtin-tools-agent", model, tools).run("count the lines").result(30)
    assert result.status is AgentStatus.FINISHED
    assert [m.content for m in model.requests[1].messages if m.role == "tool"] == [
        "exit code 0\n--- stdout ---\n2 notes.txt\n"
    ]
    assert (work / "count.txt").read_text() == "2"
