"""Retention statements (the sweep's pruning, app/orchestrator/retention.py).

Kept, whatever their age: an active job (queued/running) and every task, attempt and job stage it
has; a job that waits for a human (``blocked``, ``unknown_execution``) with its tasks and attempts;
every image's latest job; a task a job stage points at; an attempt whose outcome is open
(``prepared``, ``external_started``, ``unknown_execution``); jobs of a batch that is active or
ended within the retention age (created by it, or adopted as one of its items' jobs); an
operation grant that is ``acquired``, within the quota's day, or whose task is live; a batch
that is active, ended within the retention age, named by a search serving state, or that still has
an item or a job; and every image's current embeddings (current sha256, and metadata_hash for
text, of a configured model).

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
grow with the table (docs/performance-log.md §9). Picked rows are locked ``FOR UPDATE SKIP LOCKED``
(a row someone holds waits for the next pass) and everything goes by TID (``ctid = ANY(ARRAY(…))``:
a heap fetch of a page the step already read, no primary-key lookup — the keys are random, so at
5M rows those lookups missed the cache; a row updated meanwhile has a new TID and waits for the
next lap). Conditions on other tables are scalar subqueries — a primary-key or index lookup per row
read; as (NOT) EXISTS they become joins, which may read every active job or every image.
``ops_counters`` has no kept rows: its oldest buckets go first.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.engine import Connection, Row

from app.orchestrator.store._sql import Outcome, sql, transition

# Every walk step below has the same frame — ``scan``: the TIDs of heap pages [:lo, :hi);
# ``doomed``: up to :n of them that are old and no longer needed, locked SKIP LOCKED; ``gone``: their
# delete; the result: (rows read, rows deleted) — written out whole in each statement.

# Ended tasks no job stage points at (a retried stage's earlier tasks, tasks of a replaced job),
# except those of a job that is active or waits for a human and those with an attempt whose outcome
# is open (the delete would cascade to it). Probes: ix_job_stages_task, uq_task_attempts_task_id_attempt_no.
PRUNE_TASKS = sql("""
WITH scan AS MATERIALIZED (SELECT ctid AS k FROM tasks
                           WHERE ctid >= CAST(:lo AS tid) AND ctid < CAST(:hi AS tid)),
