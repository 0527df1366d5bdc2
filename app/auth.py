"""Trusted scope resolution for the API, plus scope and API-token administration.

The scope (tenant) of a request comes only from here: :class:`LocalScopeResolver` for the local
single-user mode (``MEMEFLOW_AUTH=none``), :class:`TokenScopeResolver` for
``Authorization: Bearer <token>`` (``MEMEFLOW_AUTH=token``). Tokens are stored as sha256 digests
only; the token itself is shown once, at creation.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import Engine, text

from app.ids import parse_uuid
from app.scopes import LOCAL_SCOPE, validate_scope_id

TOKEN_PREFIX = "mf_"


class Unauthorized(Exception):
    """Missing, malformed, unknown, revoked or expired API token."""

    code = "unauthorized"
    status = 401


# One message for every token that does not authenticate, so that a caller cannot tell a token
# that never existed from one that was revoked or has expired.
INVALID_TOKEN = "invalid, revoked or expired token"


class AmbiguousTokenName(ValueError):
    """A token name exists in several scopes; the caller must say which scope."""

    def __init__(self, name: str, scope_ids: list[str]) -> None:
        super().__init__(f"token name {name!r} exists in scopes {', '.join(scope_ids)}; choose one with --scope")
        self.name = name
        self.scope_ids = scope_ids


class ScopeResolver(Protocol):
    """Maps a request's trusted credentials to a scope id, or raises :class:`Unauthorized`."""

    def resolve(self, headers: Any) -> str: ...


class LocalScopeResolver:
    """Every request belongs to scope ``local`` (single-user mode, ``MEMEFLOW_AUTH=none``)."""

    def __init__(self, scope_id: str = LOCAL_SCOPE) -> None:
        self.scope_id = validate_scope_id(scope_id)

    def resolve(self, headers: Any) -> str:
        return self.scope_id


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


# Expiry is judged by the database clock, the same clock that stamped created_at/expires_at.
RESOLVE_TOKEN = text(
    "SELECT scope_id, token_sha256, "
    "(revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())) AS usable "
    "FROM api_tokens WHERE token_sha256 = :d"
)


