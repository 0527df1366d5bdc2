"""Retention statements (the sweep's pruning, app/orchestrator/retention.py).

Kept, whatever their age: an active job (queued/running) and every task, attempt and job stage it
has; a job that waits for a human (``blocked``, ``unknown_execution``) with its tasks and attempts;
every image's latest job; a task a job stage points at; an attempt whose outcome is open
(``prepared``, ``external_started``, ``unknown_execution``); jobs of a batch that is active or
ended within the retention age; and every image's current embeddings (current sha256, and
metadata_hash for text, of a configured model).

Most old rows are of that kind (each image's latest job, its tasks, its current embeddings), so
"oldest first" would re-read all of them on every sweep. Instead each kind with kept rows is a
**walk** in physical order: one step reads the rows of the next heap pages ``[:lo, :hi)`` (a TID
range scan: ``ctid >= '(lo,0)' AND ctid < '(hi,0)'``, where the last step stopped —
``retention_walks``), deletes up to ``:n`` of them that are old and no longer needed, and the walk
starts over past the table's last page — the cost of a step is fixed. Physical order, not the
primary key: the keys are random UUIDs, so a key-order window is spread over the whole heap and
its deletes dirty a page per row (each a full-page image in the WAL after a checkpoint, 12–20 MB
per 1,000 jobs at 200k jobs); the pages of a physical window are contiguous (≈ 2 MB), and rows
written together (a job, its tasks, attempts) are deleted together, so the step's cost does not
grow with the table (docs/performance.md §9). Picked rows are locked ``FOR UPDATE SKIP LOCKED``
(a row someone holds waits for the next pass) and everything goes by TID (``ctid = ANY(ARRAY(…))``:
a heap fetch of a page the step already read, no primary-key lookup — the keys are random, so at
5M rows those lookups missed the cache; a row updated meanwhile has a new TID and waits for the
next lap). Conditions on other tables are scalar subqueries — a primary-key or index lookup per row
read; as (NOT) EXISTS they become joins, which may read every active job or every image.
``ops_counters`` has no kept rows: its oldest buckets go first.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.engine import Connection

from app.orchestrator.store._sql import sql

# Every walk step below has the same frame — ``scan``: the TIDs of heap pages [:lo, :hi);
# ``doomed``: up to :n of them that are old and no longer needed, locked SKIP LOCKED; ``gone``: their
# delete; the result: (rows read, rows deleted) — written out whole in each statement.

# Ended tasks no job stage points at (a retried stage's earlier tasks, tasks of a replaced job),
# except those of a job that is active or waits for a human.
PRUNE_TASKS = sql("""
WITH scan AS MATERIALIZED (SELECT ctid AS k FROM tasks
                           WHERE ctid >= CAST(:lo AS tid) AND ctid < CAST(:hi AS tid)),
doomed AS (
  SELECT t.ctid AS k FROM tasks t
  WHERE t.ctid = ANY(ARRAY(SELECT k FROM scan))
    AND t.status IN ('succeeded', 'failed', 'cancelled') AND t.completed_at < :cutoff
    AND (SELECT true FROM job_stages s WHERE s.task_id = t.id LIMIT 1) IS NULL
    AND (SELECT j.status FROM processing_jobs j WHERE j.id = t.job_id)
        NOT IN ('queued', 'running', 'blocked', 'unknown_execution')
  LIMIT :n FOR UPDATE OF t SKIP LOCKED),
gone AS (DELETE FROM tasks WHERE ctid = ANY(ARRAY(SELECT k FROM doomed)) RETURNING 1)
SELECT (SELECT count(*) FROM scan) AS scanned, (SELECT count(*) FROM gone) AS deleted
""")

# Completed or failed attempts of ended tasks, except under a job that is active or waits for a human.
PRUNE_ATTEMPTS = sql("""
WITH scan AS MATERIALIZED (SELECT ctid AS k FROM task_attempts
                           WHERE ctid >= CAST(:lo AS tid) AND ctid < CAST(:hi AS tid)),
doomed AS (
  SELECT a.ctid AS k FROM task_attempts a
  WHERE a.ctid = ANY(ARRAY(SELECT k FROM scan))
    AND a.state IN ('completed', 'failed') AND a.updated_at < :cutoff
    AND (SELECT t.status IN ('succeeded', 'failed', 'cancelled')
                AND j.status NOT IN ('queued', 'running', 'blocked', 'unknown_execution')
         FROM tasks t JOIN processing_jobs j ON j.id = t.job_id WHERE t.id = a.task_id)
  LIMIT :n FOR UPDATE OF a SKIP LOCKED),
