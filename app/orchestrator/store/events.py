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
    """The payload of the batch's newest ``batch.progress`` event — or ``batch.cancelled``, whose
    counts a cancel's last progress event follows (ix_events_batch), or None."""
    return conn.execute(
        sql(
            "SELECT payload FROM events WHERE batch_id = :b AND type IN ('batch.progress', 'batch.cancelled')"
            " ORDER BY id DESC LIMIT 1"
        ),
        {"b": batch_id},
    ).scalar()


# -- prune_events: the oldest expired events, and the subscriptions that had not delivered them --
# A webhook subscription whose cursor had not reached some of them (of its types) is told in the
# same statement: its cursor moves past them, failed_count counts them, last_error says
# events_expired and one webhook_failures row records the range (event_id = its last). attempts
# counts the failures of the first event of its types after the cursor; the prune is the only way
# an event disappears, so resetting it here is what keeps a pruned event's attempts from being
# charged to the next one. The rows are locked first (id order) so the counts are taken from
# their current cursors, not the statement's snapshot. Each scope's prune mark (the highest id
# deleted) moves up in the same statement: a stream read from a cursor below it is told that
# events may be missing (``pruned_through_txn``).
PRUNE_EVENTS = sql("""
WITH gone AS (
  DELETE FROM events WHERE id IN (SELECT id FROM events ORDER BY id LIMIT :n) AND created_at < :cut
  RETURNING id, scope_id, type
), subs AS (
  SELECT s.id, s.scope_id, s.cursor, s.event_types, s.attempts FROM webhook_subscriptions s
  WHERE s.scope_id IN (SELECT scope_id FROM gone) ORDER BY s.id FOR NO KEY UPDATE
), missed AS (
  SELECT s.id, s.scope_id, s.attempts, count(*) AS n, min(g.id) AS first_id, max(g.id) AS last_id
  FROM subs s JOIN gone g ON g.scope_id = s.scope_id AND g.id > s.cursor AND g.type = ANY(s.event_types)
  GROUP BY s.id, s.scope_id, s.attempts
), told AS (
  UPDATE webhook_subscriptions w SET cursor = m.last_id, attempts = 0, failed_count = w.failed_count + m.n,
         last_error = jsonb_build_object('code', 'events_expired', 'status', NULL, 'count', m.n,
           'first_event_id', m.first_id, 'last_event_id', m.last_id,
           'message', m.n || ' event(s) expired (MEMEFLOW_EVENTS_RETENTION_S) before they were delivered')
  FROM missed m WHERE w.id = m.id
  RETURNING w.id, w.scope_id, w.last_error, m.attempts, m.last_id
), recorded AS (
  INSERT INTO webhook_failures (scope_id, subscription_id, event_id, attempts, error, failed_at)
  SELECT scope_id, id, last_id, attempts, last_error, :now FROM told
), marked AS (
  INSERT INTO event_prune_marks AS p (scope_id, pruned_through, pruned_at)
  SELECT scope_id, max(id), :now FROM gone GROUP BY scope_id
  ON CONFLICT (scope_id) DO UPDATE SET pruned_through = GREATEST(p.pruned_through, EXCLUDED.pruned_through),
     pruned_at = EXCLUDED.pruned_at
)
SELECT count(*) FROM gone
""")


@transition
def prune_events_txn(conn: Connection, cutoff: datetime, limit: int, now: datetime) -> Outcome[None]:
    """committed, created before ``cutoff`` → deleted: up to ``limit`` of the oldest events
    (primary-key order); ``affected``: how many. A subscription that had not delivered some of
    them → cursor past them, attempts 0, counted failed, ``events_expired`` recorded; each scope's
    prune mark → the highest id deleted. Not matched: the oldest are younger."""
    return Outcome.count(conn.execute(PRUNE_EVENTS, {"n": limit, "cut": cutoff, "now": now}).scalar_one())


PRUNED_THROUGH = sql("SELECT coalesce(max(pruned_through), 0) FROM event_prune_marks WHERE scope_id = :s")


def pruned_through_txn(conn: Connection, scope_id: str) -> int:
    """The highest event id of ``scope_id`` retention has deleted (0: none ever was). Events with
    ids up to it may be gone, so a cursor below it may have missed some."""
    return conn.execute(PRUNED_THROUGH, {"s": scope_id}).scalar_one()


def lock_stream_slots_txn(conn: Connection, scope_id: str) -> None:
    """Serialise the scope's slot acquisitions until the caller's transaction ends: an open that
    raced another for the same free slot would otherwise lose it and see every slot held (429)
    while another slot was free."""
    conn.execute(sql("SELECT pg_advisory_xact_lock(hashtextextended('memeflow.stream_slots:' || :s, 0))"),
                 {"s": scope_id})


# -- acquire_stream_slot: a free (absent or expired) slot of the scope, taken under a lease --
# (the caller holds lock_stream_slots_txn, so it sees every slot taken before it committed)
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
    stream slots; ``row``: its number. Not matched: all are held (the caller holds
    ``lock_stream_slots_txn``: no racing open can take the free slot it picked)."""
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
