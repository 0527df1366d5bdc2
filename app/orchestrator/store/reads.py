"""Read-only queries shaped as the API's Image / Job / Task documents (SPEC §6)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Connection, RowMapping

from app.db.enums import STAGE_ORDER, JobStatus, StageStatus
from app.orchestrator.store._sql import sql

_STAGE_POS = {s.value: n for n, s in enumerate(STAGE_ORDER)}
_DONE = (StageStatus.SUCCEEDED, StageStatus.REUSED)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def image_doc(row: RowMapping, latest: RowMapping | None) -> dict[str, Any]:
    return {
        "id": str(row["id"]), "display_name": row["display_name"], "sha256": row["sha256"],
        "media_type": row["media_type"], "size_bytes": row["size_bytes"], "width": row["width"],
        "height": row["height"], "context": row["context"], "context_status": row["context_status"],
        "metadata_hash": row["metadata_hash"], "revision": row["revision"],
        "created_at": _iso(row["created_at"]), "updated_at": _iso(row["updated_at"]),
        "latest_job": {"id": str(latest["id"]), "status": latest["status"]} if latest else None,
    }


# The image with its latest job's id and status, in one statement.
IMAGE = sql("""
SELECT i.*, lj.id AS lj_id, lj.status AS lj_status FROM images i
LEFT JOIN LATERAL (SELECT id, status FROM processing_jobs WHERE image_id = i.id ORDER BY revision DESC LIMIT 1) lj
  ON true
WHERE i.scope_id = :s AND i.id = :id
""")


def get_image_txn(conn: Connection, scope_id: str, image_id: uuid.UUID) -> dict[str, Any] | None:
    row = conn.execute(IMAGE, {"s": scope_id, "id": image_id}).mappings().first()
    if row is None:
        return None
    return image_doc(row, {"id": row["lj_id"], "status": row["lj_status"]} if row["lj_id"] else None)


def list_images_txn(
    conn: Connection, scope_id: str, after: tuple[datetime, uuid.UUID] | None, limit: int
) -> list[dict[str, Any]]:
    rows = conn.execute(
        sql(
            "SELECT i.*, lj.id AS lj_id, lj.status AS lj_status FROM images i"
            " LEFT JOIN LATERAL (SELECT id, status FROM processing_jobs WHERE image_id = i.id"
            " ORDER BY revision DESC LIMIT 1) lj ON true"
            " WHERE i.scope_id = :s AND (CAST(:ac AS timestamptz) IS NULL OR (i.created_at, i.id) > (:ac, :aid))"
            " ORDER BY i.created_at, i.id LIMIT :n"
        ),
        {"s": scope_id, "ac": after[0] if after else None, "aid": after[1] if after else None, "n": limit},
    ).mappings().all()
    return [image_doc(r, {"id": r["lj_id"], "status": r["lj_status"]} if r["lj_id"] else None) for r in rows]


def job_doc(row: RowMapping, stages: list[RowMapping]) -> dict[str, Any]:
    ordered = sorted(stages, key=lambda s: _STAGE_POS[s["stage"]])
    done = sum(1 for s in ordered if s["status"] in _DONE)
    progress = 1.0 if row["status"] == JobStatus.SUCCEEDED else round(done / len(STAGE_ORDER), 4)
    return {
        "id": str(row["id"]), "image_id": str(row["image_id"]), "revision": row["revision"], "status": row["status"],
        "mode": row["mode"], "reverse_image_policy": row["reverse_image_policy"], "image_sha256": row["image_sha256"],
        "current_stage": row["current_stage"], "progress": progress, "error": row["error"],
        "retry_at": _iso(row["retry_at"]), "batch_id": str(row["batch_id"]) if row["batch_id"] else None,
        "created_at": _iso(row["created_at"]), "updated_at": _iso(row["updated_at"]),
        "completed_at": _iso(row["completed_at"]),
        "stages": [
            {
                "stage": s["stage"], "status": s["status"], "task_id": str(s["task_id"]) if s["task_id"] else None,
                "attempt_count": s["attempt_count"], "error": s["error"], "retry_at": _iso(s["retry_at"]),
                "updated_at": _iso(s["updated_at"]),
            }
            for s in ordered
        ],
    }


# The job (the columns of its document) with its stages, one row per stage, in one statement.
JOB = sql("""
SELECT j.id, j.image_id, j.revision, j.status, j.mode, j.reverse_image_policy, j.image_sha256, j.current_stage,
       j.error, j.retry_at, j.batch_id, j.created_at, j.updated_at, j.completed_at,
       s.stage AS st_stage, s.status AS st_status, s.task_id AS st_task_id, s.attempt_count AS st_attempt_count,
       s.error AS st_error, s.retry_at AS st_retry_at, s.updated_at AS st_updated_at
