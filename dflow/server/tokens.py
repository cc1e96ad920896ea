"""Session tokens: who may read, answer and cancel which runs of ``dflow serve``.

A *session* groups the runs a client started. Its token is a bearer secret that names the
session and when it expires, signed with the server's secret (HMAC-SHA256)::

    dfs1.<base64url(session id "\\n" expiry)>.<base64url(HMAC-SHA256)>

The server keeps no table of tokens: any server process with the same secret
(``DFLOW_SERVER_SECRET``) checks one with a constant-time comparison, and a token stops
working at its expiry. A token cannot be revoked before then: keep lifetimes short and
hand out new tokens (``POST /sessions`` with the session id) as a session goes on.

The *admin token* (``DFLOW_SERVER_TOKEN``) is another kind of secret: whoever holds it
may create sessions and mint their tokens. It is compared in constant time too, and never
leaves the server's environment.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import secrets
import time
from dataclasses import dataclass

from ..errors import ConfigurationError

__all__ = ["MIN_SECRET_BYTES", "SESSION_ID", "AdminToken", "Session", "TokenError", "Tokens"]

MIN_SECRET_BYTES = 32  #: a server secret or an admin token is at least this long
#: what a session id may be: letters, digits and ``_ : @ -``, 1 to 128 of them
SESSION_ID = re.compile(r"[A-Za-z0-9_:@-]{1,128}")
_PREFIX = "dfs1."
_DOMAIN = b"dflow server session token v1"
_B64 = re.compile(r"[A-Za-z0-9_-]*")
_MAX_TOKEN = 512  # characters: a longer bearer value is not one of ours, and is not parsed


class TokenError(Exception):
    """A bearer token was refused. ``reason`` says why in words a client can act on
    (never echoing the token); ``expired`` tells an expired token from a bad one."""

    def __init__(self, reason: str, *, expired: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.expired = expired


@dataclass(frozen=True, slots=True)
class Session:
    """A checked session token: the session it names and when it expires (epoch seconds)."""

    id: str
    expires_at: float


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    """``text`` decoded, if it is exactly what :func:`_b64` writes (the URL-safe alphabet, no
    padding, zero pad bits): ``ValueError`` otherwise, so that no other spelling of a token
    verifies."""
    if _B64.fullmatch(text) is None:
        raise ValueError("not unpadded URL-safe base64")
    raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if _b64(raw) != text:
        raise ValueError("not the canonical encoding")
    return raw


def _key_bytes(secret: str | bytes, what: str, env: str) -> bytes:
    key = secret.encode() if isinstance(secret, str) else bytes(secret)
    if len(key) < MIN_SECRET_BYTES:
        raise ConfigurationError(
            f"{what} is {len(key)} bytes; it needs at least {MIN_SECRET_BYTES} ({env}). Make one with: "
            "python -c 'import secrets; print(secrets.token_urlsafe(32))'"
        )
    return key


def check_session_id(session: object) -> str:
    """``session`` if it may name a session; ``ValueError`` saying why not."""
    if not isinstance(session, str) or SESSION_ID.fullmatch(session) is None:
        shown = (
            repr(session)
            if not isinstance(session, str) or len(session) <= 40
            else repr(session[:37] + "...")
        )
        raise ValueError(f"a session id is 1 to 128 letters, digits and _ : @ -, got {shown}")
    return session


def new_session_id() -> str:
    """A fresh random session id (128 bits)."""
    return secrets.token_urlsafe(16)


class Tokens:
    """Issues and checks session tokens with one server secret.

    ``secret`` is at least 32 bytes; ``None`` makes a random one, so that tokens die with
    the process (fine for one server in local mode; give every server process of a
    deployment the same ``DFLOW_SERVER_SECRET``). ``ttl`` is a token's lifetime in seconds
    unless ``issue`` is asked for less; ``max_ttl`` bounds what it may be asked for.
    """

    def __init__(
        self, secret: str | bytes | None = None, *, ttl: float = 3600.0, max_ttl: float = 86400.0
    ) -> None:
        if secret is None:
            secret = secrets.token_bytes(32)
            self.ephemeral = True
        else:
            self.ephemeral = False
        raw = _key_bytes(secret, "the server secret", "DFLOW_SERVER_SECRET")
        self._key = hmac.digest(raw, _DOMAIN, "sha256")  # its own key: never the secret itself
        for name, value in (("ttl", ttl), ("max_ttl", max_ttl)):
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not 1 <= value <= 365 * 86400
            ):
                raise ConfigurationError(f"token {name} is seconds between 1 and a year, got {value!r}")
        if ttl > max_ttl:
            raise ConfigurationError(f"token ttl ({ttl:g} s) is over max_ttl ({max_ttl:g} s)")
        self.ttl = float(ttl)
        self.max_ttl = float(max_ttl)

    @classmethod
    def from_env(cls, *, ttl: float = 3600.0, max_ttl: float = 86400.0) -> Tokens:
        """Tokens signed with ``DFLOW_SERVER_SECRET`` (a random secret when it is unset)."""
        return cls(os.environ.get("DFLOW_SERVER_SECRET") or None, ttl=ttl, max_ttl=max_ttl)

    def _mac(self, body: bytes) -> bytes:
        return hmac.digest(self._key, body, "sha256")

    def issue(self, session: str, ttl: float | None = None, *, now: float | None = None) -> tuple[str, float]:
        """A token for ``session`` and its expiry; ``ttl`` (seconds) at most ``max_ttl``."""
        check_session_id(session)
        if ttl is None:
            ttl = self.ttl
        elif isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not 1 <= ttl <= self.max_ttl:
            raise ValueError(f"a token's ttl is seconds between 1 and {self.max_ttl:g}, got {ttl!r}")
        expires = int((time.time() if now is None else now) + ttl)
        body = f"{session}\n{expires}".encode()
        return f"{_PREFIX}{_b64(body)}.{_b64(self._mac(body))}", float(expires)

    def verify(self, token: str, *, now: float | None = None) -> Session:
        """The session ``token`` names; ``TokenError`` when it is malformed, forged (or
        signed with another secret) or expired. The signature is checked before anything
        the token says is believed, in constant time."""
        if not isinstance(token, str) or not token.startswith(_PREFIX) or len(token) > _MAX_TOKEN:
            raise TokenError("the bearer token is not a dflow session token")
        parts = token[len(_PREFIX) :].split(".")
        try:
            if len(parts) != 2:
                raise ValueError
            body, mac = _unb64(parts[0]), _unb64(parts[1])
        except (ValueError, UnicodeEncodeError):
            raise TokenError("the bearer token is not a dflow session token") from None
        if not hmac.compare_digest(mac, self._mac(body)):
            raise TokenError(
                "the session token's signature does not verify (forged, or issued by another server)"
            )
        session, _, expiry = body.decode("utf-8", "replace").partition("\n")
        expires = float(int(expiry))  # the server wrote it: it is an integer
        if expires <= (time.time() if now is None else now):
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expires))
            raise TokenError(
                f"the session token expired at {stamp}; ask for a new one (POST /sessions)", expired=True
            )
        return Session(session, expires)


class AdminToken:
    """The token that may create sessions, compared in constant time (as digests, so the
    comparison takes as long whatever the length of the guess)."""

    def __init__(self, token: str) -> None:
        self._digest = hashlib.sha256(_key_bytes(token, "the admin token", "DFLOW_SERVER_TOKEN")).digest()

    def matches(self, candidate: str) -> bool:
        """Whether ``candidate`` is the admin token."""
        return hmac.compare_digest(
            self._digest, hashlib.sha256(candidate.encode("utf-8", "replace")).digest()
        )

    def __repr__(self) -> str:
        return "AdminToken(***)"
