"""Processing jobs and their stages: create, lock, conditional status transitions."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Connection, RowMapping

from app.db.enums import STAGE_ORDER
from app.orchestrator.fingerprints import canonical_json
from app.orchestrator.store._sql import sql
from app.orchestrator.store.serving_fill import SERVING_TEXT_MISSING, SERVING_VISUAL_MISSING

ACTIVE = "('queued', 'running')"


def active_job_txn(conn: Connection, image_id: uuid.UUID) -> RowMapping | None:
    return (
        conn.execute(
            sql(f"SELECT * FROM processing_jobs WHERE image_id = :i AND status IN {ACTIVE} FOR UPDATE"),
            {"i": image_id},
        )
        .mappings()
        .first()
    )


def latest_job_txn(conn: Connection, image_id: uuid.UUID) -> RowMapping | None:
    return (
        conn.execute(
            sql("SELECT * FROM processing_jobs WHERE image_id = :i ORDER BY revision DESC LIMIT 1"), {"i": image_id}
        )
        .mappings()
        .first()
    )


def insert_job_txn(
    conn: Connection, *, scope_id: str, image_id: uuid.UUID, revision: int, image_sha256: str,
    config: dict[str, Any], config_hash: str, reverse_image_policy: str, mode: str, force_stages: Iterable[str],
    batch_id: uuid.UUID | None, now: datetime,
) -> RowMapping:
    """Insert a queued job and its three pending stages (the active-job index is the referee)."""
    job = (
        conn.execute(
            sql(
                "INSERT INTO processing_jobs (id, scope_id, image_id, revision, image_sha256, config, config_hash,"
                " reverse_image_policy, mode, force_stages, status, batch_id, created_at, updated_at)"
                " VALUES (:id, :s, :i, :rev, :sha, CAST(:cfg AS jsonb), :ch, :rip, :mode, :force, 'queued', :b,"
                " :now, :now) RETURNING *"
            ),
            {"id": uuid.uuid4(), "s": scope_id, "i": image_id, "rev": revision, "sha": image_sha256,
             "cfg": canonical_json(config), "ch": config_hash, "rip": reverse_image_policy, "mode": mode,
             "force": list(force_stages), "b": batch_id, "now": now},
        )
        .mappings()
        .one()
    )
    conn.execute(
        sql(
            "INSERT INTO job_stages (job_id, stage, scope_id, position, status, created_at, updated_at)"
            " VALUES (:j, :stage, :s, :pos, 'pending', :now, :now)"
        ),
        [{"j": job["id"], "stage": st.value, "s": scope_id, "pos": n, "now": now} for n, st in enumerate(STAGE_ORDER)],
    )
    return job


def lock_job_txn(conn: Connection, job_id: uuid.UUID, scope_id: str | None = None) -> RowMapping | None:
    statement = "SELECT * FROM processing_jobs WHERE id = :id" + (" AND scope_id = :s" if scope_id else "") + " FOR UPDATE"
    return conn.execute(sql(statement), {"id": job_id, "s": scope_id}).mappings().first()


def update_stage_txn(conn: Connection, job_id: uuid.UUID, stage: str, now: datetime, **fields: Any) -> None:
    sets = ", ".join(f"{k} = CAST(:{k} AS jsonb)" if k == "error" else f"{k} = :{k}" for k in fields)
    params = {k: (canonical_json(v) if k == "error" and v is not None else v) for k, v in fields.items()}
    conn.execute(
        sql(f"UPDATE job_stages SET {sets}, updated_at = :now WHERE job_id = :j AND stage = :stage"),
        {"j": job_id, "stage": stage, "now": now, **params},
    )


def set_stages_where_task_txn(
    conn: Connection, task_id: uuid.UUID, from_statuses: tuple[str, ...], now: datetime, **fields: Any
) -> list[uuid.UUID]:
    """Transition every stage that waits on ``task_id``; returns their job ids."""
    sets = ", ".join(f"{k} = CAST(:{k} AS jsonb)" if k == "error" else f"{k} = :{k}" for k in fields)
    params = {k: (canonical_json(v) if k == "error" and v is not None else v) for k, v in fields.items()}
    return list(
        conn.execute(
            sql(
                f"UPDATE job_stages SET {sets}, updated_at = :now WHERE task_id = :t AND status = ANY(:from_)"
                " RETURNING job_id"
            ),
            {"t": task_id, "from_": list(from_statuses), "now": now, **params},
        ).scalars()
    )


def update_job_txn(
    conn: Connection, job_id: uuid.UUID, now: datetime, *, from_statuses: tuple[str, ...] | None = None,
    **fields: Any,
) -> bool:
    """Conditional job update; False when the job is no longer in one of ``from_statuses``."""
    sets = ", ".join(f"{k} = CAST(:{k} AS jsonb)" if k == "error" else f"{k} = :{k}" for k in fields)
    params = {k: (canonical_json(v) if k == "error" and v is not None else v) for k, v in fields.items()}
    cond = " AND status = ANY(:from_)" if from_statuses else ""
    res = conn.execute(
        sql(f"UPDATE processing_jobs SET {sets}, updated_at = :now WHERE id = :id{cond}"),
        {"id": job_id, "now": now, "from_": list(from_statuses or ()), **params},
    )
    return res.rowcount > 0


def cancel_open_stages_txn(conn: Connection, job_id: uuid.UUID, status: str, now: datetime) -> None:
    conn.execute(
        sql(
            "UPDATE job_stages SET status = :st, updated_at = :now WHERE job_id = :j"
            " AND status IN ('pending', 'queued', 'running')"
        ),
        {"j": job_id, "st": status, "now": now},
    )


def agent_stage_in_progress_txn(conn: Connection, image_id: uuid.UUID) -> bool:
    return conn.execute(
        sql(
            "SELECT EXISTS (SELECT 1 FROM processing_jobs j JOIN job_stages s ON s.job_id = j.id"
            f" WHERE j.image_id = :i AND j.status IN {ACTIVE} AND s.stage = 'agent'"
            " AND s.status IN ('queued', 'running'))"
        ),
        {"i": image_id},
    ).scalar_one()


def image_ref_txn(conn: Connection, job_id: uuid.UUID) -> RowMapping | None:
    """(scope_id, image_id) of a job, unlocked: callers lock the image first, then the job."""
    return conn.execute(
        sql("SELECT scope_id, image_id FROM processing_jobs WHERE id = :id"), {"id": job_id}
    ).mappings().first()


def job_facts_many_txn(
    conn: Connection, items: list[tuple[uuid.UUID, str, str | None]]
) -> dict[uuid.UUID, RowMapping]:
    """Lock jobs (in id order) and read, in one statement, each one's stages (with their tasks'
    status) and whether the artifacts its frozen config needs exist for the given image version.

    ``items``: (job id, image sha256, image metadata_hash) — the image version to check against.
    """
    if not items:
        return {}
    doc = json.dumps([{"id": str(j), "sha": sha, "mh": mh} for j, sha, mh in items])
    rows = conn.execute(
        sql(
            "SELECT j.*,"
            " (SELECT json_agg(json_build_object('stage', s.stage, 'status', s.status, 'task_id', s.task_id,"
            "   'task_status', t.status)) FROM job_stages s LEFT JOIN tasks t ON t.id = s.task_id"
            "   WHERE s.job_id = j.id) AS stage_rows,"
            " EXISTS (SELECT 1 FROM visual_embeddings v WHERE v.scope_id = j.scope_id AND v.image_id = j.image_id"
            "   AND v.image_sha256 = r.sha AND v.model = j.config->'visual'->>'model'"
            "   AND v.preprocess_version = j.config->'visual'->>'preprocess_version'"
            "   AND v.dims = (j.config->'visual'->>'dims')::int)"
            f" AND NOT {SERVING_VISUAL_MISSING.format(scope='j.scope_id', image='j.image_id', sha='r.sha')}"
            " AS visual_exists,"
            " EXISTS (SELECT 1 FROM text_embeddings x WHERE x.scope_id = j.scope_id AND x.image_id = j.image_id"
            "   AND x.image_sha256 = r.sha AND x.metadata_hash = r.mh AND x.status = 'ready'"
            "   AND x.model = j.config->'text_embedding'->>'model'"
            "   AND x.dims = (j.config->'text_embedding'->>'dims')::int)"
            f" AND NOT {SERVING_TEXT_MISSING.format(scope='j.scope_id', image='j.image_id', sha='r.sha', mh='r.mh')}"
            " AS text_exists"
            " FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(id uuid, sha text, mh text)"
            " JOIN processing_jobs j ON j.id = r.id WHERE j.id = ANY(:ids) ORDER BY j.id FOR UPDATE OF j"
        ),
        {"rows": doc, "ids": [j for j, _, _ in items]},
    ).mappings().all()
    return {r["id"]: r for r in rows}


def complete_many_txn(conn: Connection, rows: list[tuple[uuid.UUID, str | None]], now: datetime) -> None:
    """Active jobs whose every stage is done → succeeded; ``rows``: (job id, metadata_hash to set
    on a job that has none yet, or None)."""
    if rows:
        conn.execute(
            sql(
                "UPDATE processing_jobs pj SET status = 'succeeded', current_stage = NULL, completed_at = :now,"
                " error = NULL, updated_at = :now, metadata_hash = coalesce(pj.metadata_hash, r.mh)"
                " FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(id uuid, mh text)"
                f" WHERE pj.id = r.id AND pj.id = ANY(:ids) AND pj.status IN {ACTIVE}"
            ),
            {"rows": json.dumps([{"id": str(j), "mh": mh} for j, mh in rows]), "ids": [j for j, _ in rows],
             "now": now},
        )
