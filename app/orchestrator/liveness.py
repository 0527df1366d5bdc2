"""Liveness you can see (SPEC §10 "Sweep"): which lanes have live workers, and how old the last
completed reconcile sweep is.

Worker processes register themselves (:func:`register_worker`, every
``MEMEFLOW_WORKER_REGISTRY_INTERVAL_S``); a registration counts as live for
:data:`TTL_FACTOR` intervals. The sweep records its completion time and the lane gauges it
computed. :func:`assess` is the pure decision — what is degraded, and why — that ``/readyz``,
``/ops``, ``/metrics`` and ``memeflow status`` all show; :func:`read_liveness` gathers its facts
with a few cheap queries (no count over the tasks table).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Connection, Engine

from app.config import Settings
from app.db.enums import Lane
from app.orchestrator import lane_limits
from app.orchestrator.store import sweep as sweep_q
from app.orchestrator.store import webhooks as webhooks_q
from app.orchestrator.store import workers as q

MAINTENANCE = "maintenance"
WEBHOOKS = "webhooks"
#: The queues a deployment must serve: the three lanes, the webhook deliveries (queued work there
#: is a subscription with an event due) and the sweep/batch-seeding queue.
SERVED_QUEUES: tuple[str, ...] = (*(lane.value for lane in Lane), WEBHOOKS, MAINTENANCE)
TTL_FACTOR = 3  # a registration is live for this many registry intervals
STALE_FACTOR = 3  # a sweep older than this many sweep intervals is stale


def worker_ttl_s(settings: Settings) -> float:
    """How long a registration stays live without a new heartbeat."""
    return TTL_FACTOR * float(settings.worker_registry_interval_s)


@dataclass(frozen=True)
class LaneLiveness:
    lane: str
    workers: int  # live workers consuming this queue
    queued: bool  # the lane holds queued tasks (webhooks: an event due; always False for maintenance)

    @property
    def unserved(self) -> bool:
        """Work is waiting and nobody would ever claim it."""
        return self.queued and self.workers == 0


@dataclass(frozen=True)
class Liveness:
    now: datetime
    lanes: dict[str, LaneLiveness]
    sweep_interval_s: float
    sweep_last_success_at: datetime | None = None
    sweep_duration_s: float | None = None
    lane_gauges: dict[str, dict[str, float]] = field(default_factory=dict)  # the last sweep's snapshot
    sweep_failed_steps: list[dict[str, str]] = field(default_factory=list)  # steps of the last sweep that raised
    # node -> the agent lane limits (lane, resource) each live agent worker registered
    agent_limits: dict[str, lane_limits.AgentLimits] = field(default_factory=dict)

    @property
    def agent_limits_in_force(self) -> lane_limits.AgentLimits | None:
        """The limits the live agent workers admit under (the most conservative); None: none registered."""
        if not self.agent_limits:
            return None
        first, *rest = self.agent_limits.values()
        return lane_limits.in_force(first, rest)

    @property
    def sweep_age_s(self) -> float | None:
        if self.sweep_last_success_at is None:
            return None
        return max((self.now - self.sweep_last_success_at).total_seconds(), 0.0)

    @property
    def sweep_stale(self) -> bool:
        """No sweep completed yet, or the last one is older than STALE_FACTOR intervals."""
        age = self.sweep_age_s
        return age is None or age > STALE_FACTOR * self.sweep_interval_s

    @property
    def reasons(self) -> list[dict[str, str]]:
        """Why the deployment is degraded (``[]`` when it is not), as ``{code, message}``."""
        out = []
        if self.sweep_stale:
            age = self.sweep_age_s
            out.append({"code": "sweep_stale", "message": (
                "no reconcile sweep has completed yet" if age is None else
                f"the last reconcile sweep completed {age:.0f}s ago (more than {STALE_FACTOR}x the "
                f"{self.sweep_interval_s:g}s interval): expired leases and lost hints are not being repaired")})
        for lane in self.lanes.values():
            if lane.unserved:
                out.append({"code": "lane_unserved",
                            "message": f"lane {lane.lane} has queued work and no live worker"})
        if lane_limits.disagreement(self.agent_limits):
            force = self.agent_limits_in_force
            out.append({"code": "lane_limits_disagree", "message": (
                "agent workers were given different agent lane limits (lane/resource, 0 = unlimited: "
                + ", ".join(f"{g['lane']}/{g['resource']} on {g['workers']}"
                            for g in lane_limits.given(self.agent_limits))
                + f"); all admit under the most conservative, "
                f"{force.lane}/{force.resource}: set MEMEFLOW_AGENT_LANE_LIMIT and MEMEFLOW_AGENT_RESOURCE_LIMIT "
                "alike on every agent worker")})
        return out

    @property
    def degraded(self) -> bool:
        return bool(self.reasons)

    def as_dict(self) -> dict[str, Any]:
        return {
            "status": "degraded" if self.degraded else "ok",
            "reasons": self.reasons,
            "sweep": {"last_success_at": at.isoformat() if (at := self.sweep_last_success_at) else None,
                      "age_s": round(self.sweep_age_s, 3) if self.sweep_age_s is not None else None,
                      "interval_s": self.sweep_interval_s, "stale": self.sweep_stale,
                      "failed_steps": self.sweep_failed_steps},
            "lanes": {name: {"workers": lane.workers, "queued": lane.queued, "unserved": lane.unserved}
                      for name, lane in self.lanes.items()},
            "agent_limits": {
                "in_force": force._asdict() if (force := self.agent_limits_in_force) else None,
                "disagree": lane_limits.disagreement(self.agent_limits),
                "given": lane_limits.given(self.agent_limits),
            },
        }


def assess(
    now: datetime, workers_per_lane: dict[str, int], queued_lanes: Iterable[str], sweep_row: Any | None,
    sweep_interval_s: float, agent_limits: dict[str, tuple[int, int]] | None = None,
) -> Liveness:
    """Pure: the liveness facts → what ``/readyz`` and ``/ops`` report."""
    queued = set(queued_lanes)
    lanes = {name: LaneLiveness(name, int(workers_per_lane.get(name, 0)), name in queued) for name in SERVED_QUEUES}
    return Liveness(
        now=now, lanes=lanes, sweep_interval_s=float(sweep_interval_s),
        sweep_last_success_at=sweep_row["last_success_at"] if sweep_row else None,
        sweep_duration_s=float(sweep_row["duration_s"]) if sweep_row else None,
        lane_gauges=dict(sweep_row["lane_gauges"] or {}) if sweep_row else {},
        sweep_failed_steps=list(sweep_row.get("failed_steps") or []) if sweep_row else [],
        agent_limits={node: lane_limits.AgentLimits(*v) for node, v in (agent_limits or {}).items()},
    )


def read_liveness_txn(conn: Connection, settings: Settings) -> Liveness:
    """The current liveness, on the database's clock (six small queries, none counting tasks)."""
    now = q.db_now(conn)
    queued = q.lanes_with_queued_work(conn, [lane.value for lane in Lane])
    if webhooks_q.has_due_txn(conn):
        queued.add(WEBHOOKS)
    ttl = worker_ttl_s(settings)
    return assess(
        now, q.live_workers_per_lane(conn, ttl, now), queued, sweep_q.sweep_state(conn),
        settings.sweep_interval_s, q.live_agent_limits(conn, ttl, now),
    )


