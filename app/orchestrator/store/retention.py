"""Retention statements (the sweep's pruning, app/orchestrator/retention.py): each deletes at most
``:n`` rows of one kind, oldest first, picked through an index with ``FOR UPDATE SKIP LOCKED`` so a
row someone holds is left for a later sweep, then deleted by key (``= ANY(ARRAY(…))``: an index or
TID lookup per row, where ``IN (…)`` may become a hash join over the whole table). Each one's
WHERE clause names what it never touches.

Kept, whatever their age: an active job (queued/running) and every task, attempt and job stage it
has; a job that waits for a human (``blocked``, ``unknown_execution``) with its tasks and attempts;
every image's latest job; a task a job stage points at; an attempt whose outcome is open
(``prepared``, ``external_started``, ``unknown_execution``); jobs of a batch that is active or
ended within the retention age; and every image's current embeddings (current sha256, and
metadata_hash for text, of a configured model).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.engine import Connection

from app.orchestrator.store._sql import sql

# The conditions on other tables are scalar subqueries: per picked row, a primary-key or index
# lookup. (As NOT EXISTS they become anti-joins, which may read every active job or job stage.)

# Ended tasks no job stage points at (a retried stage's earlier tasks, tasks of a replaced job),
# except those of a job that is active or waits for a human. ix_tasks_finished.
PRUNE_TASKS = """
DELETE FROM tasks WHERE id = ANY(ARRAY(
  SELECT t.id FROM tasks t
  WHERE t.status IN ('succeeded', 'failed', 'cancelled') AND t.completed_at < :cutoff
    AND (SELECT true FROM job_stages s WHERE s.task_id = t.id LIMIT 1) IS NULL
    AND (SELECT j.status FROM processing_jobs j WHERE j.id = t.job_id)
        NOT IN ('queued', 'running', 'blocked', 'unknown_execution')
  ORDER BY t.completed_at LIMIT :n FOR UPDATE OF t SKIP LOCKED))
"""

# Completed or failed attempts of ended tasks, except under a job that waits for a human (or is
# active). ix_task_attempts_ended (migration 0016).
PRUNE_ATTEMPTS = """
DELETE FROM task_attempts WHERE attempt_id = ANY(ARRAY(
  SELECT a.attempt_id FROM task_attempts a
  WHERE a.state IN ('completed', 'failed') AND a.updated_at < :cutoff
    AND (SELECT t.status IN ('succeeded', 'failed', 'cancelled')
                AND j.status NOT IN ('queued', 'running', 'blocked', 'unknown_execution')
         FROM tasks t JOIN processing_jobs j ON j.id = t.job_id WHERE t.id = a.task_id)
  ORDER BY a.updated_at LIMIT :n FOR UPDATE OF a SKIP LOCKED))
"""

# Ended jobs a newer job of the same image replaced (superseded, target_changed, and any other
# ended one that is not the latest), with their stages, tasks and attempts (FK cascades); never
# one waiting for a human, one with a task still queued or running, or one of a batch that is
# active or ended within the age. ix_processing_jobs_ended (migration 0016).
PRUNE_JOBS = """
DELETE FROM processing_jobs WHERE id = ANY(ARRAY(
  SELECT j.id FROM processing_jobs j
  WHERE j.status IN ('succeeded', 'failed', 'target_changed', 'superseded', 'cancelled')
    AND j.completed_at < :cutoff
    AND j.revision < (SELECT max(n.revision) FROM processing_jobs n
                      WHERE n.scope_id = j.scope_id AND n.image_id = j.image_id)
    AND (SELECT true FROM tasks t WHERE t.job_id = j.id AND t.status IN ('queued', 'running') LIMIT 1) IS NULL
    AND (j.batch_id IS NULL OR (SELECT b.status IN ('completed', 'cancelled') AND b.updated_at < :cutoff
                                FROM batches b WHERE b.scope_id = j.scope_id AND b.id = j.batch_id))
  ORDER BY j.completed_at LIMIT :n FOR UPDATE OF j SKIP LOCKED))
"""

# Per-minute counter buckets (primary key (bucket, name)).
PRUNE_OPS_COUNTERS = """
DELETE FROM ops_counters WHERE ctid = ANY(ARRAY(
  SELECT ctid FROM ops_counters WHERE bucket < :cutoff
  ORDER BY bucket LIMIT :n FOR UPDATE SKIP LOCKED))
"""

# Embeddings walk: the next :scan rows by id after :after (primary key), of which up to :n are
# deleted when no longer current — an older image version (stale_cutoff) or a model that is no
# longer configured (model_cutoff; NULL = never) — and older than that age. Each pick's image row
# is then share-locked and the condition checked again on its latest version (a lateral subquery:
# one index lookup per pick; a locked image is skipped), so an image update that would make a
# picked row current again waits for this delete and then finds the row gone. Returns the last
# id seen.
PRUNE_TEXT_EMBEDDINGS = """
WITH scan AS (SELECT id FROM text_embeddings WHERE id > :after ORDER BY id LIMIT :scan),
picked AS (
  SELECT e.id, e.scope_id, e.image_id, e.image_sha256, e.metadata_hash,
    coalesce(e.created_at < CAST(:model_cutoff AS timestamptz) AND e.model <> ALL(CAST(:keep AS text[])), false)
      AS old_model
  FROM text_embeddings e
  WHERE e.id > :after AND e.id <= (SELECT max(id) FROM scan)
    AND ((e.created_at < CAST(:stale_cutoff AS timestamptz)
          AND (SELECT i.sha256 <> e.image_sha256 OR i.metadata_hash IS DISTINCT FROM e.metadata_hash
               FROM images i WHERE i.scope_id = e.scope_id AND i.id = e.image_id))
      OR (e.created_at < CAST(:model_cutoff AS timestamptz) AND e.model <> ALL(CAST(:keep AS text[]))))
  LIMIT :n),
