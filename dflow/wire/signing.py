"""The keys that sign what workers exchange through the store, and their rotation.

``DFLOW_SECRET`` holds one key or several, comma-separated, newest first; each is at least
32 bytes. Everything is signed with the first and verified with any, so a rotation is: add
the new key in front on every process, restart them, and drop the old key once no stored
flow needs it (runs that started before the rotation finished or expired).

A signed record is ``b"\\xd1\\x01" + key id (8 bytes) + HMAC-SHA256 (32) + payload``. The MAC
covers a domain (what the record is: a flow blob, a run's frames) and a context (for frames,
the run's trace id), so that no signed record can be replayed as another kind of record or
for another run. A worker that lacks the key a record names raises ``UnknownKeyError``, an
``UnknownStepError``: the step is parked until a worker that has the key takes it.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

from ..errors import ConfigurationError, PayloadRejectedError, UnknownStepError

__all__ = ["MIN_KEY_BYTES", "Keys", "UnknownKeyError"]

MIN_KEY_BYTES = 32
_MAGIC = b"\xd1\x02"
_HEAD = len(_MAGIC) + 8 + 32

Secret = str | bytes


class UnknownKeyError(UnknownStepError):
    """A record is signed with a key this process does not have (a rotation in progress,
    or a worker with an old ``DFLOW_SECRET``)."""


def _mac(key: bytes, data: bytes) -> bytes:
    return hashlib.blake2b(data, key=key, digest_size=32).digest()


def _mac_key(key: bytes) -> bytes:
    return key if len(key) <= 64 else hashlib.blake2b(key).digest()


def _key_id(key: bytes) -> bytes:
    return hashlib.sha256(b"dflow key id\0" + key).digest()[:8]


class Keys:
    """One or more signing keys: sign with the first, verify with any."""

    def __init__(self, secret: Secret | Sequence[Secret] | None) -> None:
        if isinstance(secret, str):
            items: list[Secret] = [s.strip() for s in secret.split(",") if s.strip()]
        elif isinstance(secret, (bytes, bytearray)):
            items = [bytes(secret)]
        else:
            items = list(secret or ())
        if not items:
            raise ConfigurationError(
                "distributed mode needs a shared secret to sign the flows workers exchange: set the "
                "DFLOW_SECRET environment variable (the same on every worker and client) or pass secret="
            )
        keys = [k.encode() if isinstance(k, str) else bytes(k) for k in items]
        for n, k in enumerate(keys, 1):
            if len(k) < MIN_KEY_BYTES:
                which = "DFLOW_SECRET" if len(keys) == 1 else f"key {n} of DFLOW_SECRET"
                raise ConfigurationError(
                    f"{which} is {len(k)} bytes; a signing key needs at least {MIN_KEY_BYTES}. Make one with: "
                    "python -c 'import secrets; print(secrets.token_urlsafe(32))'"
                )
        # BLAKE2b takes keys of up to 64 bytes: a longer one is hashed to 64 first.
        self._by_id = {_key_id(k): _mac_key(k) for k in keys}
        self._legacy = keys  # dflow 0.1's HMAC used the keys as they are
        self._current = _mac_key(keys[0])
        self._current_id = _key_id(keys[0])

    def sign(self, domain: bytes, payload: bytes, context: bytes = b"") -> bytes:
        """``payload`` signed with the current key for ``domain`` and ``context``."""
        mac = _mac(self._current, domain + b"\0" + context + b"\0" + payload)
        return _MAGIC + self._current_id + mac + payload

    def open(
        self, record: bytes, domain: bytes, what: str, context: bytes = b"", *, legacy: bool = False
    ) -> bytes:
        """The payload of a record made by ``sign`` with the same domain and context;
        ``PayloadRejectedError`` when it does not verify, ``UnknownKeyError`` when it
        names a key this process lacks. With ``legacy``, a record of dflow 0.1 (an HMAC
        of the payload alone, then the payload) verifies against any key too."""
        if record[:2] == _MAGIC and len(record) >= _HEAD:
            kid, mac, payload = record[2:10], record[10:42], record[42:]
            key = self._by_id.get(kid)
            if key is None:
                raise UnknownKeyError(
                    f"{what} is signed with a key this process does not have (key id {kid.hex()}): give every "
                    "worker every key in use, newest first (DFLOW_SECRET=new,old)"
                )
            good = _mac(key, domain + b"\0" + context + b"\0" + payload)
            if hmac.compare_digest(mac, good):
                return payload
        elif legacy and len(record) >= 32:
            mac, payload = record[:32], record[32:]
            for key in self._legacy:
                if hmac.compare_digest(mac, hmac.digest(key, payload, "sha256")):
                    return payload
        raise PayloadRejectedError(
            f"{what} fails its signature check: it was tampered with, or written with another DFLOW_SECRET; "
            "it is not executed"
        )