def read_liveness(engine: Engine, settings: Settings) -> Liveness:
    with engine.connect() as conn:
        return read_liveness_txn(conn, settings)


# ---------------------------------------------------------------------------- worker side
@dataclass(frozen=True)
class WorkerIdentity:
    """Who a worker process is, as the registry records it."""

    node: str
    lanes: tuple[str, ...]
    started_at: datetime
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    # the agent lane limits this worker was given (lane, resource; 0 = unlimited), registered when
    # it serves the agent lane: the deployment admits under the most conservative (lane_limits.py)
    agent_limits: tuple[int, int] | None = None

    @classmethod
    def of(cls, settings: Settings, node: str, lanes: Iterable[str], started_at: datetime) -> WorkerIdentity:
        """A worker serving ``lanes``, with its agent lane limits when the agent lane is one of them."""
        lanes = tuple(lanes)
        limits = (int(settings.agent_slots), int(settings.agent_resource_limit)) if Lane.AGENT.value in lanes else None
        return cls(node=node, lanes=lanes, started_at=started_at, agent_limits=limits)


def register_worker(engine: Engine, worker: WorkerIdentity) -> None:
    """Upsert ``worker``'s registration with last_seen = now (its registry heartbeat)."""
    with engine.begin() as conn:
        lane_limit, resource_limit = worker.agent_limits or (None, None)
        q.upsert_worker_txn(conn, node=worker.node, host=worker.host, pid=worker.pid, lanes=worker.lanes,
                            started_at=worker.started_at, agent_lane_limit=lane_limit,
                            agent_resource_limit=resource_limit)


def deregister_worker(engine: Engine, worker: WorkerIdentity) -> bool:
    """Remove ``worker``'s registration on a clean shutdown (a kill leaves it to expire)."""
    with engine.begin() as conn:
        removed = q.remove_worker_txn(conn, node=worker.node, pid=worker.pid)
    return removed.matched  # not matched: a newer process owns the node name, or the row expired
