"""Trusted scope resolution for the API, plus scope and API-token administration.

The scope (tenant) of a request comes only from here: :class:`LocalScopeResolver` for the local
single-user mode (``MEMEFLOW_AUTH=none``), :class:`TokenScopeResolver` for
``Authorization: Bearer <token>`` (``MEMEFLOW_AUTH=token``). Tokens are stored as sha256 digests
only; the token itself is shown once, at creation.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import Engine, text

from app.scopes import LOCAL_SCOPE, validate_scope_id

TOKEN_PREFIX = "mf_"


class Unauthorized(Exception):
    """Missing, malformed, unknown or revoked API token."""

    code = "unauthorized"
    status = 401


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
            row = conn.execute(
                text("SELECT scope_id, token_sha256, revoked_at FROM api_tokens WHERE token_sha256 = :d"),
                {"d": digest},
            ).first()
        # The lookup is by digest; the compare below is constant-time on the digest itself.
        if row is None or not hmac.compare_digest(row.token_sha256, digest):
            raise Unauthorized("unknown token")
        if row.revoked_at is not None:
            raise Unauthorized("token revoked")
        return row.scope_id


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


def create_token(engine: Engine, scope_id: str, name: str) -> tuple[TokenInfo, str]:
    """Create a token for an existing scope; returns its info and the token (shown only once)."""
    validate_scope_id(scope_id)
    if not name or len(name) > 200:
        raise ValueError("token name must be 1..200 characters")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with engine.begin() as conn:
        if conn.execute(text("SELECT 1 FROM scopes WHERE id = :id"), {"id": scope_id}).first() is None:
            raise LookupError(f"scope {scope_id!r} does not exist")
        if conn.execute(
            text("SELECT 1 FROM api_tokens WHERE scope_id = :s AND name = :n"), {"s": scope_id, "n": name}
        ).first():
            raise ValueError(f"scope {scope_id!r} already has a token named {name!r}")
        row = conn.execute(
            text(
                "INSERT INTO api_tokens (id, scope_id, name, token_sha256) VALUES (:id, :s, :n, :h) "
                "RETURNING id, scope_id, name, created_at, revoked_at"
            ),
            {"id": uuid.uuid4(), "s": scope_id, "n": name, "h": hash_token(token)},
        ).one()
    return TokenInfo(**row._mapping), token


def list_tokens(engine: Engine, scope_id: str | None = None) -> list[TokenInfo]:
    sql = "SELECT id, scope_id, name, created_at, revoked_at FROM api_tokens"
    params: dict[str, Any] = {}
    if scope_id is not None:
        sql += " WHERE scope_id = :s"
        params["s"] = scope_id
    with engine.connect() as conn:
        return [TokenInfo(**r._mapping) for r in conn.execute(text(sql + " ORDER BY scope_id, name"), params)]


def revoke_token(engine: Engine, id_or_name: str, scope_id: str | None = None) -> list[TokenInfo]:
    """Revoke the token with this id, or the token(s) with this name (optionally in one scope)."""
    try:
        token_id: uuid.UUID | None = uuid.UUID(id_or_name)
    except ValueError:
        token_id = None
    cond = "id = :id" if token_id is not None else "name = :name"
    params: dict[str, Any] = {"id": token_id, "name": id_or_name}
    if scope_id is not None:
        cond += " AND scope_id = :s"
        params["s"] = scope_id
    with engine.begin() as conn:
        rows = conn.execute(
            text(
                f"UPDATE api_tokens SET revoked_at = coalesce(revoked_at, now()) WHERE {cond} "
                "RETURNING id, scope_id, name, created_at, revoked_at"
            ),
            params,
        ).all()
    return [TokenInfo(**r._mapping) for r in rows]
