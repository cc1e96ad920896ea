"""Who may use the web console: a credential in a cookie, and the checks that keep other
web pages from acting with it.

A browser cannot send an ``Authorization`` header on a page load, so the console's login
form takes the server's admin token (``DFLOW_SERVER_TOKEN``) once and answers with a
cookie holding a *credential*, never the token itself::

    c1.<expiry>.<nonce>.<base64url(HMAC-SHA256(key, "c1.<expiry>.<nonce>"))>

``key`` is derived from the admin token (HMAC with a label of its own), so every server
process with that token accepts the credential, changing the token voids every
credential, and a credential is no use as a token of the HTTP API. The cookie is
``HttpOnly`` (scripts cannot read it), ``SameSite=Strict`` (no other site's page or link
sends it), ``Path=/console``, and expires with the credential. Scripts may send the admin
token as a bearer token instead.

Reading needs a credential; a write (an *action*: cancel, answer, re-run) also needs the
page's anti-forgery token (``X-DFlow-CSRF``, an HMAC of the credential's nonce, which a page
of another origin cannot read) and, when the browser says where the request comes from
(``Origin``, ``Sec-Fetch-Site``), this origin. A server without an admin token (loopback
only) has an open console, whose actions still need the anti-forgery token and this
origin. Every comparison is constant-time.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass

from fastapi import Request

from ..errors import NotAuthenticated, NotPermitted

__all__ = ["COOKIE", "CSRF_HEADER", "ConsoleAuth", "Credential"]

COOKIE = "dflow_console"  #: the cookie holding a console credential
CSRF_HEADER = "X-DFlow-CSRF"  #: the header an action carries its anti-forgery token in
_LABEL = b"dflow console credential v1"
_CREDENTIAL = re.compile(r"c1\.([0-9]{1,12})\.([A-Za-z0-9_-]{22})\.([A-Za-z0-9_-]{43})")
_OPEN = "open"  # the nonce of the one credential of a console without an admin token
_MAX_HEADER = 512  # characters of a cookie or bearer value worth parsing


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


@dataclass(frozen=True, slots=True)
class Credential:
    """Who is using the console: ``nonce`` names the login (``"open"`` on a console
    without an admin token, ``"bearer"`` for the admin token sent by a script);
    ``expires_at`` is when it stops working (epoch seconds); ``browser`` says whether it
    came in a cookie, so that writes need the anti-forgery token."""

    nonce: str
    expires_at: float
    browser: bool


class ConsoleAuth:
    """Mints and checks console credentials for an app whose admin token is
    ``admin_token`` (``None``: an open console, see the module); a credential lasts
    ``ttl`` seconds."""

    def __init__(self, admin_token: str | None, *, ttl: float = 8 * 3600.0) -> None:
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not 60 <= ttl <= 7 * 86400:
            raise ValueError(f"a console login lasts between 60 seconds and a week, got {ttl!r}")
        self.ttl = float(ttl)
        self.open = admin_token is None
        if admin_token is None:
            self._key = secrets.token_bytes(32)
            self._admin_digest = b""
        else:
            self._admin_digest = hashlib.sha256(admin_token.encode("utf-8", "replace")).digest()
            self._key = hmac.digest(admin_token.encode("utf-8", "replace"), _LABEL, "sha256")

    # -- minting and checking ------------------------------------------------------------

    def _mac(self, body: str) -> str:
        return _b64(hmac.digest(self._key, body.encode("ascii"), "sha256"))

    def login(self, token: str, *, now: float | None = None) -> str | None:
        """A new credential (the cookie's value) if ``token`` is the admin token, else ``None``."""
        if self.open or not self.is_admin(token):
            return None
        expires = int((time.time() if now is None else now) + self.ttl)
        body = f"c1.{expires}.{_b64(secrets.token_bytes(16))}"
        return f"{body}.{self._mac(body)}"

    def is_admin(self, token: str) -> bool:
        """Whether ``token`` is the admin token (in constant time; never on an open console)."""
        if self.open or len(token) > _MAX_HEADER:
            return False
        digest = hashlib.sha256(token.encode("utf-8", "replace")).digest()
        return hmac.compare_digest(self._admin_digest, digest)

    def verify(self, value: str, *, now: float | None = None) -> Credential | None:
        """The credential a cookie holds, or ``None`` when it is malformed, forged (or made
        with another admin token) or expired."""
        if self.open or len(value) > _MAX_HEADER:
            return None
        found = _CREDENTIAL.fullmatch(value)
        if found is None:
            return None
        body = value.rpartition(".")[0]
        if not hmac.compare_digest(found.group(3), self._mac(body)):
            return None
        expires = float(found.group(1))
        if expires <= (time.time() if now is None else now):
            return None
        return Credential(found.group(2), expires, browser=True)

    def csrf(self, credential: Credential) -> str:
        """The anti-forgery token of pages shown to ``credential``."""
        return self._mac(f"csrf.{credential.nonce}")

    # -- what requests carry ---------------------------------------------------------------

    def credential(self, request: Request) -> Credential | None:
        """The request's credential: on an open console, always one; otherwise the admin
        token as a bearer token, or a valid cookie; ``None`` when there is neither."""
        if self.open:
            return Credential(_OPEN, float("inf"), browser=True)
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() == "bearer" and token:
            return Credential("bearer", float("inf"), browser=False) if self.is_admin(token.strip()) else None
        cookie = request.cookies.get(COOKIE)
        return self.verify(cookie) if cookie else None

    def require(self, request: Request) -> Credential:
        """The request's credential; 401 saying how to get one."""
        found = self.credential(request)
        if found is None:
            raise NotAuthenticated(
                "the console needs you to log in (GET /console/login) with the server's admin token "
                "(DFLOW_SERVER_TOKEN), or a script to send it as 'Authorization: Bearer <token>'"
            )
        return found

    def require_action(self, request: Request) -> Credential:
        """The credential of a write (cancel, answer, re-run): 401 without one; 403 when a
        browser's request comes from another origin or lacks the page's anti-forgery token."""
        found = self.require(request)
        if found.browser:
            check_same_origin(request)
            sent = request.headers.get(CSRF_HEADER, "")
            if not sent or not hmac.compare_digest(
                sent.encode("ascii", "replace"), self.csrf(found).encode("ascii")
            ):
                raise NotPermitted(
                    f"this action needs the console page's anti-forgery token in the {CSRF_HEADER} "
                    "header (reload the console page and try again)"
                )
        return found


def check_same_origin(request: Request) -> None:
    """403 when the browser marks the request as sent by a page of another origin
    (``Origin`` is not this server's, or ``Sec-Fetch-Site`` is ``cross-site`` or
    ``same-site``)."""
    host = request.headers.get("host", "").strip().lower()
    origin = request.headers.get("origin")
    if origin is not None and origin.strip().lower() not in (f"http://{host}", f"https://{host}"):
        raise NotPermitted(f"a page of another origin ({origin[:100]!r}) may not act in the console")
    if request.headers.get("sec-fetch-site", "").strip().lower() in ("cross-site", "same-site"):
        raise NotPermitted(
            "the browser marks this request as coming from another site: the console refuses it"
        )
