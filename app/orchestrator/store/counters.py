"""Per-minute operational counters in PostgreSQL (shared by all processes, read by /ops)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.engine import Connection

from app.orchestrator.store._sql import sql


def bump_txn(conn: Connection, name: str, now: datetime, n: int = 1) -> None:
    if n <= 0:
        return
    conn.execute(
        sql(
            "INSERT INTO ops_counters (bucket, name, count) VALUES (date_trunc('minute', CAST(:now AS timestamptz)),"
            " :name, :n) ON CONFLICT (bucket, name) DO UPDATE SET count = ops_counters.count + EXCLUDED.count"
        ),
        {"now": now, "name": name, "n": n},
    )
