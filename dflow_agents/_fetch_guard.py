"""What keeps the built-in fetcher within bounds: bodies read raw and inflated no further
than a byte budget, and the addresses a fetcher may reach.

:func:`read_body` reads a response's raw bytes and inflates gzip or deflate with a
``zlib.decompressobj`` asked for no more than the budget left (a gzip bomb costs its budget,
not its inflated size); an encoding it does not inflate (``br``, ``zstd``, two layers) is a
:class:`BodyError`, never read. The fetcher asks only for gzip and deflate
(:data:`ACCEPT_ENCODING`).

:func:`refusal` says why a URL's host may not be fetched: a literal IP address, or a host
name resolving to one, that is private, loopback, link-local, reserved, multicast or
unspecified (the cloud metadata service at 169.254.169.254 among them). The check resolves
the name before the request and the HTTP client resolves it again to connect: a DNS server
that answers a public address first and a private one next (DNS rebinding) gets past it.
Where that matters, fetch through a proxy that enforces the same rule.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import zlib
from urllib.parse import urlsplit

import httpx

__all__ = ["ACCEPT_ENCODING", "BodyError", "read_body", "refusal"]

#: The encodings the fetcher asks for: those it inflates within a budget.
ACCEPT_ENCODING = "gzip, deflate"

_IP = ipaddress.IPv4Address | ipaddress.IPv6Address


class BodyError(Exception):
    """A body the fetcher does not read: an encoding it does not inflate, or corrupt data."""


class _Inflater:
    """One gzip or deflate layer, inflated at most ``limit`` bytes at a time."""

    def __init__(self, coding: str) -> None:
        self.coding = coding
        self._first = True
        self._inflate = zlib.decompressobj(16 + zlib.MAX_WBITS if coding == "gzip" else zlib.MAX_WBITS)

    def inflate(self, data: bytes, limit: int) -> bytes:
        """At most ``limit`` (>= 1) bytes inflated from ``data``; what is left of ``data``
        once ``limit`` is reached is never inflated."""
        first, self._first = self._first, False
        try:
            return self._inflate.decompress(data, limit)
        except zlib.error as exc:
            if first and self.coding == "deflate":  # raw deflate, without the zlib wrapper
                self._inflate = zlib.decompressobj(-zlib.MAX_WBITS)
                return self.inflate(data, limit)
            raise BodyError(f"the {self.coding} body is corrupt ({exc})") from None


async def read_body(response: httpx.Response, limit: int) -> tuple[bytes, bool]:
    """At most ``limit`` bytes of ``response``'s body, inflated when it is gzip or deflate
    (never more than ``limit + 1`` bytes at once); and whether the body had more."""
    codings = [c.strip().lower() for c in response.headers.get("content-encoding", "").split(",")]
    codings = [c for c in codings if c and c != "identity"]
    inflater = None
    if len(codings) > 1:
        raise BodyError(
            f"the body is encoded {len(codings)} times ({', '.join(codings)[:100]}); the fetcher "
            "inflates one layer of gzip or deflate"
        )
    if codings:
        coding = "gzip" if codings[0] == "x-gzip" else codings[0]
        if coding not in ("gzip", "deflate"):
            raise BodyError(
                f"the body is encoded as {coding[:40]!r}, which the fetcher does not read "
                f"(it asks for {ACCEPT_ENCODING})"
            )
        inflater = _Inflater(coding)
    body = bytearray()
    async for chunk in response.aiter_raw():  # as sent: inflated here, within the budget
        room = limit - len(body)
        data = inflater.inflate(chunk, room + 1) if inflater is not None else chunk
        if len(data) > room:
            body += data[:room]
            return bytes(body), True  # leaving the stream closes the connection: the rest is never read
        body += data
    return bytes(body), False


async def refusal(url: str) -> str | None:
    """Why the host of ``url`` may not be fetched by a fetcher that keeps to public
    addresses, or ``None`` when it may."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        literal: _IP | None = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    if literal is not None:
        return _refused(host, literal) if _blocked(literal) else None
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        found = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError, ValueError) as exc:
        return (
            f"not fetched: the host name {host[:200]!r} could not be resolved ({type(exc).__name__}: {exc})"
        )
    for info in found:
        try:
            address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        except ValueError:
            return f"not fetched: the host name {host[:200]!r} resolves to {info[4][0]!r}, not an IP address"
        if _blocked(address):
            return _refused(host, address)
    return None


def _blocked(ip: _IP) -> bool:
    """Whether ``ip`` is not a public unicast address."""
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour
        if embedded is not None:
            return _blocked(embedded)
        if ip.is_site_local:
            return True
    return not ip.is_global or ip.is_multicast or ip.is_reserved or ip.is_unspecified


def _refused(host: str, ip: _IP) -> str:
    shown = host[:200] if host == str(ip) else f"{host[:200]} ({ip})"
    return (
        f"not fetched: {shown} is a private, loopback, link-local or reserved address; the fetcher "
        "reaches only public addresses unless made with Fetcher(allow_private=True)"
    )
