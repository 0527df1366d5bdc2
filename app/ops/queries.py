"""Read-only SQL behind the /ops page. Every query is filtered by scope: the page shows a tenant
its own work only (SPEC §2.6) — its own lane slots, counters, queued work and alarms. What is
the deployment's rather than any tenant's (the DB-wide slot limit, live workers per lane, the last
sweep's age) is shown as is; ``slots_in_use`` (every scope's) is for the operator's CLI
(``memeflow status``), never rendered on the page. Nothing here writes."""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.engine import Connection

from app.config import Settings
from app.db.enums import STAGE_ORDER, BatchStatus, JobStatus, Lane, StageStatus
from app.orchestrator.liveness import WEBHOOKS, LaneLiveness, Liveness, read_liveness_txn
from app.orchestrator.store.webhooks import has_due_in_scope_txn

NEEDS_HUMAN = (JobStatus.UNKNOWN_EXECUTION, JobStatus.BLOCKED, JobStatus.FAILED)
TERMINAL_JOB_STATUSES = tuple(s.value for s in JobStatus if s not in (JobStatus.QUEUED, JobStatus.RUNNING))


@dataclass
class LaneRow:
    lane: str
    queued: int = 0
    due: int = 0
    running: int = 0
    slots_scope: int = 0
    slots_in_use: int = 0  # held by every scope: the operator's CLI only, never a tenant's page
    slot_limit: int | None = None
    oldest_queued_age_s: float | None = None
    workers: int = 0  # live workers consuming this lane's queue (all scopes share them)
    unserved: bool = False  # this scope's queued work and no live worker: nothing will ever claim it


@dataclass
class BatchRow:
    id: uuid.UUID
    status: str
    total: int
    created_at: datetime
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def done(self) -> int:
        return sum(n for s, n in self.counts.items() if s in TERMINAL_JOB_STATUSES)

    @property
    def progress(self) -> float:
        return self.done / self.total if self.total else (1.0 if self.status == BatchStatus.COMPLETED else 0.0)


@dataclass
class Overview:
    scope_id: str
    now: datetime
    jobs_by_status: dict[str, int]
    funnel: dict[str, dict[str, int]]
    lanes: list[LaneRow]
    events_last_hour: dict[str, int]
    needs_human: list[dict[str, Any]]
    batches: list[BatchRow]
    recent_jobs: list[dict[str, Any]]
    liveness: Liveness | None = None
    webhooks: list[dict[str, Any]] = field(default_factory=list)
    webhook_failures: list[dict[str, Any]] = field(default_factory=list)
    serving: list[dict[str, Any]] | None = None  # the scope's search serving models and a model change's progress

    @property
    def total_jobs(self) -> int:
        return sum(self.jobs_by_status.values())


def _rows(conn: Connection, sql: str, **params: Any) -> list[dict[str, Any]]:
    return [dict(r._mapping) for r in conn.execute(text(sql), params)]


def jobs_by_status(conn: Connection, scope_id: str) -> dict[str, int]:
    """Count of every job (all revisions) per status, every status present (0 when none)."""
    counts = {s.value: 0 for s in JobStatus}
    for r in _rows(conn, "SELECT status, count(*) AS n FROM processing_jobs WHERE scope_id = :s GROUP BY status",
                   s=scope_id):
        counts[r["status"]] = int(r["n"])
    return counts


def stage_funnel(conn: Connection, scope_id: str) -> dict[str, dict[str, int]]:
    """stage -> stage status -> count, over every job's stages, stages in pipeline order.

    Reached through the scope's jobs (``ix_processing_jobs_scope_page``, then the stages' primary
    key): ``job_stages`` has no index on ``scope_id``, so filtering it directly read every tenant's
    stages on each refresh of a small tenant's page."""
    funnel = {st.value: {s.value: 0 for s in StageStatus} for st in STAGE_ORDER}
    for r in _rows(conn, """
        SELECT st.stage, st.status, count(*) AS n
          FROM processing_jobs j JOIN job_stages st ON st.job_id = j.id AND st.scope_id = j.scope_id
         WHERE j.scope_id = :s
         GROUP BY st.stage, st.status""", s=scope_id):
        funnel.setdefault(r["stage"], {})[r["status"]] = int(r["n"])
    return funnel


