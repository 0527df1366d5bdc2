"""The agent lane's limits in force across the deployment (SPEC §4.10: a DB-wide limit).

The slots are DB-wide (``lane_slots``), but how many there are is each worker's own setting
(``MEMEFLOW_AGENT_LANE_LIMIT`` → ``Settings.agent_slots``, ``MEMEFLOW_AGENT_RESOURCE_LIMIT``). Two
agent workers given different values (a rolling change of the setting, a mistyped env on one host)
would each admit up to their own: the largest would win, and a worker with 0 (unlimited) would take
no slot at all — the paid provider's guard gone for the whole deployment.

So every agent-lane worker registers the limits it was given with its registry row
(``store.workers.upsert_worker_txn``), and every process admits under one value per limit: the most
conservative among the live agent workers' and its own (:func:`most_conservative`: the smallest
positive; unlimited only if all say 0). The registry is read at most once per registry interval
per process (:class:`LaneLimitCache`), on the caller's connection: a claim gains no statement in
the common case. A worker whose limit is lower than the rest admits under its own from its first
claim, and binds the others within one registry interval of its first heartbeat. A lowered limit
does not evict running holders of slots above it: their slots free as they end. Disagreement is
logged (WARNING, by each worker that sees it) and shown as the ``lane_limits_disagree`` reason of
``/readyz``, ``/ops`` and ``memeflow status`` (``liveness.Liveness.reasons``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import NamedTuple

from sqlalchemy.engine import Connection

from app.config import Settings
from app.orchestrator.store import workers as q

log = logging.getLogger(__name__)


class AgentLimits(NamedTuple):
    """The agent lane's global limit and its per resource key limit (0 = unlimited)."""

    lane: int
    resource: int


def own_limits(settings: Settings) -> AgentLimits:
    """The limits this process was configured with (what it registers when it serves the agent lane)."""
    return AgentLimits(int(settings.agent_slots), int(settings.agent_resource_limit))


def most_conservative(values: Iterable[int]) -> int:
    """Pure: the smallest positive limit of ``values``; 0 (unlimited) only if every one is 0."""
    positive = [v for v in values if v > 0]
    return min(positive) if positive else 0


def in_force(own: AgentLimits, registered: Iterable[AgentLimits]) -> AgentLimits:
    """Pure: the limits every agent worker admits under — per limit, the most conservative of this
    process's own and every live agent worker's."""
    every = [own, *registered]
    return AgentLimits(most_conservative(v.lane for v in every), most_conservative(v.resource for v in every))


def disagreement(registered: dict[str, AgentLimits]) -> bool:
    """Pure: do the live agent workers' registered limits differ?"""
    return len(set(registered.values())) > 1


def describe(registered: dict[str, AgentLimits]) -> str:
    """``node=lane/resource`` for each registered worker (0 = unlimited), for a log line or a reason."""
    return ", ".join(f"{node}={v.lane}/{v.resource}" for node, v in sorted(registered.items()))


def given(registered: dict[str, AgentLimits]) -> list[dict[str, int]]:
    """Pure: each distinct registered (lane, resource) and how many workers were given it, most
    conservative first — without node names (``/readyz`` and ``/ops`` show it; hosts are not theirs)."""
    counts: dict[AgentLimits, int] = {}
    for v in registered.values():
        counts[v] = counts.get(v, 0) + 1
    order = sorted(counts, key=lambda v: (v.lane or 2**31, v.resource or 2**31))
    return [{"lane": v.lane, "resource": v.resource, "workers": counts[v]} for v in order]


class LaneLimitCache:
    """One process's view of the limits in force, read from the registry at most once per
    ``settings.worker_registry_interval_s`` (thread-safe: an immutable snapshot is swapped in)."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._snapshot: tuple[float, AgentLimits, AgentLimits] | None = None  # (valid until, own, in force)
        self._warned: frozenset | None = None  # the disagreement last logged (logged again when it changes)
        self._lock = threading.Lock()

    def limits_txn(self, conn: Connection, settings: Settings) -> AgentLimits:
        """The agent lane limits in force; reads the registry on ``conn`` only when the cached
        value is older than the registry interval (or this process's own settings changed)."""
        snapshot = self._snapshot
        now = self._monotonic()
        own = own_limits(settings)
        if snapshot is not None and now < snapshot[0] and snapshot[1] == own:
            return snapshot[2]
        from app.orchestrator.liveness import worker_ttl_s  # liveness reports disagreement with this module

        registered = {node: AgentLimits(*v) for node, v in q.live_agent_limits(conn, worker_ttl_s(settings)).items()}
        limits = in_force(own, registered.values())
        self._snapshot = (now + float(settings.worker_registry_interval_s), own, limits)
        self._note(own, registered, limits)
        return limits

    def forget(self) -> None:
        """Read the registry again on the next use."""
        self._snapshot = None

    def _note(self, own: AgentLimits, registered: dict[str, AgentLimits], limits: AgentLimits) -> None:
        differ = disagreement(registered) or any(v != own for v in registered.values())
        seen = frozenset(registered.items()) | {("(this process)", own)} if differ else frozenset()
        with self._lock:
            if seen == self._warned or (not differ and self._warned is None):
                return
            self._warned = seen
        if differ:
            log.warning(
                "agent workers disagree on the agent lane limits (lane/resource, 0 = unlimited): %s; this "
                "process was given %s/%s; admitting under the most conservative: %s/%s",
                describe(registered), own.lane, own.resource, limits.lane, limits.resource,
                extra={"code": "lane_limits_disagree"})
        else:
            log.info("agent workers agree on the agent lane limits again: %s/%s", limits.lane, limits.resource)