gone AS (DELETE FROM task_attempts WHERE ctid = ANY(ARRAY(SELECT k FROM doomed)) RETURNING 1)
SELECT (SELECT count(*) FROM scan) AS scanned, (SELECT count(*) FROM gone) AS deleted
""")

# Ended jobs a newer job of the same image replaced (superseded, target_changed, and any other
# ended one that is not the latest), with their stages, tasks and attempts (FK cascades); never
# one waiting for a human, one with a task still queued or running, or one of a batch that is
# active or ended within the age. The image's latest revision: its unique index, backwards.
PRUNE_JOBS = sql("""
WITH scan AS MATERIALIZED (SELECT ctid AS k FROM processing_jobs
                           WHERE ctid >= CAST(:lo AS tid) AND ctid < CAST(:hi AS tid)),
doomed AS (
  SELECT j.ctid AS k FROM processing_jobs j
  WHERE j.ctid = ANY(ARRAY(SELECT k FROM scan))
    AND j.status IN ('succeeded', 'failed', 'target_changed', 'superseded', 'cancelled') AND j.completed_at < :cutoff
    AND j.revision < (SELECT max(n.revision) FROM processing_jobs n
                      WHERE n.scope_id = j.scope_id AND n.image_id = j.image_id)
    AND (SELECT true FROM tasks t WHERE t.job_id = j.id AND t.status IN ('queued', 'running') LIMIT 1) IS NULL
    AND (j.batch_id IS NULL OR (SELECT b.status IN ('completed', 'cancelled') AND b.updated_at < :cutoff
                                FROM batches b WHERE b.scope_id = j.scope_id AND b.id = j.batch_id))
  LIMIT :n FOR UPDATE OF j SKIP LOCKED),
gone AS (DELETE FROM processing_jobs WHERE ctid = ANY(ARRAY(SELECT k FROM doomed)) RETURNING 1)
SELECT (SELECT count(*) FROM scan) AS scanned, (SELECT count(*) FROM gone) AS deleted
""")

# Embeddings no longer current — an older image version (older than stale_cutoff) or a model that
# is no longer configured (older than model_cutoff; NULL = never). The image row is share-locked
# and the condition checked again on its latest version (a lateral subquery per pick; a locked
# image is skipped), so an image update that would make a picked row current again waits for this
# delete and then recomputes the row. A model a scope's search serving state (app/orchestrator/
# serving.py) names — serving, target, or previous within the rollback window (keep_after) or
# pinned — is never an old model for that scope. The old-model condition appears twice:
# the pick's flag and its filter.
PRUNE_TEXT_EMBEDDINGS = sql("""
WITH scan AS MATERIALIZED (SELECT ctid AS k FROM text_embeddings WHERE ctid >= CAST(:lo AS tid) AND ctid < CAST(:hi AS tid)),
picked AS (
  SELECT e.ctid AS c, e.scope_id, e.image_id, e.image_sha256, e.metadata_hash,
         coalesce((e.created_at < CAST(:model_cutoff AS timestamptz) AND e.model <> ALL(CAST(:keep AS text[]))
                   AND NOT EXISTS (SELECT 1 FROM search_serving ss WHERE ss.scope_id = e.scope_id AND ss.kind = 'text'
                                   AND (e.model = ss.serving_model OR e.model IS NOT DISTINCT FROM ss.target_model
                                        OR (e.model IS NOT DISTINCT FROM ss.previous_model
                                            AND (ss.state = 'pinned' OR ss.switched_at IS NULL
                                                 OR ss.switched_at >= CAST(:keep_after AS timestamptz)))))),
                  false) AS old_model
  FROM text_embeddings e
  WHERE e.ctid = ANY(ARRAY(SELECT k FROM scan))
    AND ((e.created_at < CAST(:stale_cutoff AS timestamptz)
          AND (SELECT i.sha256 <> e.image_sha256 OR i.metadata_hash IS DISTINCT FROM e.metadata_hash
               FROM images i WHERE i.scope_id = e.scope_id AND i.id = e.image_id))
      OR (e.created_at < CAST(:model_cutoff AS timestamptz) AND e.model <> ALL(CAST(:keep AS text[]))
          AND NOT EXISTS (SELECT 1 FROM search_serving ss WHERE ss.scope_id = e.scope_id AND ss.kind = 'text'
                          AND (e.model = ss.serving_model OR e.model IS NOT DISTINCT FROM ss.target_model
                               OR (e.model IS NOT DISTINCT FROM ss.previous_model
                                   AND (ss.state = 'pinned' OR ss.switched_at IS NULL
                                        OR ss.switched_at >= CAST(:keep_after AS timestamptz)))))))
  LIMIT :n),
