"""The database's clock: the one every process reads its ``now`` from (app/orchestrator/clock.py)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.engine import Connection

from app.orchestrator.store._sql import sql

CLOCK = sql("SELECT clock_timestamp()")


def read_clock(conn: Connection) -> datetime:
    """The database server's current time (not the transaction's start: ``clock_timestamp()``)."""
    return conn.execute(CLOCK).scalar_one()
