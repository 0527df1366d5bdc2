"""Search serving states and their history (migration 0017)."""

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
    String,
    Text,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.orm import Mapped, mapped_column

from app.db import enums as E
from app.db.models.base import Base, scope_column, status_check, timestamp_now


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
    updated_at: Mapped[datetime] = timestamp_now()
    # migration 0025: since when sweeps have been configured with another model than the row's
    # direction (serving, or the target in a backfill), and which ({"model", "dims",
    # "preprocess_version"}); acted on only after MEMEFLOW_SEARCH_CONFIG_GRACE_S
    config_disagree_since: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    config_disagree_ref: Mapped[dict | None] = mapped_column(JSONB)
    attended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))  # the sweep's round-robin
    __table_args__ = (
        ForeignKeyConstraint(["scope_id"], ["scopes.id"], ondelete="CASCADE"),
        status_check("kind", E.ServingKind),
        status_check("state", E.ServingState),
        CheckConstraint("(target_model IS NULL) = (state <> 'backfill')", name="target_iff_backfill"),
        CheckConstraint("(config_disagree_since IS NULL) = (config_disagree_ref IS NULL)", name="config_disagree_both"),
        Index("ix_search_serving_state", "state", "kind"),
    )


class SearchServingEvent(Base):
    """Every change of a scope's serving state, with the epoch it produced (an audit trail)."""

    __tablename__ = "search_serving_events"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    scope_id: Mapped[str] = scope_column()
    kind: Mapped[str] = mapped_column(String(16), nullable=False)
    action: Mapped[str] = mapped_column(String(16), nullable=False)
    epoch: Mapped[int] = mapped_column(BigInteger, nullable=False)
    from_model: Mapped[str | None] = mapped_column(Text)
    to_model: Mapped[str | None] = mapped_column(Text)
    detail: Mapped[dict | None] = mapped_column(JSONB)
    at: Mapped[datetime] = timestamp_now()
    __table_args__ = (
        ForeignKeyConstraint(["scope_id"], ["scopes.id"], ondelete="CASCADE"),
        status_check("action", E.ServingAction),
        Index("ix_search_serving_events_scope", "scope_id", "kind", "id"),
    )