doomed AS (
  SELECT p.c FROM picked p CROSS JOIN LATERAL (
    SELECT 1 FROM images i WHERE i.scope_id = p.scope_id AND i.id = p.image_id
      AND (p.old_model OR i.sha256 <> p.image_sha256 OR i.metadata_hash IS DISTINCT FROM p.metadata_hash)
    FOR SHARE SKIP LOCKED) held),
gone AS (DELETE FROM text_embeddings WHERE ctid = ANY(ARRAY(SELECT c FROM doomed)) RETURNING 1)
SELECT (SELECT count(*) FROM scan) AS scanned, (SELECT count(*) FROM gone) AS deleted
""")

# The same for visual embeddings; kept visual models are "model|preprocess_version", a serving
# state's model is (model, dims, preprocess version).
PRUNE_VISUAL_EMBEDDINGS = sql("""
WITH scan AS MATERIALIZED (SELECT ctid AS k FROM visual_embeddings WHERE ctid >= CAST(:lo AS tid) AND ctid < CAST(:hi AS tid)),
picked AS (
  SELECT e.ctid AS c, e.scope_id, e.image_id, e.image_sha256,
         coalesce((e.created_at < CAST(:model_cutoff AS timestamptz)
                   AND e.model || '|' || e.preprocess_version <> ALL(CAST(:keep AS text[]))
                   AND NOT EXISTS (SELECT 1 FROM search_serving ss WHERE ss.scope_id = e.scope_id AND ss.kind = 'visual'
                                   AND ((e.model, e.dims, e.preprocess_version) =
                                        (ss.serving_model, ss.serving_dims, ss.serving_ref->>'preprocess_version')
                                        OR (e.model, e.dims, e.preprocess_version) IS NOT DISTINCT FROM
                                        (ss.target_model, ss.target_dims, ss.target_ref->>'preprocess_version')
                                        OR ((e.model, e.dims, e.preprocess_version) IS NOT DISTINCT FROM
                                            (ss.previous_model, ss.previous_dims, ss.previous_ref->>'preprocess_version')
                                            AND (ss.state = 'pinned' OR ss.switched_at IS NULL
                                                 OR ss.switched_at >= CAST(:keep_after AS timestamptz)))))),
                  false) AS old_model
  FROM visual_embeddings e
  WHERE e.ctid = ANY(ARRAY(SELECT k FROM scan))
    AND ((e.created_at < CAST(:stale_cutoff AS timestamptz)
          AND (SELECT i.sha256 <> e.image_sha256 FROM images i WHERE i.scope_id = e.scope_id AND i.id = e.image_id))
      OR (e.created_at < CAST(:model_cutoff AS timestamptz)
          AND e.model || '|' || e.preprocess_version <> ALL(CAST(:keep AS text[]))
          AND NOT EXISTS (SELECT 1 FROM search_serving ss WHERE ss.scope_id = e.scope_id AND ss.kind = 'visual'
                          AND ((e.model, e.dims, e.preprocess_version) =
                               (ss.serving_model, ss.serving_dims, ss.serving_ref->>'preprocess_version')
                               OR (e.model, e.dims, e.preprocess_version) IS NOT DISTINCT FROM
                               (ss.target_model, ss.target_dims, ss.target_ref->>'preprocess_version')
                               OR ((e.model, e.dims, e.preprocess_version) IS NOT DISTINCT FROM
                                   (ss.previous_model, ss.previous_dims, ss.previous_ref->>'preprocess_version')
                                   AND (ss.state = 'pinned' OR ss.switched_at IS NULL
                                        OR ss.switched_at >= CAST(:keep_after AS timestamptz)))))))
  LIMIT :n),
doomed AS (
  SELECT p.c FROM picked p CROSS JOIN LATERAL (
    SELECT 1 FROM images i WHERE i.scope_id = p.scope_id AND i.id = p.image_id AND (p.old_model OR i.sha256 <> p.image_sha256)
    FOR SHARE SKIP LOCKED) held),
