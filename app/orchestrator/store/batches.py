"""Batches and their items (SPEC §4.8): the snapshot target set, seeded page by page."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Connection, RowMapping

from app.db.enums import Lane
from app.orchestrator.fingerprints import canonical_json
from app.orchestrator.store._sql import sql

ACTIVE_JOB = "('queued', 'running')"


def insert_batch_txn(
    conn: Connection, scope_id: str, *, select_all: bool, requested_ids: list[uuid.UUID] | None, policy: str,
    cursor: dict[str, Any], total: int, now: datetime, fill_models: list[dict[str, Any]] | None = None,
) -> RowMapping:
    return conn.execute(
        sql(
            "INSERT INTO batches (id, scope_id, status, select_all, requested_ids, reverse_image_policy, seed_cursor,"
            " total, fill_models, created_at, updated_at) VALUES (:id, :s, 'seeding', :all, :ids, :p,"
            " CAST(:cur AS jsonb), :total, CAST(:fill AS jsonb), :now, :now) RETURNING *"
        ),
        {"id": uuid.uuid4(), "s": scope_id, "all": select_all, "ids": requested_ids, "p": policy,
         "cur": canonical_json(cursor), "total": total, "now": now,
         "fill": canonical_json(fill_models) if fill_models else None},
    ).mappings().one()


def batch_txn(conn: Connection, batch_id: uuid.UUID, scope_id: str | None = None, *, lock: bool = False
              ) -> RowMapping | None:
    statement = "SELECT * FROM batches WHERE id = :id" + (" AND scope_id = :s" if scope_id else "")
    statement += " FOR UPDATE" if lock else ""
    return conn.execute(sql(statement), {"id": batch_id, "s": scope_id}).mappings().first()


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


def update_batch_txn(conn: Connection, batch_id: uuid.UUID, now: datetime, *, from_statuses: tuple[str, ...],
                     **fields: Any) -> bool:
    sets = ", ".join(f"{k} = CAST(:{k} AS jsonb)" if k == "seed_cursor" else f"{k} = :{k}" for k in fields)
    params = {k: (canonical_json(v) if k == "seed_cursor" else v) for k, v in fields.items()}
    res = conn.execute(
        sql(f"UPDATE batches SET {sets}, updated_at = :now WHERE id = :id AND status = ANY(:from_)"),
        {"id": batch_id, "now": now, "from_": list(from_statuses), **params},
    )
    return res.rowcount > 0


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
            f" WHERE bi.batch_id = :b AND j.status IN {ACTIVE_JOB})"
        ),
        {"b": batch_id},
    ).scalar_one()


def active_batch_jobs_txn(conn: Connection, batch_id: uuid.UUID, n: int) -> list[uuid.UUID]:
    """Active jobs the batch created (ix_processing_jobs_batch), a page at a time."""
    return list(
        conn.execute(
            sql(f"SELECT id FROM processing_jobs WHERE batch_id = :b AND status IN {ACTIVE_JOB} LIMIT :n"),
            {"b": batch_id, "n": n},
        ).scalars()
    )


def running_batches_txn(conn: Connection, limit: int) -> list[RowMapping]:
    """Running batches (seeded, not yet complete), least recently touched first (ix_batches_active)."""
    return list(
        conn.execute(
            sql("SELECT id, status FROM batches WHERE status = 'running' ORDER BY updated_at LIMIT :n"),
            {"n": limit},
        ).mappings()
    )


def seeding_heads_txn(conn: Connection, limit: int) -> list[RowMapping]:
    """Each scope's least recently touched seeding batch (ix_batches_seeding), least recently
    touched first: seeding round-robins over scopes, so one scope's paused batches (back-pressure
    leaves them untouched, hence first in their scope) never take another scope's turn."""
    return list(
        conn.execute(
            sql(
                "SELECT id, scope_id FROM (SELECT DISTINCT ON (scope_id) id, scope_id, updated_at FROM batches"
                " WHERE status = 'seeding' ORDER BY scope_id, updated_at) h ORDER BY updated_at LIMIT :n"
            ),
            {"n": limit},
        ).mappings()
    )
