"""Tenant limits (issue 17): per-scope overrides, usage, and fixed one-minute rate windows."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.engine import Connection, RowMapping

from app.orchestrator.store._sql import sql

LIMIT_COLUMNS = ("max_bytes", "max_images", "uploads_per_minute", "processing_per_minute")


def scope_limits_txn(conn: Connection, scope_id: str) -> RowMapping | None:
    """The scope's overrides (a NULL column = the global setting), or None."""
    return conn.execute(
        sql(f"SELECT {', '.join(LIMIT_COLUMNS)} FROM scope_limits WHERE scope_id = :s"), {"s": scope_id}
    ).mappings().first()


def scope_exists_txn(conn: Connection, scope_id: str) -> bool:
    return conn.execute(sql("SELECT 1 FROM scopes WHERE id = :s"), {"s": scope_id}).first() is not None


def set_scope_limits_txn(conn: Connection, scope_id: str, values: dict[str, int | None], now: datetime) -> None:
    """Upsert the given overrides (columns not in ``values`` keep theirs; None = back to global)."""
    cols = [c for c in LIMIT_COLUMNS if c in values]
    conn.execute(
        sql(
            f"INSERT INTO scope_limits (scope_id, {', '.join(cols)}, updated_at)"
            f" VALUES (:s, {', '.join(':' + c for c in cols)}, :now) ON CONFLICT (scope_id) DO UPDATE SET"
            + "".join(f" {c} = excluded.{c}," for c in cols) + " updated_at = excluded.updated_at"
        ),
        {"s": scope_id, "now": now, **{c: values[c] for c in cols}},
    )


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
