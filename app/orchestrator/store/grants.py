"""Operation grants (SPEC §4.6): one row per (scope, operation, idempotency key)."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy.engine import Connection, RowMapping

from app.db.enums import GrantState
from app.db.jsoncodec import dumps
from app.orchestrator.store._sql import Outcome, sql, transition

COUNTED = (GrantState.ACQUIRED, GrantState.COMMITTED, GrantState.UNKNOWN)  # grants that consume quota


def lock_usage_txn(conn: Connection, scope_id: str, operation: str) -> None:
    """Serialise quota decisions of one (scope, operation) until the transaction ends."""
    conn.execute(sql("SELECT pg_advisory_xact_lock(hashtextextended(:k, 0))"), {"k": f"grant:{scope_id}:{operation}"})


def grant_by_key_txn(conn: Connection, scope_id: str, operation: str, key: str) -> RowMapping | None:
    return conn.execute(
        sql(
            "SELECT * FROM operation_grants WHERE scope_id = :s AND operation = :o AND idempotency_key = :k"
            " FOR UPDATE"
        ),
        {"s": scope_id, "o": operation, "k": key},
    ).mappings().first()


def count_used_txn(conn: Connection, scope_id: str, operation: str, since: datetime, until: datetime) -> int:
    """Grants that consumed quota in [since, until) (ix_operation_grants_usage range scan)."""
    return conn.execute(
        sql(
            "SELECT count(*) FROM operation_grants WHERE scope_id = :s AND operation = :o"
            " AND created_at >= :a AND created_at < :b AND state = ANY(:st)"
        ),
        {"s": scope_id, "o": operation, "a": since, "b": until, "st": list(COUNTED)},
    ).scalar_one()


def acquire_txn(conn: Connection, scope_id: str, operation: str, key: str, now: datetime) -> RowMapping:
    """Insert an acquired grant, or re-acquire a released one with the same key; returns the row.

    An existing acquired/committed/unknown grant for the key is returned unchanged (idempotent).
    """
    return acquire_many_txn(conn, [(scope_id, operation, key)], now).expect("an upsert returns its row").row


COMMIT_GRANT = sql("UPDATE operation_grants SET state = 'committed', updated_at = :now WHERE id = :id AND state = 'acquired'")


@transition
def commit_grant_txn(conn: Connection, grant_id: uuid.UUID, now: datetime) -> Outcome[None]:
    """acquired → committed: the paid operation happened. Not matched: committed, released or unknown already."""
    return Outcome.count(conn.execute(COMMIT_GRANT, {"id": grant_id, "now": now}).rowcount)


COMMIT_GRANTS = sql("""
UPDATE operation_grants SET state = 'committed', updated_at = :now WHERE id = ANY(:ids) AND state = 'acquired'
""")


@transition
def commit_grants_txn(conn: Connection, grant_ids: list[uuid.UUID], now: datetime) -> Outcome[None]:
    """acquired → committed, several grants in one statement (a batch's fenced completion)."""
    if not grant_ids:
        return Outcome(False)
    return Outcome.count(conn.execute(COMMIT_GRANTS, {"ids": grant_ids, "now": now}).rowcount)


RELEASE_GRANT = sql("UPDATE operation_grants SET state = 'released', updated_at = :now WHERE id = :id AND state = 'acquired'")


@transition
def release_grant_txn(conn: Connection, grant_id: uuid.UUID, now: datetime) -> Outcome[None]:
    """acquired → released: its task was cancelled before any attempt. Not matched: it was used or released."""
    return Outcome.count(conn.execute(RELEASE_GRANT, {"id": grant_id, "now": now}).rowcount)


MARK_GRANT_UNKNOWN = sql("UPDATE operation_grants SET state = 'unknown', updated_at = :now WHERE id = :id AND state = 'acquired'")


@transition
def mark_grant_unknown_txn(conn: Connection, grant_id: uuid.UUID, now: datetime) -> Outcome[None]:
    """acquired → unknown: the paid call may or may not have happened (it still counts)."""
    return Outcome.count(conn.execute(MARK_GRANT_UNKNOWN, {"id": grant_id, "now": now}).rowcount)


BIND_GRANT_TO_TASK = sql("UPDATE operation_grants SET task_id = :t, updated_at = :now WHERE id = :g")
BIND_TASK_TO_GRANT = sql("UPDATE tasks SET grant_id = :g WHERE id = :t")


@transition
def bind_task_txn(conn: Connection, grant_id: uuid.UUID, task_id: uuid.UUID, now: datetime) -> Outcome[None]:
    """grant and task → linked both ways (tasks.grant_id is how recovery and retries find it).

    Matched when the task row was linked; a custom policy's grant need not have an
    ``operation_grants`` row (``affected``: 1 then, 2 with one)."""
    granted = conn.execute(BIND_GRANT_TO_TASK, {"g": grant_id, "t": task_id, "now": now}).rowcount
    tasked = conn.execute(BIND_TASK_TO_GRANT, {"g": grant_id, "t": task_id}).rowcount
    return Outcome(tasked > 0, (), granted + tasked)


def task_grant_txn(conn: Connection, task_id: uuid.UUID) -> uuid.UUID | None:
    return conn.execute(sql("SELECT grant_id FROM tasks WHERE id = :t"), {"t": task_id}).scalar()


def task_has_attempts_txn(conn: Connection, task_id: uuid.UUID) -> bool:
    return conn.execute(
        sql("SELECT EXISTS (SELECT 1 FROM task_attempts WHERE task_id = :t)"), {"t": task_id}
    ).scalar_one()


def active_dedupe_keys_txn(conn: Connection, keys: list[tuple[str, str]]) -> set[tuple[str, str]]:
    """Which (scope, dedupe key) pairs have an active task — would a task insert be deduplicated
    onto it (no new logical task)?"""
    if not keys:
        return set()
    rows = conn.execute(
        sql(
            "SELECT scope_id, dedupe_key FROM tasks WHERE scope_id = ANY(:s) AND dedupe_key = ANY(:k)"
            " AND status IN ('queued', 'running')"
        ),
        {"s": sorted({s for s, _ in keys}), "k": [k for _, k in keys]},
    ).all()
    return {(s, k) for s, k in rows} & set(keys)


# A released grant with the key is acquired again (a new quota window starts with it); any other
# existing one comes back unchanged (idempotent). RETURNING gives every wanted row.
ACQUIRE_GRANTS = sql("""
INSERT INTO operation_grants (id, scope_id, operation, idempotency_key, state, created_at, updated_at)
SELECT id, s, o, k, 'acquired', :now, :now FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(id uuid, s text, o text, k text)
ON CONFLICT (scope_id, operation, idempotency_key) DO UPDATE SET
  state = CASE WHEN operation_grants.state = 'released' THEN 'acquired' ELSE operation_grants.state END,
  created_at = CASE WHEN operation_grants.state = 'released' THEN :now ELSE operation_grants.created_at END,
  updated_at = :now
RETURNING *
""")


@transition
def acquire_many_txn(conn: Connection, wanted: list[tuple[str, str, str]], now: datetime) -> Outcome[RowMapping]:
    """— / released → acquired: the grants of several distinct (scope, operation, key) triples, one
    statement; ``rows``: the grant rows in ``wanted``'s order. Not matched: nothing wanted."""
    if not wanted:
        return Outcome(False)
    doc = dumps([{"id": str(uuid.uuid4()), "s": s, "o": o, "k": k} for s, o, k in wanted])
    rows = conn.execute(ACQUIRE_GRANTS, {"rows": doc, "now": now}).mappings().all()
    by_key = {(r["scope_id"], r["operation"], r["idempotency_key"]): r for r in rows}
    return Outcome.of(by_key[w] for w in wanted)
