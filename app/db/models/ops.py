"""Operations state: counters, worker registrations, the last sweep, retention walks."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    Double,
    Integer,
    SmallInteger,
    String,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import Mapped, mapped_column

from app.db.models.base import Base, timestamp_now


class OpsCounter(Base):
    """Per-minute counters of rare operational events (fencing rejections, re-hints) of a scope, for
    its /ops page (migration 0030; ``''``: counted before counters had a scope, shown to nobody)."""

    __tablename__ = "ops_counters"
    bucket: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    scope_id: Mapped[str] = mapped_column(String(128), primary_key=True, server_default="")
    count: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")

class WorkerRegistration(Base):
    """One live worker process (migration 0012): upserted on its registry heartbeat, pruned by the
    sweep after the TTL. ``node`` is the Celery node name (unique in a cluster). A worker serving the
    agent lane records the agent lane limits it was given (migration 0031; NULL otherwise): the
    deployment admits under the most conservative of the live ones (app/orchestrator/lane_limits.py)."""

    __tablename__ = "worker_registry"
    node: Mapped[str] = mapped_column(String(255), primary_key=True)
    host: Mapped[str] = mapped_column(String(255), nullable=False)
    pid: Mapped[int] = mapped_column(Integer, nullable=False)
    lanes: Mapped[list[str]] = mapped_column(ARRAY(String(32)), nullable=False)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    last_seen: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    agent_lane_limit: Mapped[int | None] = mapped_column(Integer)
    agent_resource_limit: Mapped[int | None] = mapped_column(Integer)
    __table_args__ = (
        CheckConstraint("agent_lane_limit >= 0 AND agent_resource_limit >= 0", name="agent_limits_valid"),
    )

class SweepState(Base):
    """The last completed reconcile sweep (single row): when, how long, and its lane gauges."""

    __tablename__ = "sweep_state"
    id: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    last_success_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    duration_s: Mapped[float] = mapped_column(Double, nullable=False)
    lane_gauges: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, server_default=text("'{}'::jsonb"))
    failed_steps: Mapped[list[Any]] = mapped_column(JSONB, nullable=False, server_default=text("'[]'::jsonb"))
    __table_args__ = (CheckConstraint("id = 1", name="single_row"),)


class RetentionWalk(Base):
    """Where the sweep's retention walk of one kind of history resumes (migration 0016)."""

    __tablename__ = "retention_walks"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    after_key: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[datetime] = timestamp_now()
