"""The worker registry (``worker_registry``): which worker processes are alive and what they serve.

Each worker process upserts its row on every registry heartbeat; a row whose ``last_seen`` is older
than the TTL no longer counts as live and the sweep prunes it. Times default to the database's
clock (``now()``), so workers on hosts with skewed clocks still agree; tests pass ``now``.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from sqlalchemy.engine import Connection, RowMapping

from app.orchestrator.store._sql import Outcome, sql, transition


def db_now(conn: Connection) -> datetime:
    """The database's clock (the one every registry time is written with)."""
    return conn.execute(sql("SELECT now()")).scalar_one()


def upsert_worker_txn(
    conn: Connection, *, node: str, host: str, pid: int, lanes: Iterable[str], started_at: datetime,
    now: datetime | None = None, agent_lane_limit: int | None = None, agent_resource_limit: int | None = None,
) -> None:
    """Record that ``node`` is alive now, serving ``lanes`` (a restarted node replaces its row), and
    the agent lane limits it was given (None: it does not serve the agent lane)."""
    conn.execute(
        sql(
            "INSERT INTO worker_registry (node, host, pid, lanes, started_at, last_seen, agent_lane_limit,"
            " agent_resource_limit)"
            " VALUES (:node, :host, :pid, :lanes, :started_at, coalesce(CAST(:now AS timestamptz), now()),"
            " :agent_lane_limit, :agent_resource_limit)"
            " ON CONFLICT (node) DO UPDATE SET host = EXCLUDED.host, pid = EXCLUDED.pid, lanes = EXCLUDED.lanes,"
            " started_at = EXCLUDED.started_at, last_seen = EXCLUDED.last_seen,"
            " agent_lane_limit = EXCLUDED.agent_lane_limit, agent_resource_limit = EXCLUDED.agent_resource_limit"
        ),
        {"node": node, "host": host, "pid": pid, "lanes": sorted(set(lanes)), "started_at": started_at, "now": now,
         "agent_lane_limit": agent_lane_limit, "agent_resource_limit": agent_resource_limit},
    )


REMOVE_WORKER = sql("DELETE FROM worker_registry WHERE node = :node AND pid = :pid")


@transition
def remove_worker_txn(conn: Connection, *, node: str, pid: int) -> Outcome[None]:
    """registered by this process → deleted (a clean shutdown). Not matched: a newer process took
    the node name (it keeps its row), or the row expired already."""
    return Outcome.count(conn.execute(REMOVE_WORKER, {"node": node, "pid": pid}).rowcount)


PRUNE_WORKERS = sql("""
DELETE FROM worker_registry WHERE last_seen < coalesce(CAST(:now AS timestamptz), now()) - make_interval(secs => :ttl)
""")


@transition
def prune_workers_txn(conn: Connection, ttl_s: float, now: datetime | None = None) -> Outcome[None]:
    """registered, not seen within ``ttl_s`` (the process died without a clean shutdown) → deleted;
    ``affected``: how many. Not matched: every registration is live."""
    return Outcome.count(conn.execute(PRUNE_WORKERS, {"now": now, "ttl": ttl_s}).rowcount)


def live_workers_per_lane(conn: Connection, ttl_s: float, now: datetime | None = None) -> dict[str, int]:
    """lane (queue) -> how many workers seen within ``ttl_s`` consume it (lanes without one are absent)."""
    rows = conn.execute(
        sql(
            "SELECT lane, count(*) AS n FROM worker_registry, unnest(lanes) AS lane"
            " WHERE last_seen >= coalesce(CAST(:now AS timestamptz), now()) - make_interval(secs => :ttl) GROUP BY lane"
        ),
        {"now": now, "ttl": ttl_s},
    )
    return {r.lane: int(r.n) for r in rows}


def live_workers(conn: Connection, ttl_s: float, now: datetime | None = None) -> list[RowMapping]:
    """The live workers (node, host, pid, lanes, started_at, last_seen, seen_ago_s), by node."""
    return list(
        conn.execute(
            sql(
                "SELECT node, host, pid, lanes, started_at, last_seen,"
                " extract(epoch FROM coalesce(CAST(:now AS timestamptz), now()) - last_seen) AS seen_ago_s"
                " FROM worker_registry"
                " WHERE last_seen >= coalesce(CAST(:now AS timestamptz), now()) - make_interval(secs => :ttl) ORDER BY node"
            ),
            {"now": now, "ttl": ttl_s},
        ).mappings()
    )


LIVE_AGENT_LIMITS = sql("""
SELECT node, agent_lane_limit, agent_resource_limit FROM worker_registry
WHERE 'agent' = ANY(lanes) AND agent_lane_limit IS NOT NULL AND agent_resource_limit IS NOT NULL
  AND last_seen >= coalesce(CAST(:now AS timestamptz), now()) - make_interval(secs => :ttl)
ORDER BY node
""")


def live_agent_limits(conn: Connection, ttl_s: float, now: datetime | None = None) -> dict[str, tuple[int, int]]:
    """node -> (agent lane limit, agent resource limit) each live agent-lane worker registered
    (workers of a release before migration 0031 register none and are absent)."""
    rows = conn.execute(LIVE_AGENT_LIMITS, {"now": now, "ttl": ttl_s})
    return {r.node: (int(r.agent_lane_limit), int(r.agent_resource_limit)) for r in rows}


def lanes_with_queued_work(conn: Connection, lanes: Iterable[str]) -> set[str]:
    """Which of ``lanes`` hold at least one queued task (one probe of ``ix_tasks_queued_due`` each)."""
    rows = conn.execute(
        sql(
            "SELECT l FROM unnest(CAST(:lanes AS text[])) AS l"
            " WHERE EXISTS (SELECT 1 FROM tasks t WHERE t.status = 'queued' AND t.lane = l)"
        ),
        {"lanes": list(lanes)},
    )
    return {r.l for r in rows}


SAMPLE_STORAGE_KEYS = sql("SELECT storage_key FROM images LIMIT :n")


def sample_storage_keys(conn: Connection, n: int) -> list[str]:
    """Up to ``n`` stored images' file keys (any; a worker checks at start that its storage holds them)."""
    return list(conn.execute(SAMPLE_STORAGE_KEYS, {"n": n}).scalars())