doomed AS (
  SELECT t.ctid AS k FROM tasks t
  WHERE t.ctid = ANY(ARRAY(SELECT k FROM scan))
    AND t.status IN ('succeeded', 'failed', 'cancelled') AND t.completed_at < :cutoff
    AND (SELECT true FROM job_stages s WHERE s.task_id = t.id LIMIT 1) IS NULL
    AND (SELECT true FROM task_attempts a WHERE a.task_id = t.id
         AND a.state IN ('prepared', 'external_started', 'unknown_execution') LIMIT 1) IS NULL
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
# one waiting for a human, one with a task still queued or running, one with a task another job's
# stage points at (dedupe links a newer job's stage to the running task of the one it replaced;
# ``job_stages.task_id`` has no FK, so the cascade would leave that stage pointing at nothing), one
# with an attempt whose outcome is open, or one of a batch that is active or ended within the age —
# whether the batch created it (``batch_id``) or adopted it as an item's job (``batch_items.job_id``,
# ix_batch_items_job: a batch over a processed library adopts each image's latest, long-ended job;
# the FK cascade would take the item, and the image would drop out of the batch's counts and total).
# The image's latest revision: its unique index, backwards; the task probes: ix_tasks_job, then
# ix_job_stages_task and uq_task_attempts_task_id_attempt_no per task.
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
    AND (SELECT true FROM tasks t JOIN job_stages s ON s.task_id = t.id
         WHERE t.job_id = j.id AND s.job_id <> j.id LIMIT 1) IS NULL
    AND (SELECT true FROM tasks t JOIN task_attempts a ON a.task_id = t.id
         WHERE t.job_id = j.id AND a.state IN ('prepared', 'external_started', 'unknown_execution') LIMIT 1) IS NULL
    AND (j.batch_id IS NULL OR (SELECT b.status IN ('completed', 'cancelled') AND b.updated_at < :cutoff
                                FROM batches b WHERE b.scope_id = j.scope_id AND b.id = j.batch_id))
    AND (SELECT true FROM batch_items bi JOIN batches b ON b.scope_id = bi.scope_id AND b.id = bi.batch_id
         WHERE bi.job_id = j.id AND NOT (b.status IN ('completed', 'cancelled') AND b.updated_at < :cutoff)
         LIMIT 1) IS NULL
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

# Ended operation grants (committed, released, unknown) older than the cutoff — which the caller
# keeps past any quota window (QuotaPolicy counts a UTC day's grants) — whose task is gone or ended
# under a job that is neither active nor waiting for a human, with no open attempt (an ``unknown``
# grant stays with its unknown_execution attempt). ``acquired`` grants are never pruned: a task holds
# or may still use them. The idempotency key is per job, so an ended job never asks for it again.
# Probes: the task by primary key (grants are bound both ways: ``task_id`` here, ``tasks.grant_id``),
# its job by primary key, uq_task_attempts_task_id_attempt_no.
PRUNE_GRANTS = sql("""
WITH scan AS MATERIALIZED (SELECT ctid AS k FROM operation_grants
                           WHERE ctid >= CAST(:lo AS tid) AND ctid < CAST(:hi AS tid)),
doomed AS (
  SELECT g.ctid AS k FROM operation_grants g
  WHERE g.ctid = ANY(ARRAY(SELECT k FROM scan))
    AND g.state IN ('committed', 'released', 'unknown') AND g.updated_at < :cutoff AND g.created_at < :cutoff
    AND coalesce((SELECT t.status IN ('succeeded', 'failed', 'cancelled')
                         AND coalesce((SELECT j.status FROM processing_jobs j WHERE j.id = t.job_id), 'gone')
                             NOT IN ('queued', 'running', 'blocked', 'unknown_execution')
                  FROM tasks t WHERE t.id = g.task_id), true)
    AND (SELECT true FROM task_attempts a WHERE a.task_id = g.task_id
         AND a.state IN ('prepared', 'external_started', 'unknown_execution') LIMIT 1) IS NULL
  LIMIT :n FOR UPDATE OF g SKIP LOCKED),
gone AS (DELETE FROM operation_grants WHERE ctid = ANY(ARRAY(SELECT k FROM doomed)) RETURNING 1)
SELECT (SELECT count(*) FROM scan) AS scanned, (SELECT count(*) FROM gone) AS deleted
""")

# The items of batches that ended (completed, cancelled) before the cutoff and that no search
# serving state still names (a model backfill's batch), except an item whose job is active or waits
# for a human (the batch keeps it). A batch deletes its items by FK cascade, all at once: a library's
# batch holds one per image, so they go here first, at most :n a step. The job a batch created keeps
# the batch's id (``batch_id``, an FK without cascade); it is cleared with the item (the job locked
# SKIP LOCKED: an item whose job is held waits for the next lap), so that the batch can go too.
# Probes: the batch and the jobs by primary key, pk_search_serving.
PRUNE_BATCH_ITEMS = sql("""
WITH scan AS MATERIALIZED (SELECT ctid AS k FROM batch_items
                           WHERE ctid >= CAST(:lo AS tid) AND ctid < CAST(:hi AS tid)),
picked AS (
  SELECT bi.ctid AS k, bi.batch_id, bi.job_id FROM batch_items bi
  WHERE bi.ctid = ANY(ARRAY(SELECT k FROM scan))
    AND (SELECT b.status IN ('completed', 'cancelled') AND b.updated_at < :cutoff
                AND (SELECT true FROM search_serving ss WHERE ss.scope_id = b.scope_id AND ss.batch_id = b.id
                     LIMIT 1) IS NULL
         FROM batches b WHERE b.id = bi.batch_id)
    AND coalesce((SELECT j.status FROM processing_jobs j WHERE j.id = bi.job_id), 'gone')
        NOT IN ('queued', 'running', 'blocked', 'unknown_execution')
  LIMIT :n FOR UPDATE OF bi SKIP LOCKED),
held AS (
  SELECT j.ctid AS k, j.id FROM processing_jobs j
  WHERE j.id = ANY(ARRAY(SELECT job_id FROM picked)) AND j.batch_id = ANY(ARRAY(SELECT batch_id FROM picked))
  FOR UPDATE OF j SKIP LOCKED),
detached AS (UPDATE processing_jobs SET batch_id = NULL WHERE ctid = ANY(ARRAY(SELECT k FROM held)) RETURNING id),
gone AS (
  DELETE FROM batch_items WHERE ctid = ANY(ARRAY(
    SELECT p.k FROM picked p
    WHERE p.job_id = ANY(ARRAY(SELECT id FROM held))  -- its job is detached by this statement
       OR (SELECT j.batch_id IS NOT DISTINCT FROM p.batch_id FROM processing_jobs j WHERE j.id = p.job_id)
          IS NOT TRUE))  -- no job, or one of another batch (an adopted job)
  RETURNING 1)
SELECT (SELECT count(*) FROM scan) AS scanned, (SELECT count(*) FROM gone) AS deleted,
       (SELECT count(*) FROM detached) AS detached
""")

# Batches that ended before the cutoff once nothing refers to them: no item left (the items walk
# takes them), no job of theirs (a job they created is detached with its item; one replaced
# meanwhile goes with the jobs walk), no search serving state naming them. Probes: pk_batch_items,
# ix_processing_jobs_batch, pk_search_serving.
PRUNE_BATCHES = sql("""
WITH scan AS MATERIALIZED (SELECT ctid AS k FROM batches
                           WHERE ctid >= CAST(:lo AS tid) AND ctid < CAST(:hi AS tid)),
doomed AS (
  SELECT b.ctid AS k FROM batches b
  WHERE b.ctid = ANY(ARRAY(SELECT k FROM scan))
    AND b.status IN ('completed', 'cancelled') AND b.updated_at < :cutoff
    AND (SELECT true FROM batch_items bi WHERE bi.batch_id = b.id LIMIT 1) IS NULL
    AND (SELECT true FROM processing_jobs j WHERE j.batch_id = b.id LIMIT 1) IS NULL
    AND (SELECT true FROM search_serving ss WHERE ss.scope_id = b.scope_id AND ss.batch_id = b.id LIMIT 1) IS NULL
  LIMIT :n FOR UPDATE OF b SKIP LOCKED),
gone AS (DELETE FROM batches WHERE ctid = ANY(ARRAY(SELECT k FROM doomed)) RETURNING 1)
SELECT (SELECT count(*) FROM scan) AS scanned, (SELECT count(*) FROM gone) AS deleted
""")

# Per-minute counter buckets, oldest first (primary key (bucket, name)); deleted by TID.
PRUNE_OPS_COUNTERS = sql("""
DELETE FROM ops_counters WHERE ctid = ANY(ARRAY(
  SELECT ctid FROM ops_counters WHERE bucket < :cutoff
  ORDER BY bucket LIMIT :n FOR UPDATE SKIP LOCKED))
""")

def _window(page: int, pages: int, n: int) -> dict[str, object]:
    """A walk step's bounds: heap pages [page, page + pages), up to ``n`` deletes."""
    return {"lo": f"({int(page)},0)", "hi": f"({int(page) + int(pages)},0)", "n": n}


def _step(row: Row) -> Outcome[Row]:
    """A walk step's outcome: matched when it deleted a row; ``row`` (scanned, deleted) either way."""
    return Outcome(int(row.deleted) > 0, (row,), int(row.deleted))


@transition
def prune_tasks_txn(conn: Connection, page: int, pages: int, n: int, *, cutoff: datetime | None) -> Outcome[Row]:
    """ended before ``cutoff``, no stage points at it, no open attempt, its job neither active nor
    waiting → deleted.

    One step of the tasks walk (heap pages [page, page + pages), at most ``n``); ``row``: (scanned,
    deleted). Not matched: nothing prunable in the window."""
    return _step(conn.execute(PRUNE_TASKS, {**_window(page, pages, n), "cutoff": cutoff}).one())


@transition
def prune_attempts_txn(conn: Connection, page: int, pages: int, n: int, *, cutoff: datetime | None) -> Outcome[Row]:
    """completed / failed before ``cutoff``, its task ended, its job neither active nor waiting → deleted.

    One step of the attempts walk, as ``prune_tasks_txn``."""
    return _step(conn.execute(PRUNE_ATTEMPTS, {**_window(page, pages, n), "cutoff": cutoff}).one())


@transition
def prune_jobs_txn(conn: Connection, page: int, pages: int, n: int, *, cutoff: datetime | None) -> Outcome[Row]:
    """ended before ``cutoff``, not its image's latest, no active task or batch, no task another job's
    stage points at, no open attempt → deleted (cascades).

    One step of the jobs walk, as ``prune_tasks_txn``."""
    return _step(conn.execute(PRUNE_JOBS, {**_window(page, pages, n), "cutoff": cutoff}).one())


@transition
def prune_text_embeddings_txn(
    conn: Connection, page: int, pages: int, n: int, *, stale_cutoff: datetime | None, model_cutoff: datetime | None,
    keep: list[str], keep_after: datetime,
) -> Outcome[Row]:
    """no longer current (an older image version, or a model no longer configured or served) → deleted.

    One step of the text embeddings walk, as ``prune_tasks_txn``; ``keep``: the configured models,
    ``keep_after``: the rollback window's start."""
    return _step(conn.execute(PRUNE_TEXT_EMBEDDINGS, {
        **_window(page, pages, n), "stale_cutoff": stale_cutoff, "model_cutoff": model_cutoff, "keep": keep,
        "keep_after": keep_after,
    }).one())


@transition
def prune_visual_embeddings_txn(
    conn: Connection, page: int, pages: int, n: int, *, stale_cutoff: datetime | None, model_cutoff: datetime | None,
    keep: list[str], keep_after: datetime,
) -> Outcome[Row]:
    """no longer current (an older image version, or a model no longer configured or served) → deleted.

    One step of the visual embeddings walk, as ``prune_text_embeddings_txn`` (``keep``:
    ``model|preprocess_version``)."""
    return _step(conn.execute(PRUNE_VISUAL_EMBEDDINGS, {
        **_window(page, pages, n), "stale_cutoff": stale_cutoff, "model_cutoff": model_cutoff, "keep": keep,
        "keep_after": keep_after,
    }).one())


@transition
def prune_grants_txn(conn: Connection, page: int, pages: int, n: int, *, cutoff: datetime | None) -> Outcome[Row]:
    """committed / released / unknown before ``cutoff``, its task gone or ended under a job neither
    active nor waiting, no open attempt → deleted.

    One step of the operation grants walk, as ``prune_tasks_txn``."""
    return _step(conn.execute(PRUNE_GRANTS, {**_window(page, pages, n), "cutoff": cutoff}).one())


@transition
def prune_batch_items_txn(conn: Connection, page: int, pages: int, n: int, *, cutoff: datetime | None
                          ) -> Outcome[Row]:
    """an item of a batch ended before ``cutoff`` that no serving state names, its job neither active
    nor waiting → deleted, and the job its batch created no longer names the batch (``batch_id`` NULL).

    One step of the batch items walk, as ``prune_tasks_txn``; ``row`` also has ``detached``."""
    return _step(conn.execute(PRUNE_BATCH_ITEMS, {**_window(page, pages, n), "cutoff": cutoff}).one())


@transition
def prune_batches_txn(conn: Connection, page: int, pages: int, n: int, *, cutoff: datetime | None) -> Outcome[Row]:
    """ended before ``cutoff``, no item, no job and no serving state refers to it → deleted.

    One step of the batches walk, as ``prune_tasks_txn``."""
    return _step(conn.execute(PRUNE_BATCHES, {**_window(page, pages, n), "cutoff": cutoff}).one())


# each walk's statement, step and table
WALKS = {
    "jobs": (PRUNE_JOBS, prune_jobs_txn, "processing_jobs"),
    "tasks": (PRUNE_TASKS, prune_tasks_txn, "tasks"),
    "attempts": (PRUNE_ATTEMPTS, prune_attempts_txn, "task_attempts"),
    "text_embeddings": (PRUNE_TEXT_EMBEDDINGS, prune_text_embeddings_txn, "text_embeddings"),
    "visual_embeddings": (PRUNE_VISUAL_EMBEDDINGS, prune_visual_embeddings_txn, "visual_embeddings"),
    "grants": (PRUNE_GRANTS, prune_grants_txn, "operation_grants"),
    "batch_items": (PRUNE_BATCH_ITEMS, prune_batch_items_txn, "batch_items"),
    "batches": (PRUNE_BATCHES, prune_batches_txn, "batches"),
}


def walk_step_txn(conn: Connection, kind: str, page: int, pages: int, n: int, **params: object) -> Outcome[Row]:
    """One step of ``kind``'s walk over heap pages ``[page, page + pages)`` (its ``prune_*_txn``).
    ``params``: ``cutoff`` for jobs, tasks, attempts, grants, batch items and batches; ``stale_cutoff``, ``model_cutoff``, ``keep``
    and ``keep_after`` (the rollback window's start) for the embeddings."""
    _statement, step, _table = WALKS[kind]
    return step(conn, page, pages, n, **params)


def table_pages_txn(conn: Connection, kind: str) -> tuple[int, float]:
    """(heap pages of ``kind``'s table now, rows per page by its last ANALYZE — 0 if never)."""
    row = conn.execute(sql(
        "SELECT pg_relation_size(c.oid) / current_setting('block_size')::int AS pages,"
        " CASE WHEN c.relpages > 0 AND c.reltuples > 0 THEN c.reltuples / c.relpages ELSE 0 END AS density"
        " FROM pg_class c WHERE c.oid = CAST(:t AS regclass)"), {"t": WALKS[kind][2]}).one()
    return int(row.pages), float(row.density)


@transition
def prune_ops_counters_txn(conn: Connection, cutoff: datetime, n: int) -> Outcome[None]:
    """a per-minute bucket older than ``cutoff`` → deleted: up to ``n``, oldest first; ``affected``:
    how many went. Not matched: none is that old."""
    return Outcome.count(conn.execute(PRUNE_OPS_COUNTERS, {"cutoff": cutoff, "n": n}).rowcount)


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
