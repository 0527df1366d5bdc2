"""Processing jobs and their stages, and the batches that seed them (SPEC §3.1, §4.8)."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import (
    Boolean,
    CheckConstraint,
    DateTime,
    ForeignKeyConstraint,
    Index,
    Integer,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID
from sqlalchemy.orm import Mapped, mapped_column

from app.db import enums as E
from app.db.models.base import Base, scope_column, status_check, timestamp_now, uuid_pk


class Batch(Base):
    __tablename__ = "batches"
    id: Mapped[uuid.UUID] = uuid_pk()
    scope_id: Mapped[str] = scope_column()
    status: Mapped[str] = mapped_column(String(16), nullable=False, server_default="seeding")
    select_all: Mapped[bool] = mapped_column(Boolean, nullable=False)
    requested_ids: Mapped[list[uuid.UUID] | None] = mapped_column(ARRAY(UUID(as_uuid=True)))
    reverse_image_policy: Mapped[str] = mapped_column(String(8), nullable=False)
    seed_cursor: Mapped[dict | None] = mapped_column(JSONB)
    total: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    # a model backfill (migration 0017): seed only images lacking a current text embedding of one of
    # these models; NULL = a library batch (every image)
    fill_models: Mapped[list[dict] | None] = mapped_column(JSONB)
    created_at: Mapped[datetime] = timestamp_now()
    updated_at: Mapped[datetime] = timestamp_now()
    completed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # cancelled, and an item's job may still change: the sweep tells its counts until final (0028)
    progress_open: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=text("false"))
    __table_args__ = (
        ForeignKeyConstraint(["scope_id"], ["scopes.id"], ondelete="CASCADE"),
        UniqueConstraint("scope_id", "id"),
        status_check("status", E.BatchStatus),
        CheckConstraint("NOT progress_open OR status = 'cancelled'", name="progress_open_cancelled"),
        Index("ix_batches_progress_open", "updated_at", postgresql_where=text("progress_open")),
        status_check("reverse_image_policy", E.ReverseImagePolicy),
        Index("ix_batches_active", "updated_at", postgresql_where=text("status IN ('seeding', 'running')")),
        # batch seeding round-robins over scopes: each scope's least recently touched seeding batch
        Index("ix_batches_seeding", "scope_id", "updated_at", postgresql_where=text("status = 'seeding'")),
    )

class ProcessingJob(Base):
    __tablename__ = "processing_jobs"
    id: Mapped[uuid.UUID] = uuid_pk()
    scope_id: Mapped[str] = scope_column()
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
    created_at: Mapped[datetime] = timestamp_now()
    updated_at: Mapped[datetime] = timestamp_now()
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
        Index("ix_processing_jobs_scope_page", "scope_id", "created_at", "id"),
        Index("ix_processing_jobs_batch", "batch_id", "status", postgresql_where=text("batch_id IS NOT NULL")),
        # No index names updated_at (migration 0021): an update that leaves status alone (a stage
        # linked: current_stage, metadata_hash, updated_at) is then HOT — no index entries written.
        Index(
            "ix_processing_jobs_needs_human", "scope_id",
            postgresql_where=text("status IN ('blocked', 'unknown_execution', 'failed')"),
        ),
        # room on each page for those HOT updates (a job's row is rewritten ~5 times in its life)
        {"postgresql_with": {"fillfactor": 80}},
    )

class JobStage(Base):
    __tablename__ = "job_stages"
    job_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    stage: Mapped[str] = mapped_column(String(24), primary_key=True)
    scope_id: Mapped[str] = scope_column()
    position: Mapped[int] = mapped_column(SmallInteger, nullable=False)
    status: Mapped[str] = mapped_column(String(24), nullable=False, server_default="pending")
    input_fingerprint: Mapped[str | None] = mapped_column(String(64))
    task_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    attempt_count: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    error: Mapped[dict | None] = mapped_column(JSONB)
    retry_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = timestamp_now()
    updated_at: Mapped[datetime] = timestamp_now()
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    completed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    __table_args__ = (
        ForeignKeyConstraint(
            ["scope_id", "job_id"], ["processing_jobs.scope_id", "processing_jobs.id"], ondelete="CASCADE"
        ),
        status_check("status", E.StageStatus),
        status_check("stage", E.Stage),
        Index("ix_job_stages_task", "task_id", postgresql_where=text("task_id IS NOT NULL")),
        # room on each page for the HOT updates of a stage's claim and finish (migration 0021)
        {"postgresql_with": {"fillfactor": 80}},
    )

class BatchItem(Base):
    __tablename__ = "batch_items"
    batch_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    image_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    scope_id: Mapped[str] = scope_column()
    job_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    created_at: Mapped[datetime] = timestamp_now()
    __table_args__ = (
        ForeignKeyConstraint(["scope_id", "batch_id"], ["batches.scope_id", "batches.id"], ondelete="CASCADE"),
        ForeignKeyConstraint(["scope_id", "image_id"], ["images.scope_id", "images.id"], ondelete="CASCADE"),
        ForeignKeyConstraint(
            ["scope_id", "job_id"], ["processing_jobs.scope_id", "processing_jobs.id"], ondelete="CASCADE"
        ),
        Index("ix_batch_items_job", "job_id"),
    )
