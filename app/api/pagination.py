"""Opaque keyset cursors: base64url(JSON {created_at, id}) + HMAC, so clients cannot forge them.

The HMAC covers the cursor's kind and the scope it was issued to: a cursor of another scope is
refused exactly like a forged one (SPEC §2.6 — another scope's id behaves like a missing one)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import threading
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

from app.api.errors import ApiError


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class CursorCodec:
    """Encodes a keyset ``(created_at, id)`` into an opaque, tamper-evident cursor.

    ``secret`` is the HMAC key, or a function that returns it, called once, on the first cursor
    (the key kept in the database: an API started while its database is down still starts)."""

    def __init__(self, secret: bytes | Callable[[], bytes]) -> None:
        self._secret = secret if isinstance(secret, bytes) else None
        self._load = None if isinstance(secret, bytes) else secret
        self._lock = threading.Lock()

    def _key(self) -> bytes:
        if self._secret is None:
            with self._lock:
                if self._secret is None:
                    self._secret = self._load()
        return self._secret

    def _sig(self, payload: bytes, kind: str, scope: str) -> bytes:
        domain = kind.encode() + b"\0" + scope.encode("utf-8", "surrogatepass") + b"\0"
        return hmac.new(self._key(), domain + payload, hashlib.sha256).digest()[:16]

    def encode(self, key: Any, kind: str, scope: str) -> str | None:
        """The cursor of keyset ``key`` for ``kind`` lists of ``scope`` (None for no key)."""
        if key is None:
            return None
        created_at, ident = key
        payload = json.dumps(
            {"created_at": created_at.isoformat(), "id": str(ident)}, separators=(",", ":")
        ).encode()
        return f"{_b64(payload)}.{_b64(self._sig(payload, kind, scope))}"

    def decode(self, cursor: str | None, kind: str, scope: str) -> tuple[datetime, uuid.UUID] | None:
        """The keyset of ``cursor``; 422 invalid_cursor if malformed, tampered with, or issued for
        another kind or another scope."""
        if cursor is None:
            return None
        try:
            body, _, sig = cursor.partition(".")
            payload = _unb64(body)
            if not hmac.compare_digest(_unb64(sig), self._sig(payload, kind, scope)):
                raise ValueError("bad signature")
            data = json.loads(payload)
            created_at = datetime.fromisoformat(data["created_at"])
            if created_at.tzinfo is None:
                raise ValueError("naive timestamp")
            return created_at, uuid.UUID(data["id"])
        except (ValueError, KeyError, TypeError, binascii.Error, UnicodeDecodeError, json.JSONDecodeError):
            raise ApiError(422, "invalid_cursor", "cursor is malformed or was not issued by this server") from None


def cursor_secret(settings: Any, engine: Any, explicit: str | bytes | None = None) -> bytes | Callable[[], bytes]:
    """The HMAC key: ``explicit``, else ``MEMEFLOW_CURSOR_SECRET``, else the contents of
    ``MEMEFLOW_CURSOR_SECRET_FILE`` (a secret mount; surrounding whitespace stripped), else the
    random key generated once and stored in ``app_secrets`` (never derived from the database URL
    or other settings) — that one as a function :class:`CursorCodec` calls on the first cursor,
    so building the app needs no database."""
    raw = explicit if explicit is not None else getattr(settings, "cursor_secret", None)
    path = getattr(settings, "cursor_secret_file", None)
    if not raw and path:
        from pathlib import Path

        raw = Path(path).read_text(encoding="utf-8").strip()
        if len(raw) < 16:
            from app.config import SettingsError

            raise SettingsError("MEMEFLOW_CURSOR_SECRET_FILE must hold at least 16 characters")
    if raw:
        return raw.encode() if isinstance(raw, str) else raw
    from app.app_secrets import CURSOR_HMAC, get_or_create_secret

    return lambda: get_or_create_secret(engine, CURSOR_HMAC)
