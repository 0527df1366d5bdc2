"""Fair shares of an API process's threads among scopes (tenants).

A live event stream holds a request thread for minutes and a search for its embedding and ranking;
each kind is bounded per process (``event_streams_per_process``, ``searches_per_process``) so that
together they always leave threads for every other request. This module shares such a bound fairly:
a scope's *fair share* is ``capacity // scopes`` (at least 1), counting the scopes holding a share,
the scopes refused one in the last ``WANT_MEMORY_S`` and the asking scope.

* **Preemption** (streams): when the capacity is taken and a scope below its fair share asks, the
  oldest share of the scope holding the most (above its fair share) is told to yield (its ``stop``
  event is set: a stream ends at its next safe point, and its client resumes from its cursor), and
  the newcomer takes that share once it is given back (at most ``handoff_s`` later, else refused).
  So the process never runs more than ``capacity`` of them, and a scope holding none gets one
  whenever some scope holds more than one.
* **Waiting room** (searches, which cannot be interrupted): a scope refused for want of capacity is
  remembered for ``WANT_MEMORY_S``; while it holds less than its fair share, a scope at or above
  its own may not take a share that frees up: it is left for the refused one's retry.

Shares are this process's threads, so they live in its memory (nothing another process needs); the
DB-wide per-scope stream slots (:mod:`app.orchestrator.events`) are a separate bound.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from app.metrics import API_SHARE_REFUSALS, API_SHARE_YIELDS

#: How long a refused scope keeps its claim on the next free share (its client retries after
#: ``Retry-After: 1``).
WANT_MEMORY_S = 10.0

State = Literal["running", "yielding", "waiting"]


class ShareRefused(Exception):
    """No share for the scope now. ``why``: ``scope`` (its own per-scope bound) or ``process``
    (the process's capacity, fairly shared)."""

    def __init__(self, why: Literal["scope", "process"]) -> None:
        super().__init__(why)
        self.why = why


@dataclass(eq=False)
class Share:
    """One share held by a request of ``scope``; ``release`` it exactly once (later calls: no-op)."""

    scope: str
    seq: int
    state: State
    pool: FairShares
    stop: threading.Event = field(default_factory=threading.Event)  # set: yield the share soon

    def release(self) -> None:
        self.pool._release(self)


class FairShares:
    """A per-process pool of shares of one kind (streams or searches), shared fairly by scope."""

    def __init__(self, kind: str = "shares", clock: Callable[[], float] = time.monotonic) -> None:
        self.kind = kind  # the metrics' label: streams | searches
        self._cond = threading.Condition()
        self._shares: list[Share] = []  # in the order they were granted (the oldest first)
        self._wanting: dict[str, float] = {}  # scope -> when it was last refused for capacity
        self._seq = itertools.count()
        self._clock = clock

    def held(self) -> int:
        """Shares whose request still holds its thread (running or yielding)."""
        with self._cond:
            return sum(1 for s in self._shares if s.state != "waiting")

    def by_scope(self) -> dict[str, int]:
        """Shares each scope holds or is being handed (a yielding share no longer counts)."""
        with self._cond:
            return self._counts()

    def acquire(self, scope: str, capacity: int, *, per_scope: int | None = None, preempt: bool = False,
                handoff_s: float = 0.0) -> Share:
        """A share for ``scope``, or :class:`ShareRefused`. ``preempt``: when the capacity is taken
        and the scope is below its fair share, make the oldest share of the scope holding the most
        yield, and wait up to ``handoff_s`` for it."""
        try:
            return self._acquire(scope, capacity, per_scope, preempt, handoff_s)
        except ShareRefused as exc:
            API_SHARE_REFUSALS.labels(kind=self.kind, why=exc.why).inc()
            raise

    def _acquire(self, scope: str, capacity: int, per_scope: int | None, preempt: bool, handoff_s: float) -> Share:
        with self._cond:
            now = self._clock()
            self._wanting = {w: at for w, at in self._wanting.items() if now - at < WANT_MEMORY_S}
            counts = self._counts()
            mine = counts.get(scope, 0)
            if per_scope is not None and mine >= per_scope:
                raise ShareRefused("scope")
            fair = max(1, capacity // len(set(counts) | set(self._wanting) | {scope}))
            occupied = sum(1 for s in self._shares if s.state != "waiting")
            if occupied < capacity:
                if mine >= fair and any(w != scope and counts.get(w, 0) < fair for w in self._wanting):
                    raise ShareRefused("process")  # leave it to a refused scope below its share
                return self._add(scope, "running")
            victim = self._victim(counts, fair, scope) if preempt and mine < fair else None
            if victim is None:
                self._wanting[scope] = now
                raise ShareRefused("process")
            victim.state = "yielding"
            victim.stop.set()
            API_SHARE_YIELDS.labels(kind=self.kind).inc()
            share = self._add(scope, "waiting")
            if self._cond.wait_for(lambda: share.state == "running", timeout=handoff_s):
                return share
            self._shares.remove(share)  # the victim did not give its thread back in time
            self._wanting[scope] = self._clock()
            raise ShareRefused("process")

    def _counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for s in self._shares:
            if s.state != "yielding":
                counts[s.scope] = counts.get(s.scope, 0) + 1
        return counts

    def _victim(self, counts: dict[str, int], fair: int, scope: str) -> Share | None:
        """The oldest running share of the scope holding the most, if it holds more than its fair
        share (ties: the scope whose oldest running share is the oldest)."""
        oldest: dict[str, Share] = {}
        for s in self._shares:
            if s.state == "running" and s.scope != scope and counts[s.scope] > fair:
                oldest.setdefault(s.scope, s)
        if not oldest:
            return None
        return min(oldest.values(), key=lambda s: (-counts[s.scope], s.seq))

    def _add(self, scope: str, state: State) -> Share:
        share = Share(scope=scope, seq=next(self._seq), state=state, pool=self)
        self._shares.append(share)
        return share

    def _release(self, share: Share) -> None:
        with self._cond:
            if share not in self._shares:
                return
            self._shares.remove(share)
            waiting = next((s for s in self._shares if s.state == "waiting"), None)
            if waiting is not None and share.state != "waiting":  # its thread is free: hand it over
                waiting.state = "running"
                self._cond.notify_all()