def lane_stats(conn: Connection, scope_id: str, slot_limits: dict[str, int | None]) -> list[LaneRow]:
    """Per lane: queued (and due now), running, lane slots held, oldest due queued task's wait."""
    lanes = {lane.value: LaneRow(lane.value, slot_limit=slot_limits.get(lane.value)) for lane in Lane}
    for r in _rows(conn, """
        SELECT lane,
               count(*) FILTER (WHERE status = 'queued') AS queued,
               count(*) FILTER (WHERE status = 'queued' AND available_at <= now()) AS due,
               count(*) FILTER (WHERE status = 'running') AS running,
               extract(epoch FROM now() - min(available_at)
                       FILTER (WHERE status = 'queued' AND available_at <= now())) AS oldest
          FROM tasks
         WHERE scope_id = :s AND status IN ('queued', 'running')
         GROUP BY lane""", s=scope_id):
        row = lanes.setdefault(r["lane"], LaneRow(r["lane"]))
        row.queued, row.due, row.running = int(r["queued"]), int(r["due"]), int(r["running"])
        row.oldest_queued_age_s = float(r["oldest"]) if r["oldest"] is not None else None
    for r in _rows(conn, """
        SELECT ls.lane,
               count(*) AS in_use,
               count(*) FILTER (WHERE t.scope_id = :s) AS mine
          FROM lane_slots ls LEFT JOIN tasks t ON t.id = ls.task_id
         WHERE ls.task_id IS NOT NULL
         GROUP BY ls.lane""", s=scope_id):
        row = lanes.setdefault(r["lane"], LaneRow(r["lane"]))
        row.slots_in_use, row.slots_scope = int(r["in_use"]), int(r["mine"])
    return list(lanes.values())


def events_last_hour(conn: Connection, scope_id: str,
                     names: tuple[str, ...] = ("fencing_rejection", "rehint")) -> dict[str, int]:
    """The scope's operational event counts summed over the per-minute buckets of the last hour."""
    counts = dict.fromkeys(names, 0)
    for r in _rows(conn, """
        SELECT name, coalesce(sum(count), 0) AS n FROM ops_counters
         WHERE bucket >= now() - interval '1 hour' AND name = ANY(:names) AND scope_id = :s
         GROUP BY name""", names=list(names), s=scope_id):
        counts[r["name"]] = int(r["n"])
    return counts


def needs_human(conn: Connection, scope_id: str, limit: int = 100) -> list[dict[str, Any]]:
    """Latest job of each image that ended unknown_execution / blocked / failed (awaiting a human)."""
    return _rows(conn, """
        SELECT j.id, j.image_id, j.revision, j.status, j.current_stage, j.error, j.retry_at, j.updated_at,
               i.display_name
          FROM processing_jobs j JOIN images i ON i.scope_id = j.scope_id AND i.id = j.image_id
         WHERE j.scope_id = :s AND j.status IN ('unknown_execution', 'blocked', 'failed')
           AND NOT EXISTS (SELECT 1 FROM processing_jobs n
                            WHERE n.scope_id = j.scope_id AND n.image_id = j.image_id AND n.revision > j.revision)
         ORDER BY CASE j.status WHEN 'unknown_execution' THEN 0 WHEN 'blocked' THEN 1 ELSE 2 END, j.updated_at DESC
         LIMIT :limit""", s=scope_id, limit=limit)


def batches(conn: Connection, scope_id: str, limit: int = 20) -> list[BatchRow]:
    """Most recent batches with exact per-status counts of their items' jobs."""
    rows = [BatchRow(r["id"], r["status"], int(r["total"]), r["created_at"]) for r in _rows(conn, """
        SELECT id, status, total, created_at FROM batches WHERE scope_id = :s
         ORDER BY created_at DESC LIMIT :limit""", s=scope_id, limit=limit)]
    if rows:
        by_id = {b.id: b for b in rows}
        for r in _rows(conn, """
            SELECT bi.batch_id, j.status, count(*) AS n
              FROM batch_items bi JOIN processing_jobs j ON j.scope_id = bi.scope_id AND j.id = bi.job_id
             WHERE bi.scope_id = :s AND bi.batch_id = ANY(:ids)
             GROUP BY bi.batch_id, j.status""", s=scope_id, ids=list(by_id)):
            by_id[r["batch_id"]].counts[r["status"]] = int(r["n"])
    return rows


