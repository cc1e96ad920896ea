"""A browser tool: Chromium driven through Playwright, one page per call.

``browser_tool()`` is a :class:`Tool` whose call opens a URL in a fresh page (no cookies or
storage from other calls), does the given actions in order (``click`` a selector, ``type``
text into one, ``press`` a key, ``wait`` for a selector), then reads the text of a selector
(the whole page by default) and, if asked, takes a screenshot. One call is one step, and
holds all it needs: a step run again on another worker opens the page again and does the
same, where a browser left open between steps would be lost with its worker.

It drives the system's Chromium (``executable_path``, or ``chromium`` on ``PATH``), never a
browser Playwright downloads. One browser is started per process and event loop, when the
first call comes. Like the fetcher, it reaches only public addresses unless made with
``allow_private=True``: the URL and every request of the page (redirects, frames, scripts)
are checked, and those refused are not sent. Text is cut at ``max_text_chars``; a
screenshot is a PNG file in ``screenshots`` (a directory), of which the model reads the
path and size.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import uuid
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ._fetch_guard import refusal
from .tools import Tool

__all__ = ["BrowserAction", "browser_tool"]

_browsers: dict[int, tuple[asyncio.AbstractEventLoop, Any, Any]] = {}  # loop id: (loop, playwright, browser)
_starting: dict[int, asyncio.Lock] = {}


class BrowserAction(BaseModel):
    """One thing the browser does on the page, in order: ``click`` the element of
    ``selector``, ``type`` ``text`` into it, ``press`` the key ``text`` (``"Enter"``) on it,
    or ``wait`` until it is there."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    do: Literal["click", "type", "press", "wait"]
    selector: str = Field(description="a CSS selector, or text=... for an element by its text")
    text: str | None = Field(default=None, description="what to type, or the key to press")


class _Browser:
    """The settings behind ``browser_tool`` (a plain object: it pickles)."""

    def __init__(
        self,
        executable: str,
        timeout: float,
        max_text_chars: int,
        screenshots: Path | None,
        allow_private: bool,
    ) -> None:
        self.executable = executable
        self.timeout = timeout
        self.max_text_chars = max_text_chars
        self.screenshots = screenshots
        self.allow_private = allow_private

    async def __call__(
        self,
        url: Annotated[str, Field(description="the page to open (http or https)")],
        actions: Annotated[
            list[BrowserAction], Field(description="what to do on the page, in order", max_length=50)
        ] = [],  # noqa: B006 - pydantic copies defaults
        read: Annotated[str, Field(description="the CSS selector whose text to read")] = "body",
        screenshot: Annotated[bool, Field(description="take a screenshot at the end")] = False,
    ) -> str:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"only http and https pages are opened, not {url[:100]!r}")
        if not self.allow_private:
            refused = await refusal(url)
            if refused is not None:
                raise PermissionError(refused.replace("not fetched", "not opened").split("; the fetcher")[0])
        browser = await _browser(self.executable)
        context = await browser.new_context(accept_downloads=False, service_workers="block")
        try:
            context.set_default_timeout(self.timeout * 1000)
            page = await context.new_page()
            if not self.allow_private:
                await page.route("**/*", _guard)
            response = await page.goto(url, wait_until="load")
            said = [f"opened {page.url}" + (f" (HTTP {response.status})" if response is not None else "")]
            for step in actions:
                await _act(page, step)
                said.append(f"{step.do} {step.selector}: done")
            text = await page.inner_text(read)
            said.append(f"--- text of {read} ---\n{_cut(text, self.max_text_chars)}")
            if screenshot:
                said.append(await self._screenshot(page))
            return "\n".join(said)
        finally:
            await context.close()

    async def _screenshot(self, page: Any) -> str:
        if self.screenshots is None:
            return "[no screenshot: the tool was made without a screenshots directory]"
        path = self.screenshots / f"screenshot-{uuid.uuid4().hex[:12]}.png"
        data = await page.screenshot(path=str(path), full_page=False)
        return f"[screenshot {path.name}: image/png, {len(data)} bytes]"


async def _act(page: Any, step: BrowserAction) -> None:
    if step.do == "click":
        await page.click(step.selector)
    elif step.do == "type":
        await page.fill(step.selector, step.text or "")
    elif step.do == "press":
        await page.press(step.selector, step.text or "Enter")
    else:
        await page.wait_for_selector(step.selector)


async def _guard(route: Any) -> None:
    """Let a request of the page go only to a public address."""
    if await refusal(route.request.url) is None:
        await route.continue_()
    else:
        await route.abort("blockedbyclient")


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n[... {len(text) - limit} more characters cut]"


async def _browser(executable: str) -> Any:
    """This loop's browser, launched on first use (and again if it was closed)."""
    loop = asyncio.get_running_loop()
    key = id(loop)
    lock = _starting.setdefault(key, asyncio.Lock())
    async with lock:
        held = _browsers.get(key)
        if held is not None and held[0] is loop and held[2].is_connected():
            return held[2]
        from playwright.async_api import async_playwright

        driver = await async_playwright().start()
        try:
            browser = await driver.chromium.launch(executable_path=executable, headless=True)
        except BaseException:
            await driver.stop()
            raise
        _browsers[key] = (loop, driver, browser)
        return browser


async def close_browsers() -> None:
    """Close this loop's browser (the tests do, before their loop ends)."""
    held = _browsers.pop(id(asyncio.get_running_loop()), None)
    if held is not None:
        with contextlib.suppress(Exception):
            await held[2].close()
        with contextlib.suppress(Exception):
            await held[1].stop()


def browser_tool(
    *,
    executable_path: str | os.PathLike[str] | None = None,
    timeout: float = 15.0,
    max_text_chars: int = 20_000,
    screenshots: str | os.PathLike[str] | None = None,
    allow_private: bool = False,
    name: str = "browser",
) -> Tool:
    """A :class:`Tool` that opens a page in Chromium and acts on it (see the module).

    Args:
        executable_path: the Chromium to run (default: ``chromium`` or ``chromium-browser``
            on ``PATH``); never a downloaded browser.
        timeout: seconds each step on the page may take (opening it, an action, reading).
        max_text_chars: the most text of the page the model reads.
        screenshots: the directory screenshots are saved in (``None``: no screenshots).
        allow_private: also open private, loopback and link-local addresses.
        name: the tool's name.
    """
    try:
        import playwright.async_api  # noqa: F401 - only whether it is there
    except ImportError as exc:
        raise ImportError(
            f"browser_tool needs playwright: pip install 'dflow-runtime[browser]' ({exc})"
        ) from exc
    found = (
        str(executable_path)
        if executable_path
        else shutil.which("chromium") or shutil.which("chromium-browser")
    )
    if not found or not os.access(found, os.X_OK):
        raise FileNotFoundError(
            "browser_tool drives the system's Chromium: install it (apt-get install chromium) or pass "
            "executable_path; it never downloads a browser"
        )
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")
    folder = Path(screenshots).resolve() if screenshots is not None else None
    if folder is not None and not folder.is_dir():
        raise ValueError(f"screenshots {str(screenshots)!r} is not a directory")
    runner = _Browser(found, float(timeout), max_text_chars, folder, bool(allow_private))
    description = (
        "Open a web page in a browser, do actions on it in order (click, type, press, wait), then read "
        "the text of a selector (the whole page by default)"
        + (" and take a screenshot if asked." if folder is not None else ".")
    )
    return Tool(runner, name=name, description=description, timeout=float(timeout) * 4 + 10)
