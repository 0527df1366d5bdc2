"""Images: one row per stored image version of a scope (SPEC §3.1)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    ForeignKeyConstraint,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, TSVECTOR
from sqlalchemy.orm import Mapped, mapped_column

from app.db import enums as E
from app.db.models.base import Base, scope_column, status_check, timestamp_now, uuid_pk


class Image(Base):
    __tablename__ = "images"
    id: Mapped[uuid.UUID] = uuid_pk()
    scope_id: Mapped[str] = scope_column()
    sha256: Mapped[str] = mapped_column(String(64), nullable=False)
    extension: Mapped[str] = mapped_column(String(8), nullable=False)
    media_type: Mapped[str] = mapped_column(String(40), nullable=False)
    size_bytes: Mapped[int] = mapped_column(BigInteger, nullable=False)
    width: Mapped[int] = mapped_column(Integer, nullable=False)
    height: Mapped[int] = mapped_column(Integer, nullable=False)
    storage_key: Mapped[str] = mapped_column(Text, nullable=False)
    display_name: Mapped[str | None] = mapped_column(Text)
    context: Mapped[dict | None] = mapped_column(JSONB)
    context_status: Mapped[str] = mapped_column(String(16), nullable=False, server_default="pending")
    context_provenance: Mapped[dict | None] = mapped_column(JSONB)
    metadata_hash: Mapped[str | None] = mapped_column(String(64))
    revision: Mapped[int] = mapped_column(Integer, nullable=False, server_default="1")
    # Lexical terms of the image's *current* text (app/search/lexical.py), written by the same
    # statement that writes display_name/context; emptied of context terms when the bytes change.
    search_tsv: Mapped[Any] = mapped_column(TSVECTOR, nullable=False, server_default=text("''::tsvector"))
    created_at: Mapped[datetime] = timestamp_now()
    updated_at: Mapped[datetime] = timestamp_now()
    __table_args__ = (
        ForeignKeyConstraint(["scope_id"], ["scopes.id"], ondelete="CASCADE"),
        UniqueConstraint("scope_id", "id"),
        UniqueConstraint("scope_id", "sha256"),
        status_check("context_status", E.ContextStatus),
        Index("ix_images_scope_page", "scope_id", "created_at", "id"),
        # btree_gin: one index scan answers "term in this scope" without reading other scopes' postings
        Index("ix_images_search_tsv", "scope_id", "search_tsv", postgresql_using="gin"),
    )
