"""Tenant limits (issue 17): stored bytes and image count (quotas), uploads and processing
requests per minute (rate limits). Each is a global ``MEMEFLOW_*`` setting that a scope may
override (``memeflow scopes limits``); 0 = unlimited, the default.

Quotas are decided in PostgreSQL with the insert: the ``scope_usage`` trigger updates the scope's
row in the upload's transaction, which then reads it back and rolls back when over — concurrent
uploads queue on that row, so a burst cannot overshoot. Rate limits are fixed one-minute windows
counted by one upsert (``rate_windows``), correct across API processes; the key is the API token
(token mode) or the scope (``MEMEFLOW_AUTH=none``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection

from app.orchestrator.errors import QuotaExceeded, RateLimited
from app.orchestrator.store import limits as store

if TYPE_CHECKING:
    from app.orchestrator.service import Orchestrator

WINDOW = timedelta(minutes=1)
RATE_KINDS = {"uploads": "uploads_per_minute", "processing": "processing_per_minute"}


@dataclass(frozen=True)
class Limits:
    max_bytes: int = 0
    max_images: int = 0
    uploads_per_minute: int = 0
    processing_per_minute: int = 0


def global_limits(settings) -> Limits:
    return Limits(settings.scope_max_bytes, settings.scope_max_images, settings.uploads_per_minute,
                  settings.processing_per_minute)


def limits_txn(orch: Orchestrator, conn: Connection, scope_id: str) -> Limits:
    """The scope's effective limits: its overrides, else the global settings."""
    return effective_limits(orch, store.scope_limits_txn(conn, scope_id))


def effective_limits(orch: Orchestrator, row: Any) -> Limits:
    """The effective limits from the scope's override row (None: it has none), else the global settings."""
    base = global_limits(orch.settings)
    if row is None:
        return base
    return Limits(**{k: (row[k] if row[k] is not None else getattr(base, k)) for k in store.LIMIT_COLUMNS})


def check_quota_txn(orch: Orchestrator, conn: Connection, scope_id: str, limits: Limits | None = None) -> None:
    """After this transaction wrote an image (insert or new bytes): raise QuotaExceeded — the
    caller's transaction then rolls back, leaving no row — when the scope is over a quota.
    ``limits``: the scope's effective limits, when this transaction read them already (an
    upload reads them with the scope's namespace, ``images.scope_facts_txn``)."""
    if limits is None:
        limits = limits_txn(orch, conn, scope_id)
    if not (limits.max_images or limits.max_bytes):
        return
    usage = store.usage_txn(conn, scope_id)
    if usage is None:
        return
    if limits.max_images and usage["image_count"] > limits.max_images:
        raise QuotaExceeded(f"the scope's image quota ({limits.max_images} images) is reached",
                            quota="max_images", limit=limits.max_images)
    if limits.max_bytes and usage["stored_bytes"] > limits.max_bytes:
        raise QuotaExceeded(f"the scope's storage quota ({limits.max_bytes} bytes) would be exceeded",
                            quota="max_bytes", limit=limits.max_bytes)


def take_request(orch: Orchestrator, kind: str, scope_id: str, key: str) -> None:
    """Count one ``kind`` request ("uploads" or "processing") of ``key``; raise RateLimited (with
    the seconds until the window ends) when over the scope's per-minute limit. Committed before
    the request does anything.

    In autocommit: each statement is its own transaction — the limits read (with no limit, the
    usual case, that is all: no BEGIN/COMMIT round trips per upload), then the count, one atomic
    upsert. Nothing here needs the two in one transaction: a limit changing in between applies
    from the next request, as it would a moment later anyway (docs/performance-log.md §24)."""
    now = orch.now()
    with orch.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        limit = getattr(limits_txn(orch, conn, scope_id), RATE_KINDS[kind])
        if not limit:
            return
        start = _window_start(now)
        count = store.count_request_txn(conn, kind, key, start)
    if count > limit:
        retry_after = max(1, math.ceil((start + WINDOW - now).total_seconds()))
        raise RateLimited(f"more than {limit} {kind} requests per minute; retry in {retry_after} s",
                          retry_after=retry_after, limit=limit)


def set_scope_limits(orch: Orchestrator, scope_id: str, values: dict[str, int | None]) -> dict:
    """Set overrides of an existing scope (negative values refused); returns its report."""
    from app.orchestrator.errors import InvalidRequest, NotFound

    if any(v is not None and v < 0 for v in values.values()):
        raise InvalidRequest("limits must be >= 0 (0 = unlimited)", code="invalid_limit")
    with orch.engine.begin() as conn:
        if not store.scope_exists_txn(conn, scope_id):
            raise NotFound(f"scope {scope_id!r} does not exist")
        if values:
            store.set_scope_limits_txn(conn, scope_id, values, orch.now())
        return {**store.limits_report_txn(conn, scope_id), "effective": limits_txn(orch, conn, scope_id)}


def _window_start(now: datetime) -> datetime:
    return now.replace(second=0, microsecond=0)
