"""Tenant limits (issue 17): per-scope overrides, usage, and fixed one-minute rate windows."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.engine import Connection, RowMapping

from app.orchestrator.store._sql import sql

LIMIT_COLUMNS = ("max_bytes", "max_images", "uploads_per_minute", "processing_per_minute")


SCOPE_LIMITS = sql("""
SELECT max_bytes, max_images, uploads_per_minute, processing_per_minute FROM scope_limits WHERE scope_id = :s
""")


def scope_limits_txn(conn: Connection, scope_id: str) -> RowMapping | None:
    """The scope's overrides (a NULL column = the global setting), or None."""
    return conn.execute(SCOPE_LIMITS, {"s": scope_id}).mappings().first()


def scope_exists_txn(conn: Connection, scope_id: str) -> bool:
    return conn.execute(sql("SELECT 1 FROM scopes WHERE id = :s"), {"s": scope_id}).first() is not None


# One fixed statement for any subset of columns (River's flag style): ``set_<column>`` says whether
# the request names that column; a column it does not name keeps its value.
SET_SCOPE_LIMITS = sql("""
INSERT INTO scope_limits AS l (scope_id, max_bytes, max_images, uploads_per_minute, processing_per_minute, updated_at)
VALUES (:s, :max_bytes, :max_images, :uploads_per_minute, :processing_per_minute, :now)
ON CONFLICT (scope_id) DO UPDATE SET
  max_bytes = CASE WHEN :set_max_bytes THEN excluded.max_bytes ELSE l.max_bytes END,
  max_images = CASE WHEN :set_max_images THEN excluded.max_images ELSE l.max_images END,
  uploads_per_minute = CASE WHEN :set_uploads_per_minute THEN excluded.uploads_per_minute
                            ELSE l.uploads_per_minute END,
  processing_per_minute = CASE WHEN :set_processing_per_minute THEN excluded.processing_per_minute
                               ELSE l.processing_per_minute END,
  updated_at = excluded.updated_at
""")


def set_scope_limits_txn(conn: Connection, scope_id: str, values: dict[str, int | None], now: datetime) -> None:
    """Upsert the given overrides (columns not in ``values`` keep theirs; None = back to global)."""
    conn.execute(SET_SCOPE_LIMITS, {
        "s": scope_id, "now": now, **{c: values.get(c) for c in LIMIT_COLUMNS},
        **{f"set_{c}": c in values for c in LIMIT_COLUMNS},
    })


def usage_txn(conn: Connection, scope_id: str) -> RowMapping | None:
    """(image_count, stored_bytes) — after this transaction's own writes: the trigger that keeps
    ``scope_usage`` holds the row locked from the first image write to commit, so uploads of one
    scope are decided one after the other."""
    return conn.execute(
        sql("SELECT image_count, stored_bytes FROM scope_usage WHERE scope_id = :s"), {"s": scope_id}
    ).mappings().first()


def count_request_txn(conn: Connection, kind: str, key: str, window_start: datetime) -> int:
    """Count one request of ``kind`` for ``key`` in the window starting at ``window_start`` (a
    newer window resets the count); returns the count including this one. One atomic upsert, so
    it holds across any number of API processes."""
    return conn.execute(
        sql(
            "INSERT INTO rate_windows (kind, key, window_start, count) VALUES (:k, :key, :w, 1)"
            " ON CONFLICT (kind, key) DO UPDATE SET"
            " count = CASE WHEN rate_windows.window_start = excluded.window_start THEN rate_windows.count + 1"
            "  WHEN rate_windows.window_start > excluded.window_start THEN rate_windows.count ELSE 1 END,"
            " window_start = greatest(rate_windows.window_start, excluded.window_start)"
            " RETURNING count"
        ),
        {"k": kind, "key": key, "w": window_start},
    ).scalar_one()


def limits_report_txn(conn: Connection, scope_id: str) -> dict[str, Any]:
    """Overrides and usage of one scope, for ``memeflow scopes limits``."""
    row = scope_limits_txn(conn, scope_id)
    usage = usage_txn(conn, scope_id)
    return {
        "overrides": dict(row) if row else {},
        "image_count": usage["image_count"] if usage else 0,
        "stored_bytes": usage["stored_bytes"] if usage else 0,
    }
