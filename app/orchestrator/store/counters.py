"""Per-minute operational counters in PostgreSQL (shared by all processes, read by /ops)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import text
from sqlalchemy.engine import Connection


def bump_txn(conn: Connection, name: str, now: datetime, n: int = 1) -> None:
    if n <= 0:
        return
    conn.execute(
        text(
            "INSERT INTO ops_counters (bucket, name, count) VALUES (date_trunc('minute', CAST(:now AS timestamptz)),"
            " :name, :n) ON CONFLICT (bucket, name) DO UPDATE SET count = ops_counters.count + EXCLUDED.count"
        ),
        {"now": now, "name": name, "n": n},
    )
