"""Sweep queries: bounded (LIMIT) and driven by partial indexes, so their cost follows due work."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

from sqlalchemy import text
from sqlalchemy.engine import Connection, RowMapping

from app.orchestrator.store._sql import Outcome, sql, transition

SWEEP_LOCK_KEY = 0x6D656D65  # "meme": one sweep at a time across all beats and CLIs


def try_lock(conn: Connection) -> bool:
    return bool(conn.execute(sql("SELECT pg_try_advisory_lock(:k)"), {"k": SWEEP_LOCK_KEY}).scalar())


def unlock(conn: Connection) -> None:
    conn.execute(sql("SELECT pg_advisory_unlock(:k)"), {"k": SWEEP_LOCK_KEY})


#: The tables whose plans the hot paths cache (uploads, claims, completions, search's currency check).
HOT_TABLES = ("images", "processing_jobs", "job_stages", "tasks", "task_attempts", "operation_grants",
              "text_embeddings", "visual_embeddings")

GROWN_TABLES = sql("""
SELECT s.relname FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
WHERE s.schemaname = current_schema() AND s.relname = ANY(CAST(:tables AS text[]))
  AND s.n_mod_since_analyze >= greatest(:min_changes, :ratio * c.reltuples)
ORDER BY s.relname
""")


def grown_tables_txn(conn: Connection, min_changes: int, ratio: float) -> list[str]:
    """The HOT_TABLES with at least ``min_changes`` rows changed since their last analysis and at
    least ``ratio`` times the rows they held then (``reltuples``; -1, so no bound, if never analyzed).
    The counts are the statistics system's, which backends report about once a second."""
    return list(conn.execute(GROWN_TABLES, {"tables": list(HOT_TABLES), "min_changes": min_changes,
                                            "ratio": ratio}).scalars())


LOCK_TIMEOUT = sql("SELECT set_config('lock_timeout', :t, true)")


def analyze_table_txn(conn: Connection, table: str, lock_timeout_ms: int) -> None:
    """ANALYZE one of HOT_TABLES. It waits at most ``lock_timeout_ms`` for the table's
    SHARE UPDATE EXCLUSIVE lock (autovacuum's; writers are never blocked) and raises
    ``lock_not_available`` (55P03) past it. A role that does not own the table gets PostgreSQL's
    warning and nothing happens."""
    if table not in HOT_TABLES:
        raise ValueError(f"not a hot table: {table!r}")
    conn.execute(LOCK_TIMEOUT, {"t": f"{int(lock_timeout_ms)}ms"})
    conn.execute(text(f'ANALYZE "{table}"'))


REHINT = sql("""
UPDATE tasks SET last_hint_at = :now WHERE id IN (
  SELECT id FROM tasks WHERE status = 'queued'
    AND (last_hint_at IS NULL OR last_hint_at < :cutoff) AND available_at <= :now
  ORDER BY last_hint_at NULLS FIRST LIMIT :n FOR UPDATE SKIP LOCKED)
RETURNING id, lane, scope_id
""")


@transition
def due_for_rehint_txn(conn: Connection, now: datetime, grace_s: float, limit: int) -> Outcome[RowMapping]:
    """queued, due, last hint older than the grace (or never sent) → hinted now; ``rows``: (id, lane,
    scope_id) to re-hint. Not matched: every due task has a live hint."""
    return Outcome.of(conn.execute(
        REHINT, {"now": now, "cutoff": now - timedelta(seconds=grace_s), "n": limit},
    ).mappings().all())


# A cancel-requested task can never be claimed again (CLAIM requires NOT cancel_requested), so once
# its lease expired its worker is gone for good. If an open stage still waits on it (a later job of
# the image was deduplicated onto it) the request speaks for no one any more: it is withdrawn here
# and the task is an ordinary expired lease. Otherwise ``abandon`` is true and the caller ends it
# (tasks.end_abandoned_txn) right after this step commits, fenced on the execution seen here.
LEASE_EXPIRED = sql("""
WITH pick AS (SELECT id, cancel_requested AND NOT EXISTS (
                  SELECT 1 FROM job_stages js WHERE js.task_id = tasks.id AND js.status IN ('queued', 'running')
                ) AS abandon
              FROM tasks WHERE status = 'running' AND lease_expires_at < :now
                AND (last_hint_at IS NULL OR last_hint_at < :cutoff)
              ORDER BY lease_expires_at LIMIT :n FOR UPDATE SKIP LOCKED)
UPDATE tasks t SET last_hint_at = :now, cancel_requested = pick.abandon FROM pick WHERE t.id = pick.id
RETURNING t.id, t.lane, t.scope_id, t.job_id, t.stage, t.lease_owner, t.claim_generation,
          t.attempt_count, t.max_attempts, t.claimed_alone, t.image_id, t.image_sha256, t.payload, pick.abandon,
          t.error->>'code' AS noted_code
""")


