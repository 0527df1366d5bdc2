"""Batches and their items (SPEC §4.8): the snapshot target set, seeded page by page."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Connection, RowMapping

from app.db.enums import Lane
from app.ids import new_id
from app.orchestrator.fingerprints import canonical_json
from app.orchestrator.store._sql import Outcome, sql, transition

INSERT_BATCH = sql("""
INSERT INTO batches (id, scope_id, status, select_all, requested_ids, reverse_image_policy, seed_cursor, total,
                     fill_models, created_at, updated_at)
VALUES (:id, :s, 'seeding', :all, :ids, :p, CAST(:cur AS jsonb), :total, CAST(:fill AS jsonb), :now, :now)
RETURNING *
""")


@transition
def insert_batch_txn(
    conn: Connection, scope_id: str, *, select_all: bool, requested_ids: list[uuid.UUID] | None, policy: str,
    cursor: dict[str, Any], total: int, now: datetime, fill_models: list[dict[str, Any]] | None = None,
) -> Outcome[RowMapping]:
    """— → seeding: a batch with its snapshot target and the seed cursor at its start."""
    return Outcome.of(conn.execute(
        INSERT_BATCH,
        {"id": new_id(), "s": scope_id, "all": select_all, "ids": requested_ids, "p": policy,
         "cur": canonical_json(cursor), "total": total, "now": now,
         "fill": canonical_json(fill_models) if fill_models else None},
    ).mappings().all())


BATCH = sql("SELECT * FROM batches WHERE id = :id AND (CAST(:s AS text) IS NULL OR scope_id = :s)")
LOCK_BATCH = sql("SELECT * FROM batches WHERE id = :id AND (CAST(:s AS text) IS NULL OR scope_id = :s) FOR UPDATE")


def batch_txn(conn: Connection, batch_id: uuid.UUID, scope_id: str | None = None, *, lock: bool = False
              ) -> RowMapping | None:
    """Read (``lock``: lock) a batch, of ``scope_id`` when given; None when there is none."""
    return conn.execute(LOCK_BATCH if lock else BATCH, {"id": batch_id, "s": scope_id}).mappings().first()


def count_images_until_txn(conn: Connection, scope_id: str, until: datetime) -> int:
    return conn.execute(
        sql("SELECT count(*) FROM images WHERE scope_id = :s AND created_at <= :u"), {"s": scope_id, "u": until}
    ).scalar_one()


def missing_ids_txn(conn: Connection, scope_id: str, ids: list[uuid.UUID], limit: int) -> list[uuid.UUID]:
    """Up to ``limit`` of ``ids`` with no image in the scope: one statement over the whole list
    (an anti-join of the unnested array against the images' primary key), whatever its length."""
    return list(
        conn.execute(
            sql(
                "SELECT r.id FROM unnest(CAST(:ids AS uuid[])) WITH ORDINALITY AS r(id, n)"
                " WHERE NOT EXISTS (SELECT 1 FROM images i WHERE i.id = r.id AND i.scope_id = :s)"
                " ORDER BY r.n LIMIT :limit"
            ),
            {"s": scope_id, "ids": ids, "limit": limit},
        ).scalars()
    )


def image_page_txn(
    conn: Connection, scope_id: str, until: datetime, after: tuple[datetime, uuid.UUID] | None, n: int
) -> list[RowMapping]:
    """Next page of the scope's images in (created_at, id) order (keyset over ix_images_scope_page)."""
    return list(
        conn.execute(
            sql(
                "SELECT id, created_at FROM images WHERE scope_id = :s AND created_at <= :u"
                " AND (CAST(:ac AS timestamptz) IS NULL OR (created_at, id) > (:ac, :aid))"
                " ORDER BY created_at, id LIMIT :n"
            ),
            {"s": scope_id, "u": until, "ac": after[0] if after else None, "aid": after[1] if after else None,
             "n": n},
        ).mappings()
    )


def queued_backlog_txn(conn: Connection, scope_id: str, cap: int) -> int:
    """The scope's queued tasks, counted up to ``cap`` (a bounded scan of ix_tasks_lane_scope_due,
    one range per lane): back-pressure is per scope, so one scope's backlog never pauses another's
    batches."""
    return conn.execute(
        sql(
            "SELECT count(*) FROM (SELECT 1 FROM tasks WHERE lane = ANY(:lanes) AND scope_id = :s"
            " AND status = 'queued' LIMIT :cap) q"
        ),
        {"lanes": [lane.value for lane in Lane], "s": scope_id, "cap": cap},
    ).scalar_one()


def insert_items_txn(conn: Connection, rows: list[dict[str, Any]]) -> None:
    if rows:
        conn.execute(
            sql(
                "INSERT INTO batch_items (batch_id, image_id, scope_id, job_id, created_at)"
                " VALUES (:batch_id, :image_id, :scope_id, :job_id, :now) ON CONFLICT DO NOTHING"
            ),
            rows,
        )


RECORD_SEEDED_PAGE = sql("""
UPDATE batches SET seed_cursor = CAST(:cur AS jsonb), total = :total, updated_at = :now
WHERE id = :id AND status = 'seeding'
""")


@transition
def record_seeded_page_txn(conn: Connection, batch_id: uuid.UUID, cursor: dict[str, Any], total: int,
                           now: datetime) -> Outcome[None]:
    """seeding → seeding, the cursor past the page just seeded (and the total without vanished images)."""
    return Outcome.count(conn.execute(RECORD_SEEDED_PAGE, {
        "id": batch_id, "cur": canonical_json(cursor), "total": total, "now": now,
    }).rowcount)


# Once seeded, the items are the target set: the snapshot's count also held images deleted before
# their page came (a keyset page never sees them) and, for a fill, images covered meanwhile.
FINISH_SEEDING = sql("""
UPDATE batches SET status = 'running', seed_cursor = CAST(:cur AS jsonb),
       total = (SELECT count(*) FROM batch_items bi WHERE bi.batch_id = batches.id), updated_at = :now
WHERE id = :id AND status = 'seeding'
""")


@transition
def finish_seeding_txn(conn: Connection, batch_id: uuid.UUID, cursor: dict[str, Any], now: datetime) -> Outcome[None]:
    """seeding → running: the last page is seeded (in this transaction); the total becomes the items
    seeded. The batch completes when its item jobs are terminal."""
    return Outcome.count(conn.execute(FINISH_SEEDING, {
        "id": batch_id, "cur": canonical_json(cursor), "now": now,
    }).rowcount)


CANCEL_BATCH = sql("""
UPDATE batches SET status = 'cancelled', completed_at = :now, updated_at = :now, progress_open = true
WHERE id = :id AND status IN ('seeding', 'running')
""")


@transition
def cancel_batch_txn(conn: Connection, batch_id: uuid.UUID, now: datetime) -> Outcome[None]:
    """seeding / running → cancelled, progress open: seeding stops (its active jobs are cancelled
    page by page after; items may follow jobs it leaves running, so its counts are not final yet)."""
    return Outcome.count(conn.execute(CANCEL_BATCH, {"id": batch_id, "now": now}).rowcount)


# A cancelled batch's progress stays open while an item's job may still change (migration 0028):
# the sweep tells its counts again until they are final (no active item job).
SETTLE_CANCELLED_PROGRESS = sql("""
UPDATE batches SET progress_open = :open, updated_at = :now WHERE id = :id AND progress_open
""")


@transition
def settle_cancelled_progress_txn(conn: Connection, batch_id: uuid.UUID, still_open: bool, now: datetime
                                  ) -> Outcome[None]:
    """cancelled, progress open → open and touched (to the back of the sweep's round), or closed: its
    counts just told are final (terminal job statuses never change). Not matched: closed already."""
    return Outcome.count(conn.execute(
        SETTLE_CANCELLED_PROGRESS, {"id": batch_id, "open": still_open, "now": now}).rowcount)


def open_cancelled_batches_txn(conn: Connection, limit: int) -> list[uuid.UUID]:
    """Cancelled batches whose progress is still open, least recently touched first
    (ix_batches_progress_open): the sweep tells each one's counts until they are final."""
    return list(conn.execute(
        sql("SELECT id FROM batches WHERE progress_open ORDER BY updated_at LIMIT :n"), {"n": limit}).scalars())


# An image deleted after its page was seeded takes its item (and job) with it: the total is
# counted again, so a completed batch's progress is exactly 1.
COMPLETE_BATCH = sql("""
UPDATE batches SET status = 'completed', completed_at = :now, updated_at = :now,
       total = (SELECT count(*) FROM batch_items bi WHERE bi.batch_id = batches.id)
WHERE id = :id AND status = 'running'
""")


@transition
def complete_batch_txn(conn: Connection, batch_id: uuid.UUID, now: datetime) -> Outcome[None]:
    """running → completed: every item job is terminal; the total becomes the items left."""
    return Outcome.count(conn.execute(COMPLETE_BATCH, {"id": batch_id, "now": now}).rowcount)


def item_counts_txn(conn: Connection, batch_id: uuid.UUID) -> dict[str, int]:
    rows = conn.execute(
        sql(
            "SELECT j.status, count(*) FROM batch_items bi JOIN processing_jobs j ON j.id = bi.job_id"
            " WHERE bi.batch_id = :b GROUP BY j.status"
        ),
        {"b": batch_id},
    ).all()
    return {status: n for status, n in rows}


def has_active_item_jobs_txn(conn: Connection, batch_id: uuid.UUID) -> bool:
    return conn.execute(
        sql(
            "SELECT EXISTS (SELECT 1 FROM batch_items bi JOIN processing_jobs j ON j.id = bi.job_id"
            " WHERE bi.batch_id = :b AND j.status IN ('queued', 'running'))"
        ),
        {"b": batch_id},
    ).scalar_one()


# Active jobs the batch created (ix_processing_jobs_batch) that no item of another unfinished batch
# follows (ix_batch_items_job): a batch over the same images adopted them, and cancelling one batch
# must not end the other's items.
ACTIVE_BATCH_JOBS = sql("""
SELECT j.id FROM processing_jobs j
WHERE j.batch_id = :b AND j.status IN ('queued', 'running')
  AND NOT EXISTS (SELECT 1 FROM batch_items bi JOIN batches o ON o.scope_id = bi.scope_id AND o.id = bi.batch_id
                  WHERE bi.job_id = j.id AND bi.batch_id <> :b AND o.status IN ('seeding', 'running'))
LIMIT :n
""")


def active_batch_jobs_txn(conn: Connection, batch_id: uuid.UUID, n: int) -> list[uuid.UUID]:
    """Active jobs the batch created and no other unfinished batch follows, a page at a time."""
    return list(conn.execute(ACTIVE_BATCH_JOBS, {"b": batch_id, "n": n}).scalars())


FOLLOWED_BY_OTHER_BATCH = sql("""
SELECT EXISTS (SELECT 1 FROM batch_items bi JOIN batches o ON o.scope_id = bi.scope_id AND o.id = bi.batch_id
               WHERE bi.job_id = :j AND bi.batch_id <> :b AND o.status IN ('seeding', 'running'))
""")


def followed_by_other_batch_txn(conn: Connection, job_id: uuid.UUID, batch_id: uuid.UUID) -> bool:
    """Whether an item of an unfinished batch other than ``batch_id`` follows the job."""
    return bool(conn.execute(FOLLOWED_BY_OTHER_BATCH, {"j": job_id, "b": batch_id}).scalar_one())


def running_batches_txn(conn: Connection, limit: int) -> list[RowMapping]:
    """Running batches (seeded, not yet complete), least recently touched first (ix_batches_active).

    The sweep touches each one it checks and leaves running (``touch_batch_txn``), so successive
    sweeps walk the whole set: every running batch is checked within ceil(running / limit) sweeps."""
    return list(
        conn.execute(
            sql("SELECT id, status FROM batches WHERE status = 'running' ORDER BY updated_at LIMIT :n"),
            {"n": limit},
        ).mappings()
    )


COMPLETABLE_BATCHES = sql("""
SELECT b.id FROM batches b
WHERE b.status = 'running' AND NOT EXISTS (
  SELECT 1 FROM processing_jobs j WHERE j.batch_id = b.id AND j.batch_id IS NOT NULL
    AND j.status IN ('queued', 'running'))
ORDER BY b.updated_at LIMIT :n
""")


def completable_batches_txn(conn: Connection, limit: int) -> list[uuid.UUID]:
    """Running batches none of whose own jobs is active — the ones that may complete now — least
    recently touched first: ix_batches_active, one ix_processing_jobs_batch probe per running batch.

    A candidate, not a verdict: an item may follow an active job the batch did not create
    (``has_active_item_jobs_txn`` decides under the batch lock); such a batch is touched and goes
    to the back, so candidates like it never hold the window."""
    return list(conn.execute(COMPLETABLE_BATCHES, {"n": limit}).scalars())


TOUCH_BATCH = sql("""
UPDATE batches SET updated_at = :now WHERE id = :id AND status IN ('seeding', 'running')
""")


@transition
def touch_batch_txn(conn: Connection, batch_id: uuid.UUID, now: datetime) -> Outcome[None]:
    """seeding / running → same status, to the back of the sweep's round (least recently touched
    first): a batch the sweep checked and left as it was (paused by back-pressure, or not done)
    must not take the next sweep's turn again. Not matched: the batch finished meanwhile."""
    return Outcome.count(conn.execute(TOUCH_BATCH, {"id": batch_id, "now": now}).rowcount)


def seeding_heads_txn(conn: Connection, limit: int) -> list[RowMapping]:
    """Each scope's least recently touched seeding batch (ix_batches_seeding), least recently
    touched first: seeding round-robins over scopes, so one scope's paused batches never take
    another scope's turn — a head paused by back-pressure is touched (``touch_batch_txn``), so
    more paused scopes than ``limit`` rotate through the window instead of filling it for ever."""
    return list(
        conn.execute(
            sql(
                "SELECT id, scope_id FROM (SELECT DISTINCT ON (scope_id) id, scope_id, updated_at FROM batches"
                " WHERE status = 'seeding' ORDER BY scope_id, updated_at) h ORDER BY updated_at LIMIT :n"
            ),
            {"n": limit},
        ).mappings()
    )


MOVE_ITEM_TO_JOB = sql("""
UPDATE batch_items SET job_id = :new WHERE batch_id = :b AND job_id = :old
""")


def move_item_to_job_txn(conn: Connection, batch_id: uuid.UUID, old_job: uuid.UUID, new_job: uuid.UUID) -> Outcome[None]:
    """A batch item follows its image's job when that job is replanned under another configuration
    (its progress then counts the job that runs, not the superseded one)."""
    return Outcome.count(conn.execute(MOVE_ITEM_TO_JOB, {"b": batch_id, "old": old_job, "new": new_job}).rowcount)