FROM processing_jobs j LEFT JOIN job_stages s ON s.job_id = j.id
WHERE j.scope_id = :s AND j.id = :id
""")
_STAGE_COLUMNS = ("stage", "status", "task_id", "attempt_count", "error", "retry_at", "updated_at")


def get_job_txn(conn: Connection, scope_id: str, job_id: uuid.UUID) -> dict[str, Any] | None:
    rows = conn.execute(JOB, {"s": scope_id, "id": job_id}).mappings().all()
    if not rows:
        return None
    stages = [{c: r[f"st_{c}"] for c in _STAGE_COLUMNS} for r in rows if r["st_stage"] is not None]
    return job_doc(rows[0], stages)


def list_jobs_txn(
    conn: Connection, scope_id: str, *, status: str | None, image_id: uuid.UUID | None,
    after: tuple[datetime, uuid.UUID] | None, limit: int,
) -> list[dict[str, Any]]:
    rows = conn.execute(
        sql(
            "SELECT * FROM processing_jobs WHERE scope_id = :s"
            " AND (CAST(:st AS text) IS NULL OR status = :st) AND (CAST(:img AS uuid) IS NULL OR image_id = :img)"
            " AND (CAST(:ac AS timestamptz) IS NULL OR (created_at, id) > (:ac, :aid))"
            " ORDER BY created_at, id LIMIT :n"
        ),
        {"s": scope_id, "st": status, "img": image_id, "ac": after[0] if after else None,
         "aid": after[1] if after else None, "n": limit},
    ).mappings().all()
    if not rows:
        return []
    stages = conn.execute(
        sql("SELECT * FROM job_stages WHERE job_id = ANY(:ids)"), {"ids": [r["id"] for r in rows]}
    ).mappings().all()
    by_job: dict[uuid.UUID, list[RowMapping]] = {}
    for s in stages:
        by_job.setdefault(s["job_id"], []).append(s)
    return [job_doc(r, by_job.get(r["id"], [])) for r in rows]


def get_task_txn(conn: Connection, scope_id: str, task_id: uuid.UUID) -> dict[str, Any] | None:
    row = conn.execute(
        sql("SELECT * FROM tasks WHERE scope_id = :s AND id = :id"), {"s": scope_id, "id": task_id}
    ).mappings().first()
    if row is None:
        return None
    attempts = conn.execute(
        sql(
            "SELECT attempt_id, attempt_no, state, claim_generation, error, recall_safe, created_at, updated_at"
            " FROM task_attempts WHERE task_id = :t ORDER BY attempt_no"
        ),
        {"t": task_id},
    ).mappings().all()
    return {
        "id": str(row["id"]), "job_id": str(row["job_id"]), "image_id": str(row["image_id"]), "stage": row["stage"],
        "lane": row["lane"], "status": row["status"], "attempt_count": row["attempt_count"],
        "max_attempts": row["max_attempts"], "claim_generation": row["claim_generation"],
        "available_at": _iso(row["available_at"]), "cancel_requested": row["cancel_requested"],
        "error": row["error"], "result": row["result"], "created_at": _iso(row["created_at"]),
        "updated_at": _iso(row["updated_at"]), "started_at": _iso(row["started_at"]),
        "completed_at": _iso(row["completed_at"]),
        "attempts": [
            {"attempt_no": a["attempt_no"], "attempt_id": a["attempt_id"], "state": a["state"],
             "claim_generation": a["claim_generation"], "error": a["error"], "recall_safe": a["recall_safe"],
             "created_at": _iso(a["created_at"]), "updated_at": _iso(a["updated_at"])}
            for a in attempts
        ],
    }


# A list cursor's keyset position: (created_at, id) of the row it names, per listed table.
CURSOR_KEY = {
    "images": sql("SELECT created_at, id FROM images WHERE scope_id = :s AND id = :id"),
    "processing_jobs": sql("SELECT created_at, id FROM processing_jobs WHERE scope_id = :s AND id = :id"),
}


def cursor_key_txn(conn: Connection, table: str, scope_id: str, row_id: str) -> tuple[datetime, uuid.UUID] | None:
    """The keyset position of a page cursor naming ``row_id`` of ``table`` in the scope, or None."""
    if table not in CURSOR_KEY:
        raise ValueError(table)
    row = conn.execute(CURSOR_KEY[table], {"s": scope_id, "id": row_id}).first()
    return (row[0], row[1]) if row else None


def text_inputs_many_txn(conn: Connection, image_ids: list[uuid.UUID]) -> dict[uuid.UUID, RowMapping]:
    """What the semantic documents are rendered from, by image id (scope checked by the caller)."""
    rows = conn.execute(
        sql("SELECT id, scope_id, display_name, context, metadata_hash, sha256 FROM images WHERE id = ANY(:ids)"),
        {"ids": list(image_ids)},
    ).mappings()
    return {r["id"]: r for r in rows}


def lanes_active_txn(conn: Connection, lanes: list[str]) -> bool:
    """Whether a task of one of ``lanes`` is queued or running (each arm on its partial index:
    queued tasks by lane, running ones by lease — few)."""
    return bool(conn.execute(
        sql("SELECT EXISTS (SELECT 1 FROM tasks WHERE status = 'queued' AND lane = ANY(:lanes))"
            " OR EXISTS (SELECT 1 FROM tasks WHERE status = 'running' AND lane = ANY(:lanes))"),
        {"lanes": list(lanes)},
    ).scalar())


def lanes_pending_txn(conn: Connection, lanes: list[str]) -> tuple[bool, bool]:
    """(whether a task of one of ``lanes`` is queued, whether one is running): the two arms of
    :func:`lanes_active_txn`, each on its partial index."""
    queued, running = conn.execute(
        sql("SELECT EXISTS (SELECT 1 FROM tasks WHERE status = 'queued' AND lane = ANY(:lanes)),"
            " EXISTS (SELECT 1 FROM tasks WHERE status = 'running' AND lane = ANY(:lanes))"),
        {"lanes": list(lanes)},
    ).one()
    return bool(queued), bool(running)
