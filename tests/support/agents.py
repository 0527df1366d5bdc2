"""Test doubles for the agent lane: an injectable clock, counting agents and a counting policy."""

from __future__ import annotations

import threading
import time
from collections import Counter
from datetime import datetime, timedelta

from sqlalchemy import text

from app.orchestrator import Orchestrator, RecordingPublisher
from app.orchestrator.policy import Denial, QuotaPolicy
from app.stages.agent.deterministic import DeterministicAgent
from app.stages.base import LookupResult
from app.stages.providers import Providers
from app.worker.run import handle_hint


class Clock:
    """A settable clock for Orchestrator(clock=…): tests jump time instead of sleeping."""

    def __init__(self, start: datetime):
        self.t = start
        self._lock = threading.Lock()

    def __call__(self) -> datetime:
        with self._lock:
            return self.t

    def advance(self, **delta: float) -> None:
        with self._lock:
            self.t += timedelta(**delta)


class CountingAgent(DeterministicAgent):
    """The deterministic agent, counting paid calls and lookups (optionally slowed down)."""

    def __init__(self, *, results_dir: str, delay_s: float = 0.0, **kw):
        super().__init__(results_dir=results_dir, **kw)
        self.delay_s = delay_s
        self.calls = Counter()
        self._lock = threading.Lock()

    def describe(self, image, *, attempt_id: str, reverse_image_policy: str):
        with self._lock:
            self.calls["describe"] += 1
        if self.delay_s:
            time.sleep(self.delay_s)  # simulated provider latency, so executions overlap
        return super().describe(image, attempt_id=attempt_id, reverse_image_policy=reverse_image_policy)

    def lookup(self, attempt_id: str, *, image=None):
        with self._lock:
            self.calls["lookup"] += 1
        return super().lookup(attempt_id, image=image)


class BlindAgent(CountingAgent):
    """An agent whose service cannot say what became of an earlier attempt."""

    def lookup(self, attempt_id: str, *, image=None):
        with self._lock:
            self.calls["lookup"] += 1
        return LookupResult(status="unknown")


class CountingPolicy(QuotaPolicy):
    """QuotaPolicy recording every acquire (by idempotency key) and commit (by grant id)."""

    def __init__(self, limit_per_day: int = 10**9):
        super().__init__(limit_per_day)
        self.acquired: Counter = Counter()
        self.committed: Counter = Counter()
        self.denied: list[Denial] = []
        self._lock = threading.Lock()

    def acquire(self, conn, scope_id, operation, idempotency_key, now):
        answer = super().acquire(conn, scope_id, operation, idempotency_key, now)
        with self._lock:
            if isinstance(answer, Denial):
                self.denied.append(answer)
            else:
                self.acquired[idempotency_key] += 1
        return answer

    def commit(self, conn, grant_id, now):
        with self._lock:
            self.committed[grant_id] += 1
        super().commit(conn, grant_id, now)


def providers_with(settings, agent) -> Providers:
    p = Providers(settings)
    p._cache["agent"] = agent
    return p


def step(orch: Orchestrator, providers: Providers, pub: RecordingPublisher, owner: str = "driver",
         stop_lane: str | None = None):
    """Run hints in this thread until none is left or a ``stop_lane`` hint comes up (returned)."""
    while True:
        hint = pub.take(timeout=0)
        if hint is None:
            return None
        if hint.lane == stop_lane:
            return hint
        handle_hint(orch, hint.lane, hint.task_id, owner, providers, pub)


def rows(engine, sql: str, **params):
    with engine.connect() as c:
        return c.execute(text(sql), params).all()
