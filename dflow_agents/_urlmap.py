"""Short ids for long URLs: what a model reads and writes instead of the URLs themselves.

The ``n``-th URL a crawl meets is ``L<n>``. The map only grows (an id never changes
meaning), so a run keeps it as the list of URLs each step added, and any worker rebuilds
it from those lists in the same order.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

__all__ = ["UrlMap", "parse_id", "shorten_links"]

_ID = re.compile(r"^\s*[\[(<]?\s*[Ll](\d{1,9})\s*[\])>]?\s*$")


def parse_id(text: object) -> int | None:
    """The number of a short id (``"L12"``, ``"[L12]"``, ``" l12 "``) or ``None`` if ``text``
    is not one."""
    if not isinstance(text, str):
        return None
    found = _ID.match(text)
    return int(found.group(1)) if found else None


class UrlMap:
    """URLs and their short ids (``L0``, ``L1``...), in the order they were added."""

    __slots__ = ("_bytes", "_ids", "_urls")

    def __init__(self, urls: Iterable[str] = ()) -> None:
        self._urls: list[str] = []
        self._ids: dict[str, int] = {}
        self._bytes = 0
        self.extend(urls)

    def __len__(self) -> int:
        return len(self._urls)

    @property
    def bytes(self) -> int:
        """The characters of all its URLs (what bounds the map's size)."""
        return self._bytes

    def __contains__(self, url: object) -> bool:
        return url in self._ids

    def __repr__(self) -> str:
        return f"UrlMap({len(self._urls)} URLs)"

    def extend(self, urls: Iterable[str]) -> None:
        """Add ``urls`` in order (those already known keep their id)."""
        for url in urls:
            self.add(url)

    def add(self, url: str) -> int:
        """The number of ``url``'s id, added when it is new."""
        n = self._ids.get(url)
        if n is None:
            n = self._ids[url] = len(self._urls)
            self._urls.append(url)
            self._bytes += len(url)
        return n

    def short(self, url: str) -> str:
        """``url``'s short id (``"L12"``), added when it is new."""
        return f"L{self.add(url)}"

    def number(self, url: str) -> int | None:
        """The number of ``url``'s id, or ``None`` if it has none."""
        return self._ids.get(url)

    def at(self, n: int) -> str:
        """The URL whose id is ``L<n>`` (``IndexError`` if there is none)."""
        if n < 0:
            raise IndexError(n)
        return self._urls[n]

    def url(self, short: object) -> str | None:
        """The URL a short id stands for, or ``None`` for anything else."""
        n = parse_id(short)
        if n is None or n >= len(self._urls):
            return None
        return self._urls[n]

    def since(self, n: int) -> list[str]:
        """The URLs added after the first ``n`` (what a step adds, to store)."""
        return self._urls[n:]


_DROPPED = re.compile(r"\[([^\[\]\n]*)\]\(\x00\)")


def shorten_links(markdown: str, links: Sequence[str], short: dict[str, str]) -> str:
    """``markdown`` with each ``[text](url)`` link of ``links`` turned into ``[text](L12)``
    (its short id in ``short``); a link that has none becomes its text alone."""
    out = markdown
    dropped = False
    for url in sorted(set(links), key=len, reverse=True):  # a URL is never replaced inside a longer one
        old = f"]({url})"
        if old not in out:
            continue
        target = short.get(url)
        if target is None:
            dropped = True
        out = out.replace(old, f"]({target if target is not None else chr(0)})")
    return _DROPPED.sub(r"\1", out) if dropped else out
