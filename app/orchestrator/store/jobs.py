"""Processing jobs and their stages: create, lock, conditional status transitions."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Connection, RowMapping

from app.db.enums import STAGE_ORDER
from app.db.jsoncodec import dumps
from app.ids import new_id
from app.orchestrator.fingerprints import canonical_json
from app.orchestrator.store._sql import Outcome, sql, transition

ACTIVE_JOB_OF_IMAGE = sql("""
SELECT * FROM processing_jobs WHERE image_id = :i AND status IN ('queued', 'running') FOR UPDATE
""")


def active_job_txn(conn: Connection, image_id: uuid.UUID) -> RowMapping | None:
    """Lock and read the image's active job (at most one: ``ix_processing_jobs_one_active``)."""
    return conn.execute(ACTIVE_JOB_OF_IMAGE, {"i": image_id}).mappings().first()


# (scope_id, image_id, revision) read backwards: scope_id leads the index (see EARLIER_JOB_ENDS)
LATEST_JOB_OF_IMAGE = sql(
    "SELECT * FROM processing_jobs WHERE scope_id = :s AND image_id = :i ORDER BY revision DESC LIMIT 1"
)


def latest_job_txn(conn: Connection, scope_id: str, image_id: uuid.UUID) -> RowMapping | None:
    """The image's newest job revision, unlocked."""
    return conn.execute(LATEST_JOB_OF_IMAGE, {"s": scope_id, "i": image_id}).mappings().first()


# The job and its pending stages (one per pipeline stage, in order) in one statement.
INSERT_JOB = sql("""
WITH j AS (
  INSERT INTO processing_jobs (id, scope_id, image_id, revision, image_sha256, config, config_hash,
                               reverse_image_policy, mode, force_stages, status, batch_id, created_at, updated_at)
  VALUES (:id, :s, :i, :rev, :sha, CAST(:cfg AS jsonb), :ch, :rip, :mode, :force, 'queued', :b, :now, :now)
  RETURNING *
), st AS (
  INSERT INTO job_stages (job_id, stage, scope_id, position, status, created_at, updated_at)
  SELECT j.id, s.stage, j.scope_id, s.n - 1, 'pending', :now, :now
  FROM j, unnest(CAST(:stages AS text[])) WITH ORDINALITY AS s(stage, n)
)
SELECT * FROM j
""")


@transition
def insert_job_txn(
    conn: Connection, *, scope_id: str, image_id: uuid.UUID, revision: int, image_sha256: str,
    config: dict[str, Any], config_hash: str, reverse_image_policy: str, mode: str, force_stages: Iterable[str],
    batch_id: uuid.UUID | None, now: datetime,
) -> Outcome[RowMapping]:
    """— → queued, a job and its three pending stages (the active-job index is the referee: a second raises).

    One statement; ``row``: the job as inserted."""
    job = conn.execute(INSERT_JOB, {
        "id": new_id(), "s": scope_id, "i": image_id, "rev": revision, "sha": image_sha256,
        "cfg": canonical_json(config), "ch": config_hash, "rip": reverse_image_policy, "mode": mode,
        "force": list(force_stages), "b": batch_id, "now": now, "stages": [st.value for st in STAGE_ORDER],
    }).mappings().one()
    return Outcome(True, (job,))


LOCK_JOB = sql("""
SELECT * FROM processing_jobs WHERE id = :id AND (CAST(:s AS text) IS NULL OR scope_id = :s) FOR UPDATE
""")


def lock_job_txn(conn: Connection, job_id: uuid.UUID, scope_id: str | None = None) -> RowMapping | None:
    """Lock a job (of ``scope_id``, when given) and read it; None when there is none."""
    return conn.execute(LOCK_JOB, {"id": job_id, "s": scope_id}).mappings().first()


# ---------------------------------------------------------------------------------------- stages
REUSE_STAGE = sql("""
UPDATE job_stages SET status = 'reused', input_fingerprint = :fp, completed_at = :now, error = NULL, updated_at = :now
WHERE job_id = :j AND stage = :stage AND status IN ('pending', 'queued', 'running')
""")


@transition
def reuse_stage_txn(conn: Connection, job_id: uuid.UUID, stage: str, fingerprint: str | None,
                    now: datetime) -> Outcome[None]:
    """pending / queued / running → reused: the stage's artifact is valid already. Not matched: it is done."""
    return Outcome.count(conn.execute(REUSE_STAGE, {"j": job_id, "stage": stage, "fp": fingerprint,
                                                    "now": now}).rowcount)


