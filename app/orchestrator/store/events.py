"""The events outbox (migration 0014): reads for the stream and the webhook lane, the one event
the orchestrator writes itself (``batch.progress``), stream slots, retention.

Job, image and batch-end events are written by triggers in the transaction of the change; every
event — theirs and ``stage_event_txn``'s — gets its id when that transaction commits, under the
scope's advisory lock, so ids of one scope grow in commit order.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.engine import Connection, RowMapping

from app.orchestrator.fingerprints import canonical_json
from app.orchestrator.store._sql import Outcome, sql, transition

# A scope's committed events after an id (of the given types, if any), oldest first (ix_events_scope_id).
EVENTS_AFTER = sql("""
SELECT id, scope_id, type, job_id, image_id, batch_id, payload, created_at FROM events
WHERE scope_id = :s AND id > :after AND (CAST(:types AS text[]) IS NULL OR type = ANY(CAST(:types AS text[])))
ORDER BY id LIMIT :n
""")


def events_after_txn(
    conn: Connection, scope_id: str, after: int, limit: int, types: list[str] | None = None
) -> list[RowMapping]:
    """Up to ``limit`` events of ``scope_id`` with id > ``after`` (of ``types`` if given), in id order."""
    return list(conn.execute(EVENTS_AFTER, {"s": scope_id, "after": after, "n": limit, "types": types}).mappings())


def last_event_id_txn(conn: Connection, scope_id: str) -> int:
    """The newest committed event id of ``scope_id`` (0 when there is none)."""
    return conn.execute(
        sql("SELECT coalesce(max(id), 0) FROM events WHERE scope_id = :s"), {"s": scope_id}
    ).scalar_one()


def stage_event_txn(
    conn: Connection, scope_id: str, type_: str, payload: dict[str, Any], *, job_id: uuid.UUID | None = None,
    image_id: uuid.UUID | None = None, batch_id: uuid.UUID | None = None,
) -> None:
    """Stage an event in the caller's transaction; it exists iff that transaction commits."""
    conn.execute(
        sql(
            "INSERT INTO event_pending (scope_id, type, job_id, image_id, batch_id, payload)"
            " VALUES (:s, :t, :j, :i, :b, CAST(:p AS jsonb))"
        ),
        {"s": scope_id, "t": type_, "j": job_id, "i": image_id, "b": batch_id, "p": canonical_json(payload)},
    )


def last_batch_progress_txn(conn: Connection, batch_id: uuid.UUID) -> dict[str, Any] | None:
    """The payload of the batch's newest ``batch.progress`` event (ix_events_batch), or None."""
    return conn.execute(
        sql(
            "SELECT payload FROM events WHERE batch_id = :b AND type = 'batch.progress'"
            " ORDER BY id DESC LIMIT 1"
        ),
        {"b": batch_id},
    ).scalar()


PRUNE_EVENTS = sql("DELETE FROM events WHERE id IN (SELECT id FROM events ORDER BY id LIMIT :n) AND created_at < :cut")


@transition
def prune_events_txn(conn: Connection, cutoff: datetime, limit: int) -> Outcome[None]:
    """committed, created before ``cutoff`` → deleted: up to ``limit`` of the oldest events
    (primary-key order); ``affected``: how many. Not matched: the oldest are younger."""
    return Outcome.count(conn.execute(PRUNE_EVENTS, {"n": limit, "cut": cutoff}).rowcount)


# -- acquire_stream_slot: a free (absent or expired) slot of the scope, taken under a lease --
ACQUIRE_STREAM_SLOT = sql(
    "INSERT INTO event_stream_slots AS x (scope_id, slot_no, holder, expires_at)"
    " SELECT CAST(:s AS varchar), g, CAST(:h AS varchar), CAST(:exp AS timestamptz)"
    "  FROM generate_series(0, CAST(:n AS int) - 1) AS g"
    "  WHERE NOT EXISTS (SELECT 1 FROM event_stream_slots y WHERE y.scope_id = CAST(:s AS varchar) AND y.slot_no = g"
    "   AND y.expires_at > :now)"
    "  ORDER BY g LIMIT 1"
    " ON CONFLICT (scope_id, slot_no) DO UPDATE SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at"
    "  WHERE x.expires_at <= :now"
    " RETURNING slot_no"
)


@transition
def acquire_stream_slot_txn(
    conn: Connection, scope_id: str, holder: str, n: int, now: datetime, lease_s: float
) -> Outcome[int]:
    """free (absent or expired) → held by ``holder`` until now + lease: one of the scope's ``n``
    stream slots; ``row``: its number. Not matched: all are held (or a racing stream took it)."""
    return Outcome.of(conn.execute(
        ACQUIRE_STREAM_SLOT,
        {"s": scope_id, "h": holder, "n": n, "now": now, "exp": now + timedelta(seconds=lease_s)},
    ).scalars().all())


RENEW_STREAM_SLOT = sql("""
UPDATE event_stream_slots SET expires_at = :exp WHERE scope_id = :s AND slot_no = :n AND holder = :h
""")


@transition
def renew_stream_slot_txn(
    conn: Connection, scope_id: str, slot_no: int, holder: str, now: datetime, lease_s: float
) -> Outcome[None]:
    """held → held, lease extended (fenced by holder). Not matched: it was lost (expired and taken
    by another stream)."""
    return Outcome.count(conn.execute(
        RENEW_STREAM_SLOT, {"s": scope_id, "n": slot_no, "h": holder, "exp": now + timedelta(seconds=lease_s)},
    ).rowcount)


RELEASE_STREAM_SLOT = sql("DELETE FROM event_stream_slots WHERE scope_id = :s AND slot_no = :n AND holder = :h")


@transition
def release_stream_slot_txn(conn: Connection, scope_id: str, slot_no: int, holder: str) -> Outcome[None]:
    """held by ``holder`` → free (fenced by holder). Not matched: it was lost already."""
    return Outcome.count(conn.execute(RELEASE_STREAM_SLOT, {"s": scope_id, "n": slot_no, "h": holder}).rowcount)
