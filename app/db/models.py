"""SQLAlchemy 2.0 models: the whole schema of SPEC §3. No behaviour beyond declaration.

Tenant rows carry ``scope_id`` and point at each other through composite ``(scope_id, …)``
foreign keys, so a row can never reference another scope's data. Every status column has a
CHECK constraint generated from :mod:`app.db.enums`; the invariants the orchestrator relies on
(one active job per image, one active task per dedupe key) are partial unique indexes.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import StrEnum
from typing import Any

from pgvector.sqlalchemy import Vector
from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Double,
    ForeignKeyConstraint,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Sequence,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, TSVECTOR, UUID
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from app.db import enums as E

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# A scope id: 1..128 chars, no slash, backslash or control characters, not "." or "..".
SCOPE_ID_PATTERN = r"^[^/\\\x01-\x1f\x7f]{1,128}$"


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


def status_check(column: str, enum: type[StrEnum], name: str | None = None) -> CheckConstraint:
    values = ", ".join(f"'{m.value}'" for m in enum)
    return CheckConstraint(f"{column} IN ({values})", name=name or f"{column}_valid")


def _now() -> Any:
    return mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())


def _uuid_pk() -> Any:
    return mapped_column(UUID(as_uuid=True), primary_key=True, default=uuid.uuid4)


def _scope_col() -> Any:
    return mapped_column(String(128), nullable=False)


class Scope(Base):
    __tablename__ = "scopes"
    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    storage_namespace: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), nullable=False, unique=True)
    created_at: Mapped[datetime] = _now()
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
    updated_at: Mapped[datetime] = _now()
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
    id: Mapped[uuid.UUID] = _uuid_pk()
    scope_id: Mapped[str] = _scope_col()
    name: Mapped[str] = mapped_column(String(200), nullable=False)
    token_sha256: Mapped[str] = mapped_column(String(64), nullable=False, unique=True)
    created_at: Mapped[datetime] = _now()
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
    created_at: Mapped[datetime] = _now()
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
    created_at: Mapped[datetime] = _now()
    __table_args__ = (CheckConstraint("length(value) >= 32", name="value_long_enough"),)


class Image(Base):
    __tablename__ = "images"
    id: Mapped[uuid.UUID] = _uuid_pk()
    scope_id: Mapped[str] = _scope_col()
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
    created_at: Mapped[datetime] = _now()
    updated_at: Mapped[datetime] = _now()
    __table_args__ = (
        ForeignKeyConstraint(["scope_id"], ["scopes.id"], ondelete="CASCADE"),
        UniqueConstraint("scope_id", "id"),
        UniqueConstraint("scope_id", "sha256"),
        status_check("context_status", E.ContextStatus),
        Index("ix_images_scope_page", "scope_id", "created_at", "id"),
        # btree_gin: one index scan answers "term in this scope" without reading other scopes' postings
        Index("ix_images_search_tsv", "scope_id", "search_tsv", postgresql_using="gin"),
    )


class Batch(Base):
    __tablename__ = "batches"
    id: Mapped[uuid.UUID] = _uuid_pk()
    scope_id: Mapped[str] = _scope_col()
    status: Mapped[str] = mapped_column(String(16), nullable=False, server_default="seeding")
    select_all: Mapped[bool] = mapped_column(Boolean, nullable=False)
    requested_ids: Mapped[list[uuid.UUID] | None] = mapped_column(ARRAY(UUID(as_uuid=True)))
    reverse_image_policy: Mapped[str] = mapped_column(String(8), nullable=False)
    seed_cursor: Mapped[dict | None] = mapped_column(JSONB)
    total: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    # a model backfill (migration 0017): seed only images lacking a current text embedding of one of
    # these models; NULL = a library batch (every image)
    fill_models: Mapped[list[dict] | None] = mapped_column(JSONB)
    created_at: Mapped[datetime] = _now()
    updated_at: Mapped[datetime] = _now()
    completed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    __table_args__ = (
        ForeignKeyConstraint(["scope_id"], ["scopes.id"], ondelete="CASCADE"),
        UniqueConstraint("scope_id", "id"),
        status_check("status", E.BatchStatus),
        status_check("reverse_image_policy", E.ReverseImagePolicy),
        Index("ix_batches_active", "updated_at", postgresql_where=text("status IN ('seeding', 'running')")),
        # batch seeding round-robins over scopes: each scope's least recently touched seeding batch
        Index("ix_batches_seeding", "scope_id", "updated_at", postgresql_where=text("status = 'seeding'")),
    )


class ProcessingJob(Base):
    __tablename__ = "processing_jobs"
    id: Mapped[uuid.UUID] = _uuid_pk()
    scope_id: Mapped[str] = _scope_col()
    image_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), nullable=False)
    revision: Mapped[int] = mapped_column(Integer, nullable=False)
    image_sha256: Mapped[str] = mapped_column(String(64), nullable=False)
    metadata_hash: Mapped[str | None] = mapped_column(String(64))
    config: Mapped[dict] = mapped_column(JSONB, nullable=False)
    config_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    reverse_image_policy: Mapped[str] = mapped_column(String(8), nullable=False)
    mode: Mapped[str] = mapped_column(String(16), nullable=False)
    force_stages: Mapped[list[str]] = mapped_column(ARRAY(Text), nullable=False, server_default="{}")
    status: Mapped[str] = mapped_column(String(24), nullable=False)
    current_stage: Mapped[str | None] = mapped_column(String(24))
    error: Mapped[dict | None] = mapped_column(JSONB)
    retry_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    batch_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    created_at: Mapped[datetime] = _now()
    updated_at: Mapped[datetime] = _now()
    completed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    __table_args__ = (
        ForeignKeyConstraint(["scope_id", "image_id"], ["images.scope_id", "images.id"], ondelete="CASCADE"),
        ForeignKeyConstraint(["scope_id", "batch_id"], ["batches.scope_id", "batches.id"]),
        UniqueConstraint("scope_id", "id"),
        UniqueConstraint("scope_id", "image_id", "revision"),
        status_check("status", E.JobStatus),
        status_check("mode", E.JobMode),
        status_check("reverse_image_policy", E.ReverseImagePolicy),
        CheckConstraint(
            "current_stage IS NULL OR current_stage IN ('visual', 'agent', 'text_embedding')",
            name="current_stage_valid",
        ),
        Index(
            "uq_processing_jobs_one_active_per_image", "image_id", unique=True,
            postgresql_where=text("status IN ('queued', 'running')"),
        ),
        Index("ix_processing_jobs_active", "updated_at", postgresql_where=text("status IN ('queued', 'running')")),
        Index("ix_processing_jobs_scope_page", "scope_id", "created_at", "id"),
        Index("ix_processing_jobs_batch", "batch_id", "status", postgresql_where=text("batch_id IS NOT NULL")),
        Index(
            "ix_processing_jobs_needs_human", "updated_at",
            postgresql_where=text("status IN ('blocked', 'unknown_execution', 'failed')"),
        ),
    )


class JobStage(Base):
    __tablename__ = "job_stages"
    job_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    stage: Mapped[str] = mapped_column(String(24), primary_key=True)
    scope_id: Mapped[str] = _scope_col()
    position: Mapped[int] = mapped_column(SmallInteger, nullable=False)
    status: Mapped[str] = mapped_column(String(24), nullable=False, server_default="pending")
    input_fingerprint: Mapped[str | None] = mapped_column(String(64))
    task_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    attempt_count: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    error: Mapped[dict | None] = mapped_column(JSONB)
    retry_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = _now()
    updated_at: Mapped[datetime] = _now()
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    completed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    __table_args__ = (
        ForeignKeyConstraint(
            ["scope_id", "job_id"], ["processing_jobs.scope_id", "processing_jobs.id"], ondelete="CASCADE"
        ),
        status_check("status", E.StageStatus),
        status_check("stage", E.Stage),
        Index("ix_job_stages_task", "task_id", postgresql_where=text("task_id IS NOT NULL")),
    )


class Task(Base):
    __tablename__ = "tasks"
    id: Mapped[uuid.UUID] = _uuid_pk()
    scope_id: Mapped[str] = _scope_col()
    job_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), nullable=False)
    stage: Mapped[str] = mapped_column(String(24), nullable=False)
    lane: Mapped[str] = mapped_column(String(16), nullable=False)
    resource_key: Mapped[str] = mapped_column(Text, nullable=False, server_default="")
    payload: Mapped[dict] = mapped_column(JSONB, nullable=False)
    input_fingerprint: Mapped[str] = mapped_column(String(64), nullable=False)
    dedupe_key: Mapped[str] = mapped_column(String(64), nullable=False)
    image_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), nullable=False)
    image_sha256: Mapped[str] = mapped_column(String(64), nullable=False)
    status: Mapped[str] = mapped_column(String(16), nullable=False)
    priority: Mapped[int] = mapped_column(SmallInteger, nullable=False, server_default="0")
    available_at: Mapped[datetime] = _now()
    lease_owner: Mapped[str | None] = mapped_column(Text)
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    claim_generation: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    attempt_count: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    max_attempts: Mapped[int] = mapped_column(Integer, nullable=False)
    last_hint_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # the task whose hint also wakes this one (created together by a batched completion)
    hint_group: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    # on a group's named task: how many members its hint wakes too (the cap for joining it)
    hint_members: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    cancel_requested: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default="false")
    grant_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    error: Mapped[dict | None] = mapped_column(JSONB)
    result: Mapped[dict | None] = mapped_column(JSONB)
    created_at: Mapped[datetime] = _now()
    updated_at: Mapped[datetime] = _now()
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    completed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    __table_args__ = (
        ForeignKeyConstraint(
            ["scope_id", "job_id"], ["processing_jobs.scope_id", "processing_jobs.id"], ondelete="CASCADE"
        ),
        ForeignKeyConstraint(["scope_id", "image_id"], ["images.scope_id", "images.id"], ondelete="CASCADE"),
        UniqueConstraint("scope_id", "id"),
        status_check("status", E.TaskStatus),
        status_check("lane", E.Lane),
        status_check("stage", E.Stage),
        CheckConstraint("attempt_count >= 0 AND max_attempts >= 1", name="attempts_valid"),
        Index(
            "uq_tasks_active_dedupe", "scope_id", "dedupe_key", unique=True,
            postgresql_where=text("status IN ('queued', 'running')"),
        ),
        # claimable in lane: fairness order within (lane, resource_key, scope)
        Index(
            "ix_tasks_claimable", "lane", "resource_key", "scope_id", text("priority DESC"), "created_at",
            postgresql_where=text("status = 'queued'"),
        ),
        # batched claims: due queued tasks of a lane in (priority, age) order
        Index(
            "ix_tasks_queued_due", "lane", text("priority DESC"), "available_at",
            postgresql_where=text("status = 'queued'"),
        ),
        # batched lanes' fair claim (waiting scopes, each scope's best due tasks); per-scope backlog
        Index(
            "ix_tasks_lane_scope_due", "lane", "scope_id", text("priority DESC"), "available_at",
            postgresql_where=text("status = 'queued'"),
        ),
        # due for re-hint
        Index(
            "ix_tasks_rehint", text("last_hint_at NULLS FIRST"), postgresql_where=text("status = 'queued'")
        ),
        # the queued members of a wake-up group
        Index(
            "ix_tasks_hint_group", "hint_group",
            postgresql_where=text("status = 'queued' AND hint_group IS NOT NULL"),
        ),
        # the newest open wake-up group of a (scope, lane, resource key, priority), for a new task to join
        Index(
            "ix_tasks_open_group", "scope_id", "lane", "resource_key", "priority", "created_at",
            postgresql_where=text("status = 'queued' AND hint_group IS NULL"),
        ),
        # lease expired
        Index("ix_tasks_lease", "lease_expires_at", postgresql_where=text("status = 'running'")),
        # the sweep's stuck-job repair looks at recently finished tasks only
        Index(
            "ix_tasks_finished", "completed_at",
            postgresql_where=text("status IN ('succeeded', 'failed', 'cancelled')"),
        ),
        Index("ix_tasks_job", "job_id"),
        Index("ix_tasks_image", "scope_id", "image_id"),
    )


class TaskAttempt(Base):
    __tablename__ = "task_attempts"
    attempt_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    scope_id: Mapped[str] = _scope_col()
    task_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), nullable=False)
    attempt_no: Mapped[int] = mapped_column(Integer, nullable=False)
    claim_generation: Mapped[int] = mapped_column(BigInteger, nullable=False)
    state: Mapped[str] = mapped_column(String(24), nullable=False)
    input_digest: Mapped[str] = mapped_column(String(64), nullable=False)
    target_sha256: Mapped[str] = mapped_column(String(64), nullable=False)
    provider_request_id: Mapped[str | None] = mapped_column(Text)
    result: Mapped[dict | None] = mapped_column(JSONB)
    error: Mapped[dict | None] = mapped_column(JSONB)
    created_at: Mapped[datetime] = _now()
    updated_at: Mapped[datetime] = _now()
    __table_args__ = (
        ForeignKeyConstraint(["scope_id", "task_id"], ["tasks.scope_id", "tasks.id"], ondelete="CASCADE"),
        UniqueConstraint("task_id", "attempt_no"),
        status_check("state", E.AttemptState),
        Index("ix_task_attempts_open", "task_id", postgresql_where=text("state = 'external_started'")),
    )


class LaneSlot(Base):
    __tablename__ = "lane_slots"
    lane: Mapped[str] = mapped_column(String(16), primary_key=True)
    resource_key: Mapped[str] = mapped_column(Text, primary_key=True)
    slot_no: Mapped[int] = mapped_column(Integer, primary_key=True)
    task_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    claim_generation: Mapped[int | None] = mapped_column(BigInteger)
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = _now()
    __table_args__ = (
        ForeignKeyConstraint(["task_id"], ["tasks.id"], ondelete="SET NULL"),
        status_check("lane", E.Lane),
        Index("ix_lane_slots_task", "task_id", postgresql_where=text("task_id IS NOT NULL")),
    )


# Global dispatch counter for round-robin fairness (migration 0002); lane_fairness keeps each
# (lane, resource_key, scope)'s latest value.
LANE_DISPATCH_SEQ = Sequence("lane_dispatch_seq", metadata=Base.metadata)


class LaneFairness(Base):
    __tablename__ = "lane_fairness"
    lane: Mapped[str] = mapped_column(String(16), primary_key=True)
    resource_key: Mapped[str] = mapped_column(Text, primary_key=True)
    scope_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    last_dispatch_seq: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    __table_args__ = (
        ForeignKeyConstraint(["scope_id"], ["scopes.id"], ondelete="CASCADE"),
        status_check("lane", E.Lane),
    )


class OperationGrant(Base):
    __tablename__ = "operation_grants"
    id: Mapped[uuid.UUID] = _uuid_pk()
    scope_id: Mapped[str] = _scope_col()
    operation: Mapped[str] = mapped_column(String(64), nullable=False)
    idempotency_key: Mapped[str] = mapped_column(String(128), nullable=False)
    task_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    state: Mapped[str] = mapped_column(String(16), nullable=False)
    retry_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = _now()
    updated_at: Mapped[datetime] = _now()
    __table_args__ = (
        ForeignKeyConstraint(["scope_id"], ["scopes.id"], ondelete="CASCADE"),
        UniqueConstraint("scope_id", "operation", "idempotency_key"),
        status_check("state", E.GrantState),
        Index("ix_operation_grants_usage", "scope_id", "operation", "created_at"),
    )


class VisualEmbedding(Base):
    __tablename__ = "visual_embeddings"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    scope_id: Mapped[str] = _scope_col()
    image_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), nullable=False)
    image_sha256: Mapped[str] = mapped_column(String(64), nullable=False)
    model: Mapped[str] = mapped_column(Text, nullable=False)
    preprocess_version: Mapped[str] = mapped_column(Text, nullable=False)
    dims: Mapped[int] = mapped_column(Integer, nullable=False)
    embedding: Mapped[Any] = mapped_column(Vector(), nullable=False)
    task_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    created_at: Mapped[datetime] = _now()
    __table_args__ = (
        ForeignKeyConstraint(["scope_id", "image_id"], ["images.scope_id", "images.id"], ondelete="CASCADE"),
        UniqueConstraint("scope_id", "image_id", "model", "preprocess_version", "image_sha256"),
        CheckConstraint("dims > 0 AND vector_dims(embedding) = dims", name="dims_match"),
    )


class TextEmbedding(Base):
    __tablename__ = "text_embeddings"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    scope_id: Mapped[str] = _scope_col()
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
    created_at: Mapped[datetime] = _now()
    __table_args__ = (
        ForeignKeyConstraint(["scope_id", "image_id"], ["images.scope_id", "images.id"], ondelete="CASCADE"),
        UniqueConstraint("scope_id", "image_id", "image_sha256", "metadata_hash", "model"),
        status_check("status", E.TextEmbeddingStatus),
        CheckConstraint("dims > 0 AND vector_dims(embedding) = dims", name="dims_match"),
    )


class BatchItem(Base):
    __tablename__ = "batch_items"
    batch_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    image_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    scope_id: Mapped[str] = _scope_col()
    job_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    created_at: Mapped[datetime] = _now()
    __table_args__ = (
        ForeignKeyConstraint(["scope_id", "batch_id"], ["batches.scope_id", "batches.id"], ondelete="CASCADE"),
        ForeignKeyConstraint(["scope_id", "image_id"], ["images.scope_id", "images.id"], ondelete="CASCADE"),
        ForeignKeyConstraint(
            ["scope_id", "job_id"], ["processing_jobs.scope_id", "processing_jobs.id"], ondelete="CASCADE"
        ),
        Index("ix_batch_items_job", "job_id"),
    )


class OpsCounter(Base):
    """Per-minute counters of rare operational events (fencing rejections, re-hints) for /ops."""

    __tablename__ = "ops_counters"
    bucket: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    count: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")


class WorkerRegistration(Base):
    """One live worker process (migration 0012): upserted on its registry heartbeat, pruned by the
    sweep after the TTL. ``node`` is the Celery node name (unique in a cluster)."""

    __tablename__ = "worker_registry"
    node: Mapped[str] = mapped_column(String(255), primary_key=True)
    host: Mapped[str] = mapped_column(String(255), nullable=False)
    pid: Mapped[int] = mapped_column(Integer, nullable=False)
    lanes: Mapped[list[str]] = mapped_column(ARRAY(String(32)), nullable=False)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    last_seen: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)


class SweepState(Base):
    """The last completed reconcile sweep (single row): when, how long, and its lane gauges."""

    __tablename__ = "sweep_state"
    id: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    last_success_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    duration_s: Mapped[float] = mapped_column(Double, nullable=False)
    lane_gauges: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, server_default=text("'{}'::jsonb"))
    failed_steps: Mapped[list[Any]] = mapped_column(JSONB, nullable=False, server_default=text("'[]'::jsonb"))
    __table_args__ = (CheckConstraint("id = 1", name="single_row"),)


#: Event ids, drawn at commit time by the outbox trigger (``memeflow_events_flush``, migration 0014).
EVENTS_ID_SEQ = Sequence("events_id_seq", metadata=Base.metadata)


def _event_type_check(column: str = "type") -> CheckConstraint:
    return status_check(column, E.EventType, name="type_valid")


class Event(Base):
    """The transactional outbox (migration 0014): one row per client-visible change, written by
    triggers in the transaction of the change. ``id`` comes from ``events_id_seq`` at commit time,
    under the scope's advisory lock, so ids grow in commit order within a scope (readers never
    skip an id that commits later). No foreign keys to images/jobs: events outlive what they name."""

    __tablename__ = "events"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    scope_id: Mapped[str] = _scope_col()
    type: Mapped[str] = mapped_column(String(40), nullable=False)
    job_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    image_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    batch_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, server_default=text("'{}'::jsonb"))
    created_at: Mapped[datetime] = _now()
    __table_args__ = (
        ForeignKeyConstraint(["scope_id"], ["scopes.id"], ondelete="CASCADE"),
        _event_type_check(),
        Index("ix_events_scope_id", "scope_id", "id"),
        Index("ix_events_batch", "batch_id", "id", postgresql_where=text("batch_id IS NOT NULL")),
    )


class EventPending(Base):
    """Events staged by the writing transaction; its commit-time trigger moves them to ``events``
    (so this table never holds a committed row)."""

    __tablename__ = "event_pending"
    pk: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    txid: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default=text("txid_current()"))
    scope_id: Mapped[str] = _scope_col()
    type: Mapped[str] = mapped_column(String(40), nullable=False)
    job_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    image_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    batch_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, server_default=text("'{}'::jsonb"))
    created_at: Mapped[datetime] = _now()
    __table_args__ = (Index("ix_event_pending_txid", "txid"),)


class EventStreamSlot(Base):
    """A live event stream (long-poll or SSE) of a scope: at most ``MEMEFLOW_EVENT_STREAMS_PER_SCOPE``
    slots, each held under a lease the stream renews (a crashed API process's slot expires)."""

    __tablename__ = "event_stream_slots"
    scope_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    slot_no: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    holder: Mapped[str] = mapped_column(String(64), nullable=False)
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    __table_args__ = (ForeignKeyConstraint(["scope_id"], ["scopes.id"], ondelete="CASCADE"),)


class WebhookSubscription(Base):
    """A scope's webhook: where to POST which event types, and its delivery cursor. The delivery
    lane claims a subscription like a task (lease + ``claim_generation``) and delivers its events
    after ``cursor`` one at a time, in id order."""

    __tablename__ = "webhook_subscriptions"
    id: Mapped[uuid.UUID] = _uuid_pk()
    scope_id: Mapped[str] = _scope_col()
    url: Mapped[str] = mapped_column(Text, nullable=False)
    event_types: Mapped[list[str]] = mapped_column(ARRAY(String(40)), nullable=False)
    secret: Mapped[str] = mapped_column(String(128), nullable=False)
    cursor: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    attempts: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    next_attempt_at: Mapped[datetime] = _now()
    lease_owner: Mapped[str | None] = mapped_column(String(255))
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    claim_generation: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    last_hint_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    delivered_count: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    failed_count: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    last_error: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    last_delivery_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = _now()
    __table_args__ = (
        ForeignKeyConstraint(["scope_id"], ["scopes.id"], ondelete="CASCADE"),
        UniqueConstraint("scope_id", "id"),
        Index("ix_webhook_subscriptions_scope_id", "scope_id"),
    )


class WebhookFailure(Base):
    """An event a subscription gave up on after ``MEMEFLOW_WEBHOOK_MAX_ATTEMPTS`` (shown on /ops)."""

    __tablename__ = "webhook_failures"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    scope_id: Mapped[str] = _scope_col()
    subscription_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), nullable=False)
    event_id: Mapped[int] = mapped_column(BigInteger, nullable=False)
    attempts: Mapped[int] = mapped_column(Integer, nullable=False)
    error: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    failed_at: Mapped[datetime] = _now()
    __table_args__ = (
        ForeignKeyConstraint(["scope_id", "subscription_id"],
                             ["webhook_subscriptions.scope_id", "webhook_subscriptions.id"], ondelete="CASCADE"),
        Index("ix_webhook_failures_failed_at", "failed_at"),
    )