doomed AS (
  SELECT p.id FROM picked p CROSS JOIN LATERAL (
    SELECT 1 FROM images i WHERE i.scope_id = p.scope_id AND i.id = p.image_id
      AND (p.old_model OR i.sha256 <> p.image_sha256 OR i.metadata_hash IS DISTINCT FROM p.metadata_hash)
    FOR SHARE SKIP LOCKED) held),
gone AS (DELETE FROM text_embeddings WHERE id = ANY(ARRAY(SELECT id FROM doomed)) RETURNING 1)
SELECT (SELECT max(id) FROM scan) AS last_id, (SELECT count(*) FROM scan) AS scanned,
  (SELECT count(*) FROM gone) AS deleted
"""

# The same walk over visual embeddings (current: the image's sha256; kept models: "model|preprocess").
PRUNE_VISUAL_EMBEDDINGS = """
WITH scan AS (SELECT id FROM visual_embeddings WHERE id > :after ORDER BY id LIMIT :scan),
picked AS (
  SELECT e.id, e.scope_id, e.image_id, e.image_sha256,
    coalesce(e.created_at < CAST(:model_cutoff AS timestamptz)
             AND e.model || '|' || e.preprocess_version <> ALL(CAST(:keep AS text[])), false) AS old_model
  FROM visual_embeddings e
  WHERE e.id > :after AND e.id <= (SELECT max(id) FROM scan)
    AND ((e.created_at < CAST(:stale_cutoff AS timestamptz)
          AND (SELECT i.sha256 <> e.image_sha256 FROM images i WHERE i.scope_id = e.scope_id AND i.id = e.image_id))
      OR (e.created_at < CAST(:model_cutoff AS timestamptz)
          AND e.model || '|' || e.preprocess_version <> ALL(CAST(:keep AS text[]))))
  LIMIT :n),
doomed AS (
  SELECT p.id FROM picked p CROSS JOIN LATERAL (
    SELECT 1 FROM images i WHERE i.scope_id = p.scope_id AND i.id = p.image_id
      AND (p.old_model OR i.sha256 <> p.image_sha256)
    FOR SHARE SKIP LOCKED) held),
gone AS (DELETE FROM visual_embeddings WHERE id = ANY(ARRAY(SELECT id FROM doomed)) RETURNING 1)
SELECT (SELECT max(id) FROM scan) AS last_id, (SELECT count(*) FROM scan) AS scanned,
  (SELECT count(*) FROM gone) AS deleted
"""

PRUNE = {"tasks": PRUNE_TASKS, "attempts": PRUNE_ATTEMPTS, "jobs": PRUNE_JOBS, "ops_counters": PRUNE_OPS_COUNTERS}
WALKS = {"text_embeddings": PRUNE_TEXT_EMBEDDINGS, "visual_embeddings": PRUNE_VISUAL_EMBEDDINGS}


def prune_txn(conn: Connection, kind: str, cutoff: datetime, n: int) -> int:
    """Delete up to ``n`` rows of ``kind`` (a key of PRUNE) older than ``cutoff``; how many went."""
    return conn.execute(sql(PRUNE[kind]), {"cutoff": cutoff, "n": n}).rowcount


def walk_embeddings_txn(
    conn: Connection, table: str, after: int, scan: int, n: int, *, stale_cutoff: datetime | None,
    model_cutoff: datetime | None, keep: list[str],
) -> tuple[int | None, int, int]:
    """One step of the embeddings walk of ``table``: (last id seen — None past the end —, rows
    seen, rows deleted)."""
    row = conn.execute(
        sql(WALKS[table]),
        {"after": after, "scan": scan, "n": n, "stale_cutoff": stale_cutoff, "model_cutoff": model_cutoff,
         "keep": keep},
    ).one()
    return (int(row.last_id) if row.last_id is not None else None), int(row.scanned), int(row.deleted)


def walk_position_txn(conn: Connection, table: str) -> int:
    """Where the embeddings walk of ``table`` resumes (the last id it saw; 0 = the start)."""
    value = conn.execute(sql("SELECT after_id FROM retention_walks WHERE name = :t"), {"t": table}).scalar()
    return int(value or 0)


def set_walk_position_txn(conn: Connection, table: str, after: int) -> None:
    conn.execute(
        sql(
            "INSERT INTO retention_walks (name, after_id, updated_at) VALUES (:t, :a, now())"
            " ON CONFLICT (name) DO UPDATE SET after_id = EXCLUDED.after_id, updated_at = EXCLUDED.updated_at"
        ),
        {"t": table, "a": after},
    )
