"""Sweep queries: bounded (LIMIT) and driven by partial indexes, so their cost follows due work."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy.engine import Connection, RowMapping

from app.orchestrator.store._sql import sql

SWEEP_LOCK_KEY = 0x6D656D65  # "meme": one sweep at a time across all beats and CLIs


def try_lock(conn: Connection) -> bool:
    return bool(conn.execute(sql("SELECT pg_try_advisory_lock(:k)"), {"k": SWEEP_LOCK_KEY}).scalar())


def unlock(conn: Connection) -> None:
    conn.execute(sql("SELECT pg_advisory_unlock(:k)"), {"k": SWEEP_LOCK_KEY})


def due_for_rehint_txn(conn: Connection, now: datetime, grace_s: float, limit: int) -> list[RowMapping]:
    """Queued, due tasks whose last hint is older than the grace period (or never sent)."""
    return list(
        conn.execute(
            sql(
                "UPDATE tasks SET last_hint_at = :now WHERE id IN ("
                " SELECT id FROM tasks WHERE status = 'queued'"
                " AND (last_hint_at IS NULL OR last_hint_at < :cutoff) AND available_at <= :now"
                " ORDER BY last_hint_at NULLS FIRST LIMIT :n FOR UPDATE SKIP LOCKED)"
                " RETURNING id, lane"
            ),
            {"now": now, "cutoff": now - timedelta(seconds=grace_s), "n": limit},
        ).mappings()
    )


def lease_expired_txn(conn: Connection, now: datetime, grace_s: float, limit: int) -> list[RowMapping]:
    """Running tasks whose lease expired (claimable again); re-hinted at most once per grace."""
    return list(
        conn.execute(
            sql(
                "WITH pick AS (SELECT id FROM tasks WHERE status = 'running' AND lease_expires_at < :now"
                " AND (last_hint_at IS NULL OR last_hint_at < :cutoff)"
                " ORDER BY lease_expires_at LIMIT :n FOR UPDATE SKIP LOCKED)"
                " UPDATE tasks t SET last_hint_at = :now FROM pick WHERE t.id = pick.id"
                " RETURNING t.id, t.lane, t.scope_id, t.job_id, t.stage, t.lease_owner, t.claim_generation,"
                " t.attempt_count, t.max_attempts, t.image_id, t.image_sha256, t.payload"
            ),
            {"now": now, "cutoff": now - timedelta(seconds=grace_s), "n": limit},
        ).mappings()
    )


def stuck_jobs_txn(conn: Connection, now: datetime, grace_s: float, limit: int) -> list:
    """Active jobs whose current stage has no live task (it finished, failed or vanished)."""
    return list(
        conn.execute(
            sql(
                "SELECT j.id FROM processing_jobs j"
                " LEFT JOIN job_stages s ON s.job_id = j.id AND s.stage = j.current_stage"
                " LEFT JOIN tasks t ON t.id = s.task_id"
                " WHERE j.status IN ('queued', 'running') AND j.updated_at < :cutoff"
                " AND (s.job_id IS NULL OR (s.status NOT IN ('queued', 'running'))"
                "  OR t.id IS NULL OR t.status NOT IN ('queued', 'running'))"
                " ORDER BY j.updated_at LIMIT :n"
            ),
            {"cutoff": now - timedelta(seconds=grace_s), "n": limit},
        ).scalars()
    )


def lane_gauges_txn(conn: Connection, now: datetime) -> list[RowMapping]:
    return list(
        conn.execute(
            sql(
                "SELECT lane, count(*) FILTER (WHERE status = 'queued') AS queued,"
                " count(*) FILTER (WHERE status = 'running') AS running,"
                " extract(epoch FROM :now - min(available_at) FILTER (WHERE status = 'queued'"
                "  AND available_at <= :now)) AS oldest_age"
                " FROM tasks WHERE status IN ('queued', 'running') GROUP BY lane"
            ),
            {"now": now},
        ).mappings()
    )