BLOCK_STAGE = sql("""
UPDATE job_stages SET status = 'blocked', error = CAST(:err AS jsonb), retry_at = :retry_at, input_fingerprint = :fp,
       updated_at = :now
WHERE job_id = :j AND stage = :stage AND status IN ('pending', 'queued', 'running', 'reused')
""")


@transition
def block_stage_txn(conn: Connection, job_id: uuid.UUID, stage: str, fingerprint: str, error: dict,
                    retry_at: datetime | None, now: datetime) -> Outcome[None]:
    """pending / queued / running / reused → blocked: the operation policy denied the stage's task."""
    return Outcome.count(conn.execute(BLOCK_STAGE, {
        "j": job_id, "stage": stage, "fp": fingerprint, "err": canonical_json(error), "retry_at": retry_at,
        "now": now,
    }).rowcount)


LINK_STAGE = sql("""
UPDATE job_stages SET status = :st, task_id = :t, input_fingerprint = :fp, error = NULL, retry_at = NULL,
       updated_at = :now
WHERE job_id = :j AND stage = :stage AND CAST(:st AS text) IN ('queued', 'running')
  AND status IN ('pending', 'queued', 'running', 'reused')
""")


@transition
def link_stage_txn(conn: Connection, job_id: uuid.UUID, stage: str, task_id: uuid.UUID, task_status: str,
                   fingerprint: str, now: datetime) -> Outcome[None]:
    """pending / queued / running / reused → queued / running: wait on an identical active task (dedupe)."""
    return Outcome.count(conn.execute(LINK_STAGE, {
        "j": job_id, "stage": stage, "t": task_id, "st": task_status, "fp": fingerprint, "now": now,
    }).rowcount)


REQUEUE_STAGES_OF_TASK = sql("""
UPDATE job_stages SET status = 'queued', error = CAST(:err AS jsonb), retry_at = :retry_at, attempt_count = :n,
       updated_at = :now
WHERE task_id = :t AND status IN ('queued', 'running')
RETURNING job_id
""")


@transition
def requeue_stages_of_task_txn(conn: Connection, task_id: uuid.UUID, error: dict, retry_at: datetime,
                               attempt_count: int, now: datetime) -> Outcome[uuid.UUID]:
    """queued / running → queued (retry_at = backoff), every stage waiting on a requeued task; rows = job ids."""
    return Outcome.of(conn.execute(REQUEUE_STAGES_OF_TASK, {
        "t": task_id, "err": canonical_json(error), "retry_at": retry_at, "n": attempt_count, "now": now,
    }).scalars().all())


END_STAGES_OF_TASK = sql("""
UPDATE job_stages SET status = :st, error = CAST(:err AS jsonb), completed_at = :now, attempt_count = :n,
       updated_at = :now
WHERE task_id = :t AND status IN ('queued', 'running') AND CAST(:st AS text) IN ('failed', 'unknown_execution')
RETURNING job_id
""")


@transition
def end_stages_of_task_txn(conn: Connection, task_id: uuid.UUID, status: str, error: dict, attempt_count: int,
                           now: datetime) -> Outcome[uuid.UUID]:
    """queued / running → failed / unknown_execution, every stage waiting on a failed task; rows = job ids."""
    return Outcome.of(conn.execute(END_STAGES_OF_TASK, {
        "t": task_id, "st": status, "err": canonical_json(error), "n": attempt_count, "now": now,
    }).scalars().all())


CANCEL_OPEN_STAGES = sql("""
UPDATE job_stages SET status = 'cancelled', updated_at = :now
WHERE job_id = :j AND status IN ('pending', 'queued', 'running')
""")


@transition
def cancel_open_stages_txn(conn: Connection, job_id: uuid.UUID, now: datetime) -> Outcome[None]:
    """pending / queued / running → cancelled, every open stage of an ending job. Not matched: none was open."""
    return Outcome.count(conn.execute(CANCEL_OPEN_STAGES, {"j": job_id, "now": now}).rowcount)


# ------------------------------------------------------------------------------------------ jobs
POINT_JOB = sql("""
UPDATE processing_jobs SET current_stage = :stage, metadata_hash = coalesce(:mh, metadata_hash), updated_at = :now
WHERE id = :id AND status IN ('queued', 'running')
""")


@transition
def point_job_txn(conn: Connection, job_id: uuid.UUID, stage: str, metadata_hash: str | None,
                  now: datetime) -> Outcome[None]:
    """queued / running → same status, current_stage = the stage it waits on (and a first metadata_hash)."""
    return Outcome.count(conn.execute(POINT_JOB, {"id": job_id, "stage": stage, "mh": metadata_hash,
                                                  "now": now}).rowcount)