gone AS (DELETE FROM visual_embeddings WHERE ctid = ANY(ARRAY(SELECT c FROM doomed)) RETURNING 1)
SELECT (SELECT count(*) FROM scan) AS scanned, (SELECT count(*) FROM gone) AS deleted
""")

# Per-minute counter buckets, oldest first (primary key (bucket, name)); deleted by TID.
PRUNE_OPS_COUNTERS = sql("""
DELETE FROM ops_counters WHERE ctid = ANY(ARRAY(
  SELECT ctid FROM ops_counters WHERE bucket < :cutoff
  ORDER BY bucket LIMIT :n FOR UPDATE SKIP LOCKED))
""")

# each walk's statement and table
WALKS = {
    "jobs": (PRUNE_JOBS, "processing_jobs"),
    "tasks": (PRUNE_TASKS, "tasks"),
    "attempts": (PRUNE_ATTEMPTS, "task_attempts"),
    "text_embeddings": (PRUNE_TEXT_EMBEDDINGS, "text_embeddings"),
    "visual_embeddings": (PRUNE_VISUAL_EMBEDDINGS, "visual_embeddings"),
}


def walk_step_txn(conn: Connection, kind: str, page: int, pages: int, n: int, **params: object) -> tuple[int, int]:
    """One step of ``kind``'s walk over heap pages ``[page, page + pages)``: (rows read, rows deleted).
    ``params``: ``cutoff`` for jobs, tasks and attempts; ``stale_cutoff``, ``model_cutoff``, ``keep``
    and ``keep_after`` (the rollback window's start) for the embeddings."""
    statement, _table = WALKS[kind]
    row = conn.execute(statement, {"lo": f"({int(page)},0)", "hi": f"({int(page) + int(pages)},0)", "n": n,
                                        **params}).one()
    return int(row.scanned), int(row.deleted)


def table_pages_txn(conn: Connection, kind: str) -> tuple[int, float]:
    """(heap pages of ``kind``'s table now, rows per page by its last ANALYZE — 0 if never)."""
    row = conn.execute(sql(
        "SELECT pg_relation_size(c.oid) / current_setting('block_size')::int AS pages,"
        " CASE WHEN c.relpages > 0 AND c.reltuples > 0 THEN c.reltuples / c.relpages ELSE 0 END AS density"
        " FROM pg_class c WHERE c.oid = CAST(:t AS regclass)"), {"t": WALKS[kind][1]}).one()
    return int(row.pages), float(row.density)


def prune_ops_counters_txn(conn: Connection, cutoff: datetime, n: int) -> int:
    """Delete up to ``n`` ops_counters buckets older than ``cutoff``, oldest first; how many went."""
    return conn.execute(PRUNE_OPS_COUNTERS, {"cutoff": cutoff, "n": n}).rowcount


def walk_position_txn(conn: Connection, kind: str) -> int:
    """The heap page ``kind``'s walk resumes at (0 = the start; a key stored by the older key-order
    walk counts as the start)."""
    after = conn.execute(sql("SELECT after_key FROM retention_walks WHERE name = :k"), {"k": kind}).scalar()
    return int(after) if after and after.isdigit() else 0


def set_walk_position_txn(conn: Connection, kind: str, page: int) -> None:
    conn.execute(
        sql(
            "INSERT INTO retention_walks (name, after_key, updated_at) VALUES (:k, :a, now())"
            " ON CONFLICT (name) DO UPDATE SET after_key = EXCLUDED.after_key, updated_at = EXCLUDED.updated_at"
        ),
        {"k": kind, "a": str(int(page))},
    )


def walk_order_txn(conn: Connection, kinds: list[str]) -> list[str]:
    """``kinds`` least recently walked first (never walked: first, in the given order) — the turns
    of a sweep whose retention budget runs out before every kind had its steps."""
    seen = {r.name: r.updated_at for r in conn.execute(
        sql("SELECT name, updated_at FROM retention_walks WHERE name = ANY(:k)"), {"k": list(kinds)})}
    never = [k for k in kinds if k not in seen]
    return never + sorted((k for k in kinds if k in seen), key=lambda k: seen[k])


def touch_walk_txn(conn: Connection, kind: str) -> None:
    """Record that ``kind`` had its turn (a kind without a walk position: ops counters)."""
    conn.execute(
        sql(
            "INSERT INTO retention_walks (name, after_key, updated_at) VALUES (:k, NULL, now())"
            " ON CONFLICT (name) DO UPDATE SET updated_at = EXCLUDED.updated_at"
        ),
        {"k": kind},
    )