class TokenScopeResolver:
    """``Authorization: Bearer <token>`` → the scope of a non-revoked token (by sha256)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def resolve(self, headers: Any) -> str:
        header = headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token or len(token) > 256:
            raise Unauthorized("missing or malformed bearer token")
        digest = hash_token(token)
        with self.engine.connect() as conn:
            row = conn.execute(RESOLVE_TOKEN, {"d": digest}).first()
        # The lookup is by digest; the compare below is constant-time on the digest itself.
        if row is None or not hmac.compare_digest(row.token_sha256, digest) or not row.usable:
            raise Unauthorized(INVALID_TOKEN)
        return row.scope_id


def token_usable(engine: Engine, digest: str) -> bool:
    """Whether the token with this sha256 is still usable (known, not revoked, not expired): what
    a long stream opened with it asks again while it runs (one index probe)."""
    with engine.connect() as conn:
        row = conn.execute(RESOLVE_TOKEN, {"d": digest}).first()
    return row is not None and bool(row.usable)


def resolver_for(settings: Any, engine: Engine) -> ScopeResolver:
    """The resolver selected by ``MEMEFLOW_AUTH``."""
    if settings.auth == "token":
        return TokenScopeResolver(engine)
    if settings.auth == "none":
        return LocalScopeResolver()
    raise ValueError(f"unknown auth mode {settings.auth!r}")


# --- administration (CLI) ------------------------------------------------------------------


@dataclass(frozen=True)
class TokenInfo:
    id: uuid.UUID
    scope_id: str
    name: str
    created_at: datetime
    revoked_at: datetime | None
    expires_at: datetime | None = None


TOKEN_COLUMNS = "id, scope_id, name, created_at, revoked_at, expires_at"


def create_scope(engine: Engine, scope_id: str) -> tuple[str, uuid.UUID, bool]:
    """Create scope ``scope_id`` if missing; returns (id, storage_namespace, created)."""
    validate_scope_id(scope_id)
    with engine.begin() as conn:
        row = conn.execute(
            text(
                "INSERT INTO scopes (id, storage_namespace) VALUES (:id, :ns) "
                "ON CONFLICT (id) DO NOTHING RETURNING storage_namespace"
            ),
            {"id": scope_id, "ns": uuid.uuid4()},
        ).first()
        if row is not None:
            return scope_id, row.storage_namespace, True
        ns = conn.execute(text("SELECT storage_namespace FROM scopes WHERE id = :id"), {"id": scope_id}).scalar_one()
        return scope_id, ns, False


def list_scopes(engine: Engine) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT s.id, s.storage_namespace, s.created_at, "
                "(SELECT count(*) FROM images i WHERE i.scope_id = s.id) AS images "
                "FROM scopes s ORDER BY s.id"
            )
        ).mappings()
        return [dict(r) for r in rows]


def parse_duration(text_: str) -> timedelta:
    """``30d``, ``12h``, ``90m``, ``2w``, ``3600s`` → a positive :class:`timedelta` of at most
    :data:`MAX_DURATION` (ValueError otherwise: ``999999999w`` overflows ``timedelta`` and
    ``999999999d`` PostgreSQL's timestamps, and a token for longer is one that never expires)."""
    match = re.fullmatch(r"\s*(\d{1,9})\s*([smhdw])\s*", text_ or "")
    if not match or int(match.group(1)) == 0:
        raise ValueError(f"not a positive duration like 30d, 12h, 90m, 2w: {text_!r}")
    seconds = int(match.group(1)) * _UNIT_S[match.group(2)]
    if seconds > MAX_DURATION.total_seconds():
        raise ValueError(f"{text_.strip()!r} is longer than {MAX_DURATION.days} days (100 years); "
                         "leave the expiry out for a token that never expires")
    return timedelta(seconds=seconds)


_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
MAX_DURATION = timedelta(days=36525)


def create_token(
    engine: Engine, scope_id: str, name: str, expires_in: timedelta | None = None
) -> tuple[TokenInfo, str]:
    """Create a token for an existing scope; returns its info and the token (shown only once).

    With ``expires_in`` the token stops authenticating that long after creation (DB clock)."""
    validate_scope_id(scope_id)
    if not name or len(name) > 200:
        raise ValueError("token name must be 1..200 characters")
    if expires_in is not None and expires_in.total_seconds() <= 0:
        raise ValueError("expires_in must be positive")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with engine.begin() as conn:
        _require_scope(conn, scope_id)
        # ON CONFLICT: a concurrent create of the same name (committed after any check we could
        # read) is the same "already has" answer, not a unique-violation traceback
        row = conn.execute(
            text(
                "INSERT INTO api_tokens (id, scope_id, name, token_sha256, expires_at) "
                "VALUES (:id, :s, :n, :h, now() + make_interval(secs => :ttl)) "
                f"ON CONFLICT (scope_id, name) DO NOTHING RETURNING {TOKEN_COLUMNS}"
            ),
            {"id": uuid.uuid4(), "s": scope_id, "n": name, "h": hash_token(token),
             "ttl": None if expires_in is None else expires_in.total_seconds()},
        ).first()
        if row is None:
            raise ValueError(f"scope {scope_id!r} already has a token named {name!r}")
    return TokenInfo(**row._mapping), token


def _require_scope(conn: Any, scope_id: str | None) -> None:
    """LookupError for a ``scope_id`` that names no scope (a typo must not read as "no tokens")."""
    if scope_id is not None and conn.execute(
            text("SELECT 1 FROM scopes WHERE id = :id"), {"id": scope_id}).first() is None:
        raise LookupError(f"scope {scope_id!r} does not exist")


def list_tokens(engine: Engine, scope_id: str | None = None) -> list[TokenInfo]:
    """Every token, or ``scope_id``'s (LookupError when that scope does not exist)."""
    sql = f"SELECT {TOKEN_COLUMNS} FROM api_tokens"
    params: dict[str, Any] = {}
    if scope_id is not None:
        sql += " WHERE scope_id = :s"
        params["s"] = scope_id
    with engine.connect() as conn:
        _require_scope(conn, scope_id)
        return [TokenInfo(**r._mapping) for r in conn.execute(text(sql + " ORDER BY scope_id, name"), params)]


def revoke_token(engine: Engine, id_or_name: str, scope_id: str | None = None) -> list[TokenInfo]:
    """Revoke the token with this id, or the token with this name (in ``scope_id`` when given).

    A name that exists in several scopes raises :class:`AmbiguousTokenName` unless ``scope_id``
    says which, and then nothing is revoked. Returns the revoked tokens (empty: no match);
    LookupError when ``scope_id`` names no scope."""
    token_id = parse_uuid(id_or_name)
    cond = "id = :id" if token_id is not None else "name = :name"
    params: dict[str, Any] = {"id": token_id, "name": id_or_name}
    if scope_id is not None:
        cond += " AND scope_id = :s"
        params["s"] = scope_id
    with engine.begin() as conn:
        _require_scope(conn, scope_id)
        # Lock the matching rows first so that the ambiguity check and the update see the same set.
        scopes = sorted({r.scope_id for r in conn.execute(
            text(f"SELECT scope_id FROM api_tokens WHERE {cond} FOR UPDATE"), params)})
        if len(scopes) > 1:
            raise AmbiguousTokenName(id_or_name, scopes)
        rows = conn.execute(
            text(
                f"UPDATE api_tokens SET revoked_at = coalesce(revoked_at, now()) WHERE {cond} "
                f"RETURNING {TOKEN_COLUMNS}"
            ),
            params,
        ).all()
    return [TokenInfo(**r._mapping) for r in rows]
