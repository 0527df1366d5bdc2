"""Leaf tasks: create (deduplicated), claim, heartbeat and the fenced terminal transitions.

Every write after a claim is conditioned on (task id, lease_owner, claim_generation,
status = 'running'); zero rows means the caller was fenced out.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.engine import Connection, RowMapping

from app.orchestrator.fingerprints import canonical_json
from app.orchestrator.store._sql import sql

FENCE = "id = :id AND lease_owner = :owner AND claim_generation = :gen AND status = 'running'"

_CLAIM_RETURNING = (
    "id, scope_id, job_id, image_id, image_sha256, stage, lane, resource_key, claim_generation, attempt_count,"
    " max_attempts, payload, input_fingerprint, grant_id"
)


# The claim's writes, shared by the single and the batched claim: a new execution (generation
# + 1, lease, attempt) ...
_CLAIM_SET = (
    " status = 'running', lease_owner = :owner, lease_expires_at = :exp,"
    " claim_generation = claim_generation + 1, attempt_count = attempt_count + 1,"
    " started_at = coalesce(started_at, :now), updated_at = :now"
)
# ... and, in the same statement, the claimed tasks' waiting stages and queued jobs to running.
_CLAIMED_TO_RUNNING = (
    ", s AS ("
    " UPDATE job_stages js SET status = 'running', attempt_count = c.attempt_count,"
    " started_at = coalesce(js.started_at, :now), updated_at = :now"
    " FROM c WHERE js.task_id = c.id AND js.status IN ('queued', 'running')"
    "), j AS ("
    " UPDATE processing_jobs pj SET status = 'running', updated_at = :now"
    " FROM c WHERE pj.id = c.job_id AND pj.status = 'queued'"
    ") SELECT c.*, i.storage_key FROM c JOIN images i ON i.id = c.image_id"
)


def insert_task_txn(conn: Connection, values: dict[str, Any], now: datetime) -> tuple[uuid.UUID, str, bool]:
    """Create a queued task, or return the identical active one (same dedupe key in the scope).

    Returns (task id, its status, created). ``last_hint_at`` is set now: the caller publishes the
    hint right after commit, and the sweep re-hints if that publish is lost.
    """
    row = conn.execute(
        sql(
            "INSERT INTO tasks (id, scope_id, job_id, stage, lane, resource_key, payload, input_fingerprint,"
            " dedupe_key, image_id, image_sha256, status, priority, available_at, max_attempts, last_hint_at,"
            " created_at, updated_at)"
            " VALUES (:id, :scope_id, :job_id, :stage, :lane, :resource_key, CAST(:payload AS jsonb),"
            " :input_fingerprint, :dedupe_key, :image_id, :image_sha256, 'queued', :priority, :now, :max_attempts,"
            " :now, :now, :now)"
            " ON CONFLICT (scope_id, dedupe_key) WHERE status IN ('queued', 'running') DO NOTHING RETURNING id"
        ),
        {**values, "id": uuid.uuid4(), "payload": canonical_json(values["payload"]), "now": now},
    ).first()
    if row is not None:
        return row[0], "queued", True
    existing = conn.execute(
        sql(
            "SELECT id, status FROM tasks WHERE scope_id = :s AND dedupe_key = :k"
            " AND status IN ('queued', 'running')"
        ),
        {"s": values["scope_id"], "k": values["dedupe_key"]},
    ).first()
    if existing is None:  # it finished between our insert and select: create a fresh one
        return insert_task_txn(conn, values, now)
    return existing[0], existing[1], False


def claim_txn(
    conn: Connection, task_id: uuid.UUID, owner: str, now: datetime, lease_s: float, lane: str | None = None
) -> RowMapping | None:
    """The one road into 'running': queued and due, or running with an expired lease.

    Bumps claim_generation (the fencing token) and moves the waiting stage(s) and job to running,
    all in one statement.
    """
    return (
        conn.execute(
            sql(
                "WITH c AS ("
                " UPDATE tasks SET" + _CLAIM_SET +
                " WHERE id = :id AND NOT cancel_requested AND attempt_count < max_attempts"
                " AND (CAST(:lane AS text) IS NULL OR lane = :lane)"
                " AND ((status = 'queued' AND available_at <= :now)"
                "  OR (status = 'running' AND lease_expires_at < :now))"
                f" RETURNING {_CLAIM_RETURNING}"
                ")" + _CLAIMED_TO_RUNNING
            ),
            {"id": task_id, "owner": owner, "now": now, "exp": now + timedelta(seconds=lease_s), "lane": lane},
        )
        .mappings()
        .first()
    )


def claim_batch_txn(
    conn: Connection, lane: str, n: int, owner: str, now: datetime, lease_s: float
) -> list[RowMapping]:
    """Claim up to ``n`` due queued tasks of a lane at once (FOR UPDATE SKIP LOCKED)."""
    return list(
        conn.execute(
            sql(
                "WITH pick AS ("
                " SELECT id FROM tasks WHERE lane = :lane AND status = 'queued' AND available_at <= :now"
                " AND NOT cancel_requested AND attempt_count < max_attempts"
                " ORDER BY priority DESC, available_at LIMIT :n FOR UPDATE SKIP LOCKED"
                "), c AS ("
                " UPDATE tasks t SET" + _CLAIM_SET +
                f" FROM pick WHERE t.id = pick.id RETURNING t.{_CLAIM_RETURNING.replace(', ', ', t.')}"
                ")" + _CLAIMED_TO_RUNNING
            ),
            {"lane": lane, "n": n, "owner": owner, "now": now, "exp": now + timedelta(seconds=lease_s)},
        )
        .mappings()
        .all()
    )


def heartbeat_txn(
    conn: Connection, task_id: uuid.UUID, owner: str, gen: int, now: datetime, lease_s: float
) -> RowMapping | None:
    """Extend the lease (fenced). Returns (cancel_requested,) or None when fenced out."""
    return (
        conn.execute(
            sql(f"UPDATE tasks SET lease_expires_at = :exp, updated_at = :now WHERE {FENCE} RETURNING cancel_requested"),
            {"id": task_id, "owner": owner, "gen": gen, "now": now, "exp": now + timedelta(seconds=lease_s)},
        )
        .mappings()
        .first()
    )


def finish_fenced_txn(
    conn: Connection, task_id: uuid.UUID, owner: str, gen: int, now: datetime, *, status: str,
    error: dict | None = None, result: dict | None = None,
) -> RowMapping | None:
    """Terminal transition of the current execution; None = fencing rejection."""
    return (
        conn.execute(
            sql(
                f"UPDATE tasks SET status = :st, error = CAST(:err AS jsonb), result = CAST(:res AS jsonb),"
                f" completed_at = :now, updated_at = :now, lease_expires_at = NULL WHERE {FENCE}"
                " RETURNING id, scope_id, job_id, stage, lane, resource_key, attempt_count"
            ),
            {"id": task_id, "owner": owner, "gen": gen, "now": now, "st": status,
             "err": None if error is None else canonical_json(error),
             "res": None if result is None else canonical_json(result)},
        )
        .mappings()
        .first()
    )


def requeue_fenced_txn(
    conn: Connection, task_id: uuid.UUID, owner: str, gen: int, now: datetime, available_at: datetime, error: dict
) -> RowMapping | None:
    """Back to queued after a retryable error, due at ``available_at`` (backoff)."""
    return (
        conn.execute(
            sql(
                "UPDATE tasks SET status = 'queued', available_at = :at, error = CAST(:err AS jsonb),"
                " lease_owner = NULL, lease_expires_at = NULL, last_hint_at = NULL, updated_at = :now"
                f" WHERE {FENCE} RETURNING id, job_id, stage, lane, attempt_count"
            ),
            {"id": task_id, "owner": owner, "gen": gen, "now": now, "at": available_at, "err": canonical_json(error)},
        )
        .mappings()
        .first()
    )


def cancel_job_tasks_txn(conn: Connection, job_id: uuid.UUID, now: datetime, reason: str) -> list[uuid.UUID]:
    """Queued tasks of the job → cancelled; running ones get cancel_requested. Returns cancelled ids."""
    err = canonical_json({"code": reason, "message": f"job {reason}"})
    cancelled = list(
        conn.execute(
            sql(
                "UPDATE tasks SET status = 'cancelled', error = CAST(:err AS jsonb), completed_at = :now,"
                " updated_at = :now WHERE job_id = :j AND status = 'queued' RETURNING id"
            ),
            {"j": job_id, "now": now, "err": err},
        ).scalars()
    )
    conn.execute(
        sql(
            "UPDATE tasks SET cancel_requested = true, updated_at = :now WHERE job_id = :j AND status = 'running'"
        ),
        {"j": job_id, "now": now},
    )
    return cancelled


def task_row_txn(conn: Connection, task_id: uuid.UUID) -> RowMapping | None:
    return conn.execute(sql("SELECT * FROM tasks WHERE id = :id"), {"id": task_id}).mappings().first()


def clear_hint_txn(conn: Connection, task_id: uuid.UUID) -> None:
    """The task's hint was spent without a claim: it waits unhinted (see lanes.refused_txn)."""
    conn.execute(sql("UPDATE tasks SET last_hint_at = NULL WHERE id = :id AND status = 'queued'"), {"id": task_id})


