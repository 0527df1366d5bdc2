"""Scopes and what hangs off them directly: limits, usage, rate windows, API tokens, browser sessions, app secrets."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    ForeignKeyConstraint,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import UUID
from sqlalchemy.orm import Mapped, mapped_column

from app.db.models.base import SCOPE_ID_PATTERN, Base, scope_column, timestamp_now, uuid_pk


class Scope(Base):
    __tablename__ = "scopes"
    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    storage_namespace: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), nullable=False, unique=True)
    created_at: Mapped[datetime] = timestamp_now()
    __table_args__ = (
        CheckConstraint(f"id ~ '{SCOPE_ID_PATTERN}' AND id NOT IN ('.', '..')", name="id_valid"),
    )


class ScopeLimit(Base):
    """Per-scope overrides of the global limits (migration 0013): NULL = the global setting, 0 = unlimited."""

    __tablename__ = "scope_limits"
    scope_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    max_bytes: Mapped[int | None] = mapped_column(BigInteger)
    max_images: Mapped[int | None] = mapped_column(Integer)
    uploads_per_minute: Mapped[int | None] = mapped_column(Integer)
    processing_per_minute: Mapped[int | None] = mapped_column(Integer)
    updated_at: Mapped[datetime] = timestamp_now()
    __table_args__ = (
        ForeignKeyConstraint(["scope_id"], ["scopes.id"], ondelete="CASCADE"),
        CheckConstraint(
            "coalesce(max_bytes, 0) >= 0 AND coalesce(max_images, 0) >= 0"
            " AND coalesce(uploads_per_minute, 0) >= 0 AND coalesce(processing_per_minute, 0) >= 0",
            name="limits_valid",
        ),
    )


class ScopeUsage(Base):
    """A scope's image count and stored bytes, maintained by the ``images_scope_usage`` trigger
    (migration 0013) on every insert, delete and size change of ``images``."""

    __tablename__ = "scope_usage"
    scope_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    image_count: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    stored_bytes: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    __table_args__ = (ForeignKeyConstraint(["scope_id"], ["scopes.id"], ondelete="CASCADE"),)


class RateWindow(Base):
    """A fixed one-minute rate window: requests of ``kind`` counted for ``key`` (token or scope)."""

    __tablename__ = "rate_windows"
    kind: Mapped[str] = mapped_column(String(16), primary_key=True)
    key: Mapped[str] = mapped_column(Text, primary_key=True)
    window_start: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    count: Mapped[int] = mapped_column(Integer, nullable=False)


class ApiToken(Base):
    __tablename__ = "api_tokens"
    id: Mapped[uuid.UUID] = uuid_pk()
    scope_id: Mapped[str] = scope_column()
    name: Mapped[str] = mapped_column(String(200), nullable=False)
    token_sha256: Mapped[str] = mapped_column(String(64), nullable=False, unique=True)
    created_at: Mapped[datetime] = timestamp_now()
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))  # NULL: never
    __table_args__ = (
        ForeignKeyConstraint(["scope_id"], ["scopes.id"], ondelete="CASCADE"),
        UniqueConstraint("scope_id", "name"),
    )


class BrowserSession(Base):
    """A browser signed in with an API token (token mode): the cookie's sha256, never the cookie."""

    __tablename__ = "browser_sessions"
    id_sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    token_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), nullable=False)
    csrf_token: Mapped[str] = mapped_column(String(64), nullable=False)
    created_at: Mapped[datetime] = timestamp_now()
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    __table_args__ = (
        ForeignKeyConstraint(["token_id"], ["api_tokens.id"], ondelete="CASCADE"),
        Index("ix_browser_sessions_token_id", "token_id"),
        Index("ix_browser_sessions_expires_at", "expires_at"),
    )
class AppSecret(Base):
    """A deployment-wide random secret, generated once (insert-if-absent) and never derived."""

    __tablename__ = "app_secrets"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    created_at: Mapped[datetime] = timestamp_now()
    __table_args__ = (CheckConstraint("length(value) >= 32", name="value_long_enough"),)