BLOCK_JOB = sql("""
UPDATE processing_jobs SET status = 'blocked', error = CAST(:err AS jsonb), retry_at = :retry_at,
       current_stage = :stage, completed_at = :now, metadata_hash = coalesce(:mh, metadata_hash), updated_at = :now
WHERE id = :id AND status IN ('queued', 'running')
""")


@transition
def block_job_txn(conn: Connection, job_id: uuid.UUID, stage: str, error: dict, retry_at: datetime | None,
                  metadata_hash: str | None, now: datetime) -> Outcome[None]:
    """queued / running → blocked: the operation policy denied its next stage (the only road into blocked)."""
    return Outcome.count(conn.execute(BLOCK_JOB, {
        "id": job_id, "stage": stage, "err": canonical_json(error), "retry_at": retry_at, "mh": metadata_hash,
        "now": now,
    }).rowcount)


END_JOB = sql("""
UPDATE processing_jobs SET status = :st, error = CAST(:err AS jsonb), completed_at = :now, updated_at = :now
WHERE id = :id AND status IN ('queued', 'running')
  AND CAST(:st AS text) IN ('failed', 'unknown_execution', 'target_changed', 'superseded', 'cancelled')
""")


@transition
def end_job_txn(conn: Connection, job_id: uuid.UUID, status: str, error: dict, now: datetime) -> Outcome[None]:
    """queued / running → failed / unknown_execution / target_changed / superseded / cancelled, with its error."""
    return Outcome.count(conn.execute(END_JOB, {"id": job_id, "st": status, "err": canonical_json(error),
                                                "now": now}).rowcount)


AGENT_STAGE_IN_PROGRESS = sql("""
SELECT EXISTS (SELECT 1 FROM processing_jobs j JOIN job_stages s ON s.job_id = j.id
               WHERE j.image_id = :i AND j.status IN ('queued', 'running') AND s.stage = 'agent'
                 AND s.status IN ('queued', 'running'))
""")


def agent_stage_in_progress_txn(conn: Connection, image_id: uuid.UUID) -> bool:
    """Does an active job of the image have its agent stage queued or running?"""
    return conn.execute(AGENT_STAGE_IN_PROGRESS, {"i": image_id}).scalar_one()


IMAGE_REF_OF_JOB = sql("SELECT scope_id, image_id FROM processing_jobs WHERE id = :id")


def image_ref_txn(conn: Connection, job_id: uuid.UUID) -> RowMapping | None:
    """(scope_id, image_id) of a job, unlocked: callers lock the image first, then the job."""
    return conn.execute(IMAGE_REF_OF_JOB, {"id": job_id}).mappings().first()


COMPLETE_JOBS = sql("""
UPDATE processing_jobs pj SET status = 'succeeded', current_stage = NULL, completed_at = :now, error = NULL,
       updated_at = :now, metadata_hash = coalesce(pj.metadata_hash, r.mh)
FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(id uuid, mh text)
WHERE pj.id = r.id AND pj.id = ANY(:ids) AND pj.status IN ('queued', 'running')
RETURNING pj.id
""")


@transition
def complete_jobs_txn(conn: Connection, rows: list[tuple[uuid.UUID, str | None]], now: datetime) -> Outcome[uuid.UUID]:
    """queued / running → succeeded, N jobs whose every stage is done, in one statement.

    ``rows``: (job id, metadata_hash to set on a job that has none yet, or None). ``rows`` of the
    outcome: the jobs that ended."""
    if not rows:
        return Outcome(False)
    return Outcome.of(conn.execute(COMPLETE_JOBS, {
        "rows": dumps([{"id": str(j), "mh": mh} for j, mh in rows]), "ids": [j for j, _ in rows], "now": now,
    }).scalars().all())


# The image's newest ended revisions before ``:j`` (newest first): how many config replans in a row.
# scope_id leads the only full index over image_id (scope_id, image_id, revision): without it the
# statement scans every job of the library (PostgreSQL 17 cannot skip a leading column).
EARLIER_JOB_ENDS = sql("""
SELECT status, error->>'code' AS code FROM processing_jobs
WHERE scope_id = :s AND image_id = :i AND id <> :j AND status NOT IN ('queued', 'running') ORDER BY revision DESC LIMIT :n
""")


def config_replans_in_a_row_txn(
    conn: Connection, scope_id: str, image_id: uuid.UUID, job_id: uuid.UUID, limit: int
) -> int:
    """How many of the image's newest ended jobs before ``job_id`` (up to ``limit``) were, one
    after another, superseded for a stage configuration no worker that claimed them had."""
    count = 0
    for status, code in conn.execute(EARLIER_JOB_ENDS, {"s": scope_id, "i": image_id, "j": job_id, "n": limit}):
        if status != "superseded" or code != "provider_config_mismatch":
            break
        count += 1
    return count