def recent_jobs(conn: Connection, scope_id: str, limit: int = 15) -> list[dict[str, Any]]:
    """The most recently updated jobs, for navigation to the per-image page."""
    return _rows(conn, """
        SELECT j.id, j.image_id, j.revision, j.status, j.current_stage, j.updated_at, i.display_name
          FROM processing_jobs j JOIN images i ON i.scope_id = j.scope_id AND i.id = j.image_id
         WHERE j.scope_id = :s ORDER BY j.updated_at DESC, j.id LIMIT :limit""", s=scope_id, limit=limit)


def webhooks(conn: Connection, scope_id: str) -> list[dict[str, Any]]:
    """The scope's subscriptions with their delivery state (never the secret)."""
    return _rows(conn, """
        SELECT id, url, cursor, attempts, next_attempt_at, delivered_count, failed_count,
               last_error->>'code' AS last_error_code, last_delivery_at, lease_expires_at > now() AS delivering
          FROM webhook_subscriptions WHERE scope_id = :s ORDER BY created_at, id LIMIT 50""", s=scope_id)


def webhook_failures(conn: Connection, scope_id: str, limit: int = 20) -> list[dict[str, Any]]:
    """Events the delivery lane gave up on after its max attempts, newest first."""
    return _rows(conn, """
        SELECT f.subscription_id, f.event_id, f.attempts, f.error->>'code' AS code, f.error->>'message' AS message,
               f.failed_at, s.url
          FROM webhook_failures f JOIN webhook_subscriptions s ON s.id = f.subscription_id
         WHERE f.scope_id = :s ORDER BY f.failed_at DESC, f.id DESC LIMIT :limit""", s=scope_id, limit=limit)


def overview(
    engine: Engine, scope_id: str, slot_limits: dict[str, int | None], settings: Settings | None = None,
) -> Overview:
    """Everything the /ops page shows, read in one REPEATABLE READ snapshot so numbers agree.

    With ``settings``, also the deployment's liveness (live workers per lane, the last sweep's age),
    its alarms about queued work narrowed to this scope's (:func:`scope_liveness_txn`)."""
    with engine.connect() as conn:
        conn = conn.execution_options(isolation_level="REPEATABLE READ")
        with conn.begin():
            now = conn.execute(text("SELECT now()")).scalar_one()
            lanes = lane_stats(conn, scope_id, slot_limits)
            liveness = scope_liveness_txn(conn, settings, scope_id, lanes) if settings is not None else None
            if liveness is not None:
                force = liveness.agent_limits_in_force  # what the live agent workers admit under
                for row in lanes:
                    lane = liveness.lanes.get(row.lane)
                    if lane is not None:
                        row.workers, row.unserved = lane.workers, lane.unserved
                    if row.lane == "agent" and force is not None:
                        row.slot_limit = force.lane or None
            return Overview(
                scope_id=scope_id,
                now=now,
                jobs_by_status=jobs_by_status(conn, scope_id),
                funnel=stage_funnel(conn, scope_id),
                lanes=lanes,
                events_last_hour=events_last_hour(conn, scope_id),
                needs_human=needs_human(conn, scope_id),
                batches=batches(conn, scope_id),
                recent_jobs=recent_jobs(conn, scope_id),
                liveness=liveness,
                webhooks=webhooks(conn, scope_id),
                webhook_failures=webhook_failures(conn, scope_id),
                serving=search_serving(conn, scope_id),
            )


