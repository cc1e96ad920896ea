"""A shell tool: run an allowed command in a working directory, bounded in time and output.

``shell_tool(allow=["ls", "grep", "python3"], cwd="/srv/work")`` is a :class:`Tool` the model
calls with an argv list (``["grep", "-rn", "TODO", "."]``). The command runs without a shell,
so nothing in the arguments is interpreted (no ``;``, ``|``, ``$(...)``, globbing); only the
programs of ``allow`` run, by name (found on ``PATH``) or by the absolute path given there. It
runs in ``cwd``, with an environment of its own (``PATH``, ``HOME``, ``LANG``; not this
process's secrets), in a process group of its own: at the timeout, or when its output passes
the cap, the whole group is killed. ``shell=True`` lets the model send one string for
``/bin/sh -c`` instead, with the allow-list checked on its first word only: use it only where
the model is trusted as much as a shell user.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from .tools import Tool

__all__ = ["shell_tool"]

_ENV_KEPT = ("PATH", "HOME", "LANG", "LC_ALL", "TZ")


class _Shell:
    """The command runner behind ``shell_tool`` (a plain object: it pickles)."""

    def __init__(
        self,
        allow: Sequence[str],
        cwd: Path,
        timeout: float,
        max_output_chars: int,
        env: Mapping[str, str],
    ) -> None:
        self.allow = tuple(allow)
        self.cwd = cwd
        self.timeout = timeout
        self.max_output_chars = max_output_chars
        self.env = dict(env)

    def program(self, name: str) -> str:
        """The executable ``name`` runs, if the allow-list has it; ``PermissionError`` saying
        what may run otherwise."""
        if name in self.allow:
            if os.path.isabs(name):
                return name
            found = shutil.which(name, path=self.env.get("PATH"))
            if found:
                return found
            raise FileNotFoundError(f"the allowed command {name!r} is not on PATH")
        raise PermissionError(
            f"{name!r} is not an allowed command; the allowed ones are: {', '.join(self.allow)}"
        )

    async def run(self, argv: list[str]) -> str:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=self.cwd,
            env=self.env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # its own process group: killed whole
        )
        out, err = bytearray(), bytearray()
        cap, over = self.max_output_chars, asyncio.Event()
        why: str | None = None
        # the drains read to the end of both pipes even past the cap (keeping nothing more):
        # a pipe left unread stops asyncio from seeing its end, and the process's exit with it
        reading = asyncio.ensure_future(
            asyncio.gather(_drain(proc.stdout, out, err, cap, over), _drain(proc.stderr, err, out, cap, over))
        )
        watching = asyncio.ensure_future(over.wait())
        try:
            either: set[asyncio.Future[Any]] = {reading, watching}
            await asyncio.wait(either, timeout=self.timeout, return_when=asyncio.FIRST_COMPLETED)
            if over.is_set():
                why = f"the output passed {cap} characters and the command was killed"
            elif not reading.done():
                why = f"the command did not finish within {self.timeout:g} seconds and was killed"
            if why is not None:
                _kill(proc)
            # a child that left the process group may hold a pipe open: its end is not awaited
            await asyncio.wait({reading}, timeout=_AFTER_KILL)
            if not reading.done():
                _close_pipes(proc)
            code = await asyncio.wait_for(proc.wait(), _AFTER_KILL)
        finally:
            if proc.returncode is None:
                _kill(proc)
            for task in (reading, watching):
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
            _close_pipes(proc)
        return _report(code, out, err, cap, why)


_AFTER_KILL = 5.0  # seconds given to a killed command's pipes to end and its exit to be seen


async def _drain(
    stream: asyncio.StreamReader | None, into: bytearray, other: bytearray, cap: int, over: asyncio.Event
) -> None:
    """Read ``stream`` to its end, keeping it in ``into`` until both outputs pass ``cap``."""
    if stream is None:
        return
    while chunk := await stream.read(65536):
        if over.is_set():
            continue
        into += chunk
        if len(into) + len(other) > cap:
            over.set()


def _close_pipes(proc: asyncio.subprocess.Process) -> None:
    """Close the command's pipes now, in this event loop.

    Where a child that left the process group keeps a pipe open, the pipe never ends, and
    asyncio would close it only when the process object is collected, perhaps after the loop
    is gone ("Event loop is closed"). ``Process`` has no public close;
    its transport's ``close`` is what asyncio itself calls then.
    """
    transport = getattr(proc, "_transport", None)
    if transport is not None:
        transport.close()


def _kill(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _text(data: bytes | bytearray, limit: int) -> str:
    text = bytes(data).decode("utf-8", errors="replace")
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n[... {len(text) - limit} more characters cut]"


def _report(code: int, out: bytearray, err: bytearray, cap: int, why: str | None) -> str:
    parts = [f"exit code {code}" if why is None else f"exit code {code} ({why})"]
    if out:
        parts.append(f"--- stdout ---\n{_text(out, cap)}")
    if err:
        parts.append(f"--- stderr ---\n{_text(err, max(cap - len(out), 200))}")
    return "\n".join(parts)


def shell_tool(
    *,
    allow: Sequence[str],
    cwd: str | os.PathLike[str],
    timeout: float = 10.0,
    max_output_chars: int = 20_000,
    env: Mapping[str, str] | None = None,
    shell: bool = False,
    name: str = "shell",
) -> Tool:
    """A :class:`Tool` that runs one allowed command (see the module).

    Args:
        allow: the programs that may run: names found on ``PATH``, or absolute paths.
        cwd: the working directory (it must exist).
        timeout: seconds before the command's process group is killed.
        max_output_chars: the most output kept (stdout and stderr together); past it, the
            command is killed.
        env: the command's whole environment (default: ``PATH``, ``HOME``, ``LANG``, ``LC_ALL``
            and ``TZ`` of this process).
        shell: take one string for ``/bin/sh -c`` instead of an argv list (the allow-list
            then checks its first word only).
        name: the tool's name.
    """
    if isinstance(allow, str) or not allow:
        raise ValueError("allow is a list of the commands that may run, such as ['ls', 'grep']")
    where = Path(cwd).resolve()
    if not where.is_dir():
        raise ValueError(f"cwd {str(cwd)!r} is not a directory")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")
    if isinstance(max_output_chars, bool) or not isinstance(max_output_chars, int) or max_output_chars < 100:
        raise ValueError(f"max_output_chars must be a whole number >= 100, got {max_output_chars!r}")
    kept = dict(env) if env is not None else {k: os.environ[k] for k in _ENV_KEPT if k in os.environ}
    runner = _Shell(allow, where, float(timeout), max_output_chars, kept)
    fn = _ShellString(runner) if shell else _ShellArgv(runner)
    listed = ", ".join(runner.allow)
    how = "one command line for /bin/sh" if shell else "an argv list (no shell: no pipes, globs or $VARS)"
    description = (
        f"Run a command in the working directory and get its exit code and output. Give {how}. "
        f"Allowed commands: {listed}. Output is cut at {max_output_chars} characters; "
        f"a command is killed after {timeout:g} seconds."
    )
    # the timeout is the runner's own (it kills the process group): the tool never abandons it
    return Tool(fn, name=name, description=description, timeout=float(timeout) + 10.0)


class _ShellArgv:
    def __init__(self, runner: _Shell) -> None:
        self.runner = runner

    async def __call__(
        self,
        command: Annotated[
            list[str],
            Field(min_length=1, description='the program and its arguments, e.g. ["ls", "-la", "src"]'),
        ],
    ) -> str:
        program = self.runner.program(command[0])
        return await self.runner.run([program, *command[1:]])


class _ShellString:
    def __init__(self, runner: _Shell) -> None:
        self.runner = runner

    async def __call__(
        self,
        command: Annotated[str, Field(min_length=1, description="a command line, run with /bin/sh -c")],
    ) -> str:
        words = command.split()
        if not words:
            raise ValueError("the command is empty")
        self.runner.program(words[0])
        return await self.runner.run(["/bin/sh", "-c", command])