@transition
def lease_expired_txn(conn: Connection, now: datetime, grace_s: float, limit: int) -> Outcome[RowMapping]:
    """running, lease expired (claimable again) → hinted now, at most once per grace. Not matched:
    no expired lease waits for a hint.

    ``abandon`` on a row: its job cancelled it and no open stage waits on it — never claimable
    again, the caller must end it (``tasks.end_abandoned_txn``). A cancel request some open stage
    still waits past is withdrawn (the row is then an ordinary expired lease)."""
    return Outcome.of(conn.execute(
        LEASE_EXPIRED, {"now": now, "cutoff": now - timedelta(seconds=grace_s), "n": limit},
    ).mappings().all())


def stuck_jobs_txn(conn: Connection, now: datetime, grace_s: float, limit: int, lookback_s: float,
                   skip: list | tuple = ()) -> list:
    """Active jobs whose current stage waits on a task that already finished (not those in ``skip``:
    found by an earlier round of the same sweep).

    Driven by recently finished tasks (``ix_tasks_finished``), not by the active jobs: with a
    million queued jobs the cost stays proportional to what finished in the look-back window.
    Every transition advances its job in the same transaction, so this only repairs anomalies
    (a task that failed or ended between a new job's dedupe read and its link's commit).

    The window reaches back ``lookback_s`` from now, or from the last completed sweep
    (``sweep_state``) when that is older: a task that finished while no sweep ran (beat down for
    longer than the look-back) is still seen by the first sweep after, not left behind for ever.
    """
    return list(
        conn.execute(
            sql(
                "SELECT DISTINCT j.id FROM tasks t"
                " JOIN job_stages s ON s.task_id = t.id"
                " JOIN processing_jobs j ON j.id = s.job_id AND j.current_stage = s.stage"
                "  AND j.status IN ('queued', 'running')"
                " WHERE t.status IN ('succeeded', 'failed', 'cancelled')"
                " AND t.completed_at >= least(:since, (SELECT last_success_at FROM sweep_state WHERE id = 1)"
                "  - make_interval(secs => :lookback))"
                " AND t.completed_at < :cutoff"
                " AND j.id <> ALL(CAST(:skip AS uuid[]))"
                " LIMIT :n"
            ),
            {"since": now - timedelta(seconds=lookback_s), "lookback": lookback_s,
             "cutoff": now - timedelta(seconds=grace_s), "n": limit, "skip": list(skip)},
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


def record_sweep_txn(conn: Connection, finished_at: datetime | None, duration_s: float, lane_gauges: dict,
                     failed_steps: list | None = None) -> None:
    """Remember the last completed sweep, the lane gauges it computed and the steps that raised
    (``[{step, error}]``; the single sweep_state row).

    ``finished_at=None`` = the database's clock, the one readers compare it with."""
    conn.execute(
        sql(
            "INSERT INTO sweep_state (id, last_success_at, duration_s, lane_gauges, failed_steps)"
            " VALUES (1, coalesce(CAST(:at AS timestamptz), now()), :duration, CAST(:gauges AS jsonb),"
            " CAST(:failed AS jsonb))"
            " ON CONFLICT (id) DO UPDATE SET last_success_at = EXCLUDED.last_success_at,"
            " duration_s = EXCLUDED.duration_s, lane_gauges = EXCLUDED.lane_gauges,"
            " failed_steps = EXCLUDED.failed_steps"
        ),
        {"at": finished_at, "duration": duration_s, "gauges": json.dumps(lane_gauges),
         "failed": json.dumps(failed_steps or [])},
    )


def sweep_state(conn: Connection) -> RowMapping | None:
    """(last_success_at, duration_s, lane_gauges, failed_steps) of the last completed sweep, or None
    before the first."""
    return conn.execute(
        sql("SELECT last_success_at, duration_s, lane_gauges, failed_steps FROM sweep_state WHERE id = 1")
    ).mappings().first()