def mark_hinted_txn(conn: Connection, task_ids: list[uuid.UUID], now: datetime) -> None:
    conn.execute(sql("UPDATE tasks SET last_hint_at = :now WHERE id = ANY(:ids)"), {"ids": task_ids, "now": now})


def insert_and_link_task_txn(
    conn: Connection, values: dict[str, Any], now: datetime, *, set_metadata_hash: str | None,
    grant_id: uuid.UUID | None = None,
) -> uuid.UUID | None:
    """Fast path of advancing: create the task (bound to its operation grant, if any), point its
    stage at it and move the job's current_stage — one statement. None when an identical active
    task exists (dedupe; the grant is then left unbound for the caller)."""
    row = conn.execute(
        sql(
            "WITH t AS ("
            " INSERT INTO tasks (id, scope_id, job_id, stage, lane, resource_key, payload, input_fingerprint,"
            " dedupe_key, image_id, image_sha256, status, priority, available_at, max_attempts, last_hint_at,"
            " grant_id, created_at, updated_at)"
            " VALUES (:id, :scope_id, :job_id, :stage, :lane, :resource_key, CAST(:payload AS jsonb),"
            " :input_fingerprint, :dedupe_key, :image_id, :image_sha256, 'queued', :priority, :now, :max_attempts,"
            " :now, :grant_id, :now, :now)"
            " ON CONFLICT (scope_id, dedupe_key) WHERE status IN ('queued', 'running') DO NOTHING RETURNING id"
            "), g AS ("
            " UPDATE operation_grants SET task_id = t.id, updated_at = :now FROM t WHERE operation_grants.id = :grant_id"
            "), s AS ("
            " UPDATE job_stages SET status = 'queued', task_id = t.id, input_fingerprint = :input_fingerprint,"
            " error = NULL, retry_at = NULL, updated_at = :now FROM t WHERE job_id = :job_id AND stage = :stage"
            "), j AS ("
            " UPDATE processing_jobs SET current_stage = :stage, metadata_hash = coalesce(metadata_hash, :mh),"
            " updated_at = :now FROM t WHERE processing_jobs.id = :job_id AND status IN ('queued', 'running')"
            ") SELECT id FROM t"
        ),
        {**values, "id": uuid.uuid4(), "payload": canonical_json(values["payload"]), "now": now,
         "mh": set_metadata_hash, "grant_id": grant_id},
    ).first()
    return row[0] if row else None


