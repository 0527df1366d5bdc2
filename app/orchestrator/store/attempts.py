"""Agent attempts (SPEC §4.5): a row committed in external_started before any paid call."""

from __future__ import annotations

import secrets
import uuid
from datetime import datetime

from sqlalchemy.engine import Connection, RowMapping

from app.orchestrator.fingerprints import canonical_json
from app.orchestrator.store._sql import sql


def open_attempt_txn(conn: Connection, task_id: uuid.UUID) -> RowMapping | None:
    """The latest attempt still in external_started (an execution that never finished)."""
    return (
        conn.execute(
            sql(
                "SELECT * FROM task_attempts WHERE task_id = :t AND state = 'external_started'"
                " ORDER BY attempt_no DESC LIMIT 1 FOR UPDATE"
            ),
            {"t": task_id},
        )
        .mappings()
        .first()
    )


def start_attempt_txn(
    conn: Connection, *, scope_id: str, task_id: uuid.UUID, generation: int, input_digest: str,
    target_sha256: str, now: datetime,
) -> str:
    """Insert a new attempt in external_started with an unguessable attempt id; returns it."""
    attempt_id = secrets.token_hex(16)
    conn.execute(
        sql(
            "INSERT INTO task_attempts (attempt_id, scope_id, task_id, attempt_no, claim_generation, state,"
            " input_digest, target_sha256, created_at, updated_at)"
            " SELECT :a, :s, :t, coalesce(max(attempt_no), 0) + 1, :g, 'external_started', :d, :sha, :now, :now"
            " FROM task_attempts WHERE task_id = :t"
        ),
        {"a": attempt_id, "s": scope_id, "t": task_id, "g": generation, "d": input_digest, "sha": target_sha256,
         "now": now},
    )
    return attempt_id


def finish_attempt_txn(
    conn: Connection, attempt_id: str, task_id: uuid.UUID, state: str, now: datetime, *,
    result: dict | None = None, error: dict | None = None, request_id: str | None = None,
) -> bool:
    res = conn.execute(
        sql(
            "UPDATE task_attempts SET state = :st, result = CAST(:res AS jsonb), error = CAST(:err AS jsonb),"
            " provider_request_id = coalesce(:rid, provider_request_id), updated_at = :now"
            " WHERE attempt_id = :a AND task_id = :t AND state = 'external_started'"
        ),
        {"a": attempt_id, "t": task_id, "st": state, "now": now, "rid": request_id,
         "res": None if result is None else canonical_json(result),
         "err": None if error is None else canonical_json(error)},
    )
    return res.rowcount > 0