class SearchServing(Base):
    """Which model a scope's search reads, and the model being filled for it (migration 0017).

    ``serving_*`` answers every query; ``target_*`` (state ``backfill`` only) is being computed by a
    fill batch and takes over in one conditional UPDATE that bumps ``epoch``; ``previous_*`` is the
    model a cutover or rollback replaced (kept for a rollback until pruned). ``*_ref``: the provider
    spec and options that rebuild the model in any process (``{"spec", "options", "config"}``)."""

    __tablename__ = "search_serving"
    scope_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16), primary_key=True)
    state: Mapped[str] = mapped_column(String(16), nullable=False)
    epoch: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    serving_model: Mapped[str] = mapped_column(Text, nullable=False)
    serving_dims: Mapped[int] = mapped_column(Integer, nullable=False)
    serving_ref: Mapped[dict] = mapped_column(JSONB, nullable=False)
    target_model: Mapped[str | None] = mapped_column(Text)
    target_dims: Mapped[int | None] = mapped_column(Integer)
    target_ref: Mapped[dict | None] = mapped_column(JSONB)
    previous_model: Mapped[str | None] = mapped_column(Text)
    previous_dims: Mapped[int | None] = mapped_column(Integer)
    previous_ref: Mapped[dict | None] = mapped_column(JSONB)
    batch_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    fill_rounds: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    ready: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    total: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    coverage_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    checked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    switched_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = _now()
    __table_args__ = (
        ForeignKeyConstraint(["scope_id"], ["scopes.id"], ondelete="CASCADE"),
        status_check("kind", E.ServingKind),
        status_check("state", E.ServingState),
        CheckConstraint("(target_model IS NULL) = (state <> 'backfill')", name="target_iff_backfill"),
        Index("ix_search_serving_state", "state", "kind"),
    )


class SearchServingEvent(Base):
    """Every change of a scope's serving state, with the epoch it produced (an audit trail)."""

    __tablename__ = "search_serving_events"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    scope_id: Mapped[str] = _scope_col()
    kind: Mapped[str] = mapped_column(String(16), nullable=False)
    action: Mapped[str] = mapped_column(String(16), nullable=False)
    epoch: Mapped[int] = mapped_column(BigInteger, nullable=False)
    from_model: Mapped[str | None] = mapped_column(Text)
    to_model: Mapped[str | None] = mapped_column(Text)
    detail: Mapped[dict | None] = mapped_column(JSONB)
    at: Mapped[datetime] = _now()
    __table_args__ = (
        ForeignKeyConstraint(["scope_id"], ["scopes.id"], ondelete="CASCADE"),
        status_check("action", E.ServingAction),
        Index("ix_search_serving_events_scope", "scope_id", "kind", "id"),
    )


class RetentionWalk(Base):
    """Where the sweep's retention walk of one kind of history resumes (migration 0016)."""

    __tablename__ = "retention_walks"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    after_key: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[datetime] = _now()