def scope_liveness_txn(conn: Connection, settings: Settings, scope_id: str, lanes: list[LaneRow]) -> Liveness:
    """The deployment's liveness as one scope may see it: the workers and the sweep as they are,
    but a lane counts as holding queued work only for this scope's (its tasks in ``lanes``, its
    webhook deliveries due) — another tenant's backlog is not this tenant's to know of."""
    live = read_liveness_txn(conn, settings)
    queued = {row.lane for row in lanes if row.queued}
    if has_due_in_scope_txn(conn, scope_id):
        queued.add(WEBHOOKS)
    return dataclasses.replace(live, lanes={name: LaneLiveness(name, lane.workers, name in queued)
                                            for name, lane in live.lanes.items()},
                               lane_gauges={})  # (the last sweep's queue depths: every scope's)


def search_serving(conn: Connection, scope_id: str) -> list[dict[str, Any]]:
    """The scope's search serving states (text, visual) with the live coverage of their serving and
    target models, and a model change's progress."""
    from app.orchestrator.serving_reads import describe_live_txn
    from app.orchestrator.store import serving as q

    out = []
    for row in q.all_serving_txn(conn, scope_id):
        doc = describe_live_txn(conn, row)
        if doc["target"]:
            cov = doc["target"]["coverage"]
            doc["target"]["progress"] = cov["ready"] / cov["total"] if cov["total"] else 1.0
        out.append(doc)
    return out


@dataclass
class ImageDetail:
    image: dict[str, Any]
    jobs: list[dict[str, Any]]
    stages: list[dict[str, Any]]
    tasks: list[dict[str, Any]]
    attempts: list[dict[str, Any]]


def image_detail(engine: Engine, scope_id: str, image_id: uuid.UUID) -> ImageDetail | None:
    """One image with its jobs, the latest job's stages, and the task/attempt timeline; None if absent."""
    with engine.connect() as conn:
        conn = conn.execution_options(isolation_level="REPEATABLE READ")
        with conn.begin():
            images = _rows(conn, """
                SELECT id, display_name, sha256, media_type, size_bytes, width, height, context, context_status,
                       context_provenance, metadata_hash, revision, created_at, updated_at
                  FROM images WHERE scope_id = :s AND id = :i""", s=scope_id, i=image_id)
            if not images:
                return None
            jobs = _rows(conn, """
                SELECT id, revision, status, mode, current_stage, error, retry_at, created_at, updated_at,
                       completed_at
                  FROM processing_jobs WHERE scope_id = :s AND image_id = :i ORDER BY revision DESC LIMIT 20""",
                         s=scope_id, i=image_id)
            stages = []
            if jobs:
                stages = _rows(conn, """
                    SELECT stage, position, status, task_id, attempt_count, error, retry_at, created_at, started_at,
                           completed_at, updated_at
                      FROM job_stages WHERE scope_id = :s AND job_id = :j ORDER BY position""",
                               s=scope_id, j=jobs[0]["id"])
            # the newest TIMELINE_ROWS (a long history must not hide the current failure), oldest first
            tasks = _rows(conn, """
                SELECT t.id, t.job_id, j.revision, t.stage, t.lane, t.status, t.attempt_count, t.claim_generation,
                       t.lease_owner, t.error, t.created_at, t.available_at, t.started_at, t.completed_at
                  FROM tasks t JOIN processing_jobs j ON j.scope_id = t.scope_id AND j.id = t.job_id
                 WHERE t.scope_id = :s AND t.image_id = :i ORDER BY t.created_at DESC, t.id DESC LIMIT :n""",
                          s=scope_id, i=image_id, n=TIMELINE_ROWS)
            attempts = _rows(conn, """
                SELECT a.attempt_id, a.task_id, a.attempt_no, a.claim_generation, a.state, a.provider_request_id,
                       a.error, a.created_at, a.updated_at
                  FROM task_attempts a JOIN tasks t ON t.scope_id = a.scope_id AND t.id = a.task_id
                 WHERE a.scope_id = :s AND t.image_id = :i ORDER BY a.created_at DESC, a.attempt_id DESC LIMIT :n""",
                             s=scope_id, i=image_id, n=TIMELINE_ROWS)
    return ImageDetail(images[0], jobs, stages, tasks[::-1], attempts[::-1])


#: Rows of the per-image page's task timeline and attempt list (the newest ones).
TIMELINE_ROWS = 200
