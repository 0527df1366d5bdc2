"""The leaf-task queue and what a claim holds: tasks, attempts, lane slots and fairness, operation grants."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    ForeignKeyConstraint,
    Index,
    Integer,
    Sequence,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.orm import Mapped, mapped_column

from app.db import enums as E
from app.db.models.base import Base, scope_column, status_check, timestamp_now, uuid_pk


class Task(Base):
    __tablename__ = "tasks"
    id: Mapped[uuid.UUID] = uuid_pk()
    scope_id: Mapped[str] = scope_column()
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
    available_at: Mapped[datetime] = timestamp_now()
    lease_owner: Mapped[str | None] = mapped_column(Text)
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    claim_generation: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    attempt_count: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    max_attempts: Mapped[int] = mapped_column(Integer, nullable=False)
    # the current (or last) execution was claimed in a batch of one: if its worker dies, the death
    # is this task's own and stays charged; a death in a batch of several is refunded at the next
    # claim, which runs the task alone (SPEC §10: one item never charges another)
    claimed_alone: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default="true")
    last_hint_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # the task whose hint also wakes this one (created together by a batched completion)
    hint_group: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    # on a group's named task: how many members its hint wakes too (the cap for joining it)
    hint_members: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    cancel_requested: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default="false")
    grant_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    error: Mapped[dict | None] = mapped_column(JSONB)
    result: Mapped[dict | None] = mapped_column(JSONB)
    created_at: Mapped[datetime] = timestamp_now()
    updated_at: Mapped[datetime] = timestamp_now()
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
    scope_id: Mapped[str] = scope_column()
    task_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), nullable=False)
    attempt_no: Mapped[int] = mapped_column(Integer, nullable=False)
    claim_generation: Mapped[int] = mapped_column(BigInteger, nullable=False)
    state: Mapped[str] = mapped_column(String(24), nullable=False)
    input_digest: Mapped[str] = mapped_column(String(64), nullable=False)
    target_sha256: Mapped[str] = mapped_column(String(64), nullable=False)
    provider_request_id: Mapped[str | None] = mapped_column(Text)
    result: Mapped[dict | None] = mapped_column(JSONB)
    error: Mapped[dict | None] = mapped_column(JSONB)
    # the provider that started it re-runs at no cost and with no external effect (migration 0029)
    recall_safe: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default="false")
    created_at: Mapped[datetime] = timestamp_now()
    updated_at: Mapped[datetime] = timestamp_now()
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
    updated_at: Mapped[datetime] = timestamp_now()
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
    id: Mapped[uuid.UUID] = uuid_pk()
    scope_id: Mapped[str] = scope_column()
    operation: Mapped[str] = mapped_column(String(64), nullable=False)
    idempotency_key: Mapped[str] = mapped_column(String(128), nullable=False)
    task_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    state: Mapped[str] = mapped_column(String(16), nullable=False)
    retry_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = timestamp_now()
    updated_at: Mapped[datetime] = timestamp_now()
    __table_args__ = (
        ForeignKeyConstraint(["scope_id"], ["scopes.id"], ondelete="CASCADE"),
        UniqueConstraint("scope_id", "operation", "idempotency_key"),
        status_check("state", E.GrantState),
        Index("ix_operation_grants_usage", "scope_id", "operation", "created_at"),
    )
