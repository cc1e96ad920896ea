"""The text of connection URLs: hiding their secrets, reading their query strings.

Below the adapters, which use it; ``runtime.connect`` makes stores and transports from URLs.
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit, urlunsplit

_SECRET_NAME = re.compile(r"pass|secret|token|key|credential|auth", re.IGNORECASE)


def redact_url(url: str) -> str:
    """``url`` fit to print or log: the password of its userinfo and every query value
    whose name sounds secret (``sasl_plain_password``, ``ssl_password``, ``token``...)
    replaced by ``***``."""
    try:
        raw = str(url)
        parts = urlsplit(raw)
        scheme, sep, rest = raw.partition("://")
        if sep and "@" in rest and "@" not in parts.netloc:  # a '/', '?' or '#' in the password
            return redact_url(f"{scheme}://***@{rest.rpartition('@')[2]}")
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, _, hosts = netloc.rpartition("@")
            user = userinfo.split(":", 1)[0]
            netloc = f"{user}:***@{hosts}" if ":" in userinfo else f"***@{hosts}" if not user else netloc
        query = "&".join(
            f"{k}=***" if _SECRET_NAME.search(unquote(k)) else (f"{k}={v}" if sep else k)
            for k, sep, v in (item.partition("=") for item in parts.query.split("&") if item)
        )
        return urlunsplit(parts._replace(netloc=netloc, query=query))
    except Exception:  # not even a URL: show nothing of it
        return "<a URL that could not be read>"


def query_items(query: str) -> list[tuple[str, str]]:
    """The settings of a URL's query, percent-decoded and otherwise as written: ``+`` stays
    a plus (a password may hold one), values stay strings."""
    out = []
    for item in query.split("&"):
        if item:
            k, _, v = item.partition("=")
            out.append((unquote(k), unquote(v)))
    return out
