"""A site's robots.txt rules, as :meth:`dflow_agents.fetch.Fetcher.robots` reads them
(RFC 9309, with the standard library's ``urllib.robotparser``), kept as JSON data in a
crawl's run. Imported from :mod:`dflow_agents.fetch`."""

from __future__ import annotations

import urllib.robotparser
from typing import Any

__all__ = ["USER_AGENT", "Robots"]

#: What the fetcher calls itself, in requests and when it reads robots.txt.
USER_AGENT = "dflow-crawler/0.2"


class Robots:
    """A site's robots.txt rules (RFC 9309): read from its text; a robots.txt that is
    missing (4xx) allows everything, one that could not be fetched (5xx, no answer in time,
    no connection: the site is :attr:`unreachable`) disallows everything, and ``note`` says
    what happened."""

    __slots__ = ("_parser", "note", "status", "text")

    def __init__(self, status: int, text: str = "", note: str = "") -> None:
        self.status = int(status)
        self.text = str(text)
        self.note = str(note)
        self._parser: urllib.robotparser.RobotFileParser | None = None

    @property
    def unreachable(self) -> bool:
        """Whether robots.txt could not be read (a server error or no answer): the site is
        taken as unreachable and nothing of it is fetched."""
        return not (200 <= self.status < 300 or 400 <= self.status < 500)

    def to_data(self) -> dict[str, Any]:
        """The rules as JSON data (what a run keeps)."""
        data: dict[str, Any] = {"status": self.status, "text": self.text}
        if self.note:
            data["note"] = self.note
        return data

    @classmethod
    def from_data(cls, data: Any) -> Robots:
        """Rules back from :meth:`to_data`."""
        return cls(int(data["status"]), str(data.get("text") or ""), str(data.get("note") or ""))

    def allows(self, url: str, user_agent: str = USER_AGENT) -> bool:
        """Whether ``user_agent`` may fetch ``url``."""
        if 400 <= self.status < 500:
            return True
        if self.unreachable:
            return False
        if self._parser is None:
            parser = urllib.robotparser.RobotFileParser()
            parser.parse(self.text.splitlines())
            self._parser = parser
        return self._parser.can_fetch(user_agent, url)

    def __repr__(self) -> str:
        note = f", {self.note[:80]!r}" if self.note else ""
        return f"Robots(status={self.status}, {len(self.text)} chars{note})"