def finish_and_release_stages_txn(
    conn: Connection, task_id: uuid.UUID, owner: str, gen: int, now: datetime, *, status: str,
    stage_status: str, error: dict | None = None, result: dict | None = None,
) -> RowMapping | None:
    """Fenced terminal transition of the task and of every stage waiting on it, in one statement.
    Returns the task row plus ``job_ids`` (the jobs to advance), or None on fencing rejection."""
    err = None if error is None else canonical_json(error)
    return conn.execute(
        sql(
            "WITH f AS ("
            " UPDATE tasks SET status = :st, error = CAST(:err AS jsonb), result = CAST(:res AS jsonb),"
            f" completed_at = :now, updated_at = :now, lease_expires_at = NULL WHERE {FENCE}"
            " RETURNING id, scope_id, job_id, stage, lane, resource_key, attempt_count"
            "), s AS ("
            " UPDATE job_stages js SET status = :sst, error = CAST(:err AS jsonb), updated_at = :now,"
            " completed_at = CASE WHEN CAST(:sst AS varchar) = 'succeeded' THEN CAST(:now AS timestamptz)"
            " ELSE js.completed_at END"
            " FROM f WHERE js.task_id = f.id AND js.status IN ('queued', 'running') RETURNING js.job_id"
            ") SELECT f.*, ARRAY(SELECT job_id FROM s) AS job_ids FROM f"
        ),
        {"id": task_id, "owner": owner, "gen": gen, "now": now, "st": status, "sst": stage_status, "err": err,
         "res": None if result is None else canonical_json(result)},
    ).mappings().first()
