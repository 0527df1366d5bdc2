"""Per-minute operational counters of each scope in PostgreSQL (shared by all processes, read by
the scope's /ops page: one tenant never sees another's counts)."""

from __future__ import annotations

from collections import Counter
from datetime import datetime

from sqlalchemy.engine import Connection

from app.orchestrator.store._sql import sql

BUMP = sql(
    "INSERT INTO ops_counters (bucket, name, scope_id, count)"
    " VALUES (date_trunc('minute', CAST(:now AS timestamptz)), :name, :s, :n)"
    " ON CONFLICT (bucket, name, scope_id) DO UPDATE SET count = ops_counters.count + EXCLUDED.count"
)


def bump_txn(conn: Connection, name: str, scope_id: str, now: datetime, n: int = 1) -> None:
    """Add ``n`` to ``scope_id``'s ``name`` counter of the current minute."""
    if n <= 0:
        return
    conn.execute(BUMP, {"now": now, "name": name, "s": scope_id, "n": n})


def bump_each_txn(conn: Connection, name: str, scope_ids: list[str], now: datetime) -> None:
    """One count of ``name`` for each entry of ``scope_ids`` (a scope listed twice counts twice)."""
    for scope_id, n in Counter(scope_ids).items():
        bump_txn(conn, name, scope_id, now, n)
