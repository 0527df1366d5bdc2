"""Stage artifacts stored as rows: visual and text embeddings (SPEC §3.1)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from pgvector.sqlalchemy import Vector
from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    ForeignKeyConstraint,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import UUID
from sqlalchemy.orm import Mapped, mapped_column

from app.db import enums as E
from app.db.models.base import Base, scope_column, status_check, timestamp_now


class VisualEmbedding(Base):
    __tablename__ = "visual_embeddings"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    scope_id: Mapped[str] = scope_column()
    image_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), nullable=False)
    image_sha256: Mapped[str] = mapped_column(String(64), nullable=False)
    model: Mapped[str] = mapped_column(Text, nullable=False)
    preprocess_version: Mapped[str] = mapped_column(Text, nullable=False)
    dims: Mapped[int] = mapped_column(Integer, nullable=False)
    embedding: Mapped[Any] = mapped_column(Vector(), nullable=False)
    task_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    created_at: Mapped[datetime] = timestamp_now()
    __table_args__ = (
        ForeignKeyConstraint(["scope_id", "image_id"], ["images.scope_id", "images.id"], ondelete="CASCADE"),
        UniqueConstraint("scope_id", "image_id", "model", "preprocess_version", "image_sha256"),
        CheckConstraint("dims > 0 AND vector_dims(embedding) = dims", name="dims_match"),
    )

class TextEmbedding(Base):
    __tablename__ = "text_embeddings"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    scope_id: Mapped[str] = scope_column()
    image_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), nullable=False)
    image_sha256: Mapped[str] = mapped_column(String(64), nullable=False)
    metadata_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    model: Mapped[str] = mapped_column(Text, nullable=False)
    dims: Mapped[int] = mapped_column(Integer, nullable=False)
    document_version: Mapped[str] = mapped_column(String(32), nullable=False)
    document: Mapped[str] = mapped_column(Text, nullable=False)
    embedding: Mapped[Any] = mapped_column(Vector(), nullable=False)
    status: Mapped[str] = mapped_column(String(16), nullable=False, server_default="ready")
    task_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    created_at: Mapped[datetime] = timestamp_now()
    __table_args__ = (
        ForeignKeyConstraint(["scope_id", "image_id"], ["images.scope_id", "images.id"], ondelete="CASCADE"),
        UniqueConstraint("scope_id", "image_id", "image_sha256", "metadata_hash", "model"),
        status_check("status", E.TextEmbeddingStatus),
        CheckConstraint("dims > 0 AND vector_dims(embedding) = dims", name="dims_match"),
    )
