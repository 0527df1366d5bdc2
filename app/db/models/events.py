"""The events outbox, stream slots and webhook subscriptions (issue 20)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    ForeignKeyConstraint,
    Index,
    Integer,
    Sequence,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID
from sqlalchemy.orm import Mapped, mapped_column

from app.db import enums as E
from app.db.models.base import Base, scope_column, status_check, timestamp_now, uuid_pk

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
    scope_id: Mapped[str] = scope_column()
    type: Mapped[str] = mapped_column(String(40), nullable=False)
    job_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    image_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    batch_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, server_default=text("'{}'::jsonb"))
    created_at: Mapped[datetime] = timestamp_now()
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
    scope_id: Mapped[str] = scope_column()
    type: Mapped[str] = mapped_column(String(40), nullable=False)
    job_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    image_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    batch_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, server_default=text("'{}'::jsonb"))
    created_at: Mapped[datetime] = timestamp_now()
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


class EventPruneMark(Base):
    """How far retention has pruned a scope's events: the highest id the prune deleted (migration
    0023). A stream read from a cursor below it may have missed events (``expired`` in the page)."""

    __tablename__ = "event_prune_marks"
    scope_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    pruned_through: Mapped[int] = mapped_column(BigInteger, nullable=False)
    pruned_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    __table_args__ = (ForeignKeyConstraint(["scope_id"], ["scopes.id"], ondelete="CASCADE"),)


class WebhookSubscription(Base):
    """A scope's webhook: where to POST which event types, and its delivery cursor. The delivery
    lane claims a subscription like a task (lease + ``claim_generation``) and delivers its events
    after ``cursor`` one at a time, in id order."""

    __tablename__ = "webhook_subscriptions"
    id: Mapped[uuid.UUID] = uuid_pk()
    scope_id: Mapped[str] = scope_column()
    url: Mapped[str] = mapped_column(Text, nullable=False)
    event_types: Mapped[list[str]] = mapped_column(ARRAY(String(40)), nullable=False)
    secret: Mapped[str] = mapped_column(String(128), nullable=False)
    cursor: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    attempts: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    next_attempt_at: Mapped[datetime] = timestamp_now()
    lease_owner: Mapped[str | None] = mapped_column(String(255))
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    claim_generation: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    last_hint_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    delivered_count: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    failed_count: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    last_error: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    last_delivery_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = timestamp_now()
    __table_args__ = (
        ForeignKeyConstraint(["scope_id"], ["scopes.id"], ondelete="CASCADE"),
        UniqueConstraint("scope_id", "id"),
        Index("ix_webhook_subscriptions_scope_id", "scope_id"),
    )


class WebhookFailure(Base):
    """An event a subscription gave up on after ``MEMEFLOW_WEBHOOK_MAX_ATTEMPTS`` (shown on /ops)."""

    __tablename__ = "webhook_failures"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    scope_id: Mapped[str] = scope_column()
    subscription_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), nullable=False)
    event_id: Mapped[int] = mapped_column(BigInteger, nullable=False)
    attempts: Mapped[int] = mapped_column(Integer, nullable=False)
    error: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    failed_at: Mapped[datetime] = timestamp_now()
    __table_args__ = (
        ForeignKeyConstraint(["scope_id", "subscription_id"],
                             ["webhook_subscriptions.scope_id", "webhook_subscriptions.id"], ondelete="CASCADE"),
        Index("ix_webhook_failures_failed_at", "failed_at"),
    )
