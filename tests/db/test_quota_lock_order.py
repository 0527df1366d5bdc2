"""The quota policy's per-scope locks are taken in one global order (SPEC §4.6), so completions
whose batches mix scopes — the batched lanes' fair fill does — never deadlock on them. Real
threads against the real PostgreSQL."""

from __future__ import annotations

import threading
import uuid

from sqlalchemy import text

from app.orchestrator import Orchestrator, grants
from app.orchestrator.policy import QuotaPolicy
from tests.conftest import poll_until
from tests.support.agents import rows

WAITING_ON_ADVISORY = text(
    "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
    " AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))"
)


class _PausingQuota(QuotaPolicy):
    """QuotaPolicy that, once a thread holds its first scope's lock, waits until the other thread
    holds one too or is blocked on one: the interleaving two concurrent completions can take."""

    def __init__(self, engine, limit: int):
        super().__init__(limit)
        self.engine = engine
        self.holding = {name: threading.Event() for name in ("t1", "t2")}

    def acquire(self, conn, scope_id, operation, idempotency_key, now):
        answer = super().acquire(conn, scope_id, operation, idempotency_key, now)
        me = threading.current_thread().name
        if not self.holding[me].is_set():
            self.holding[me].set()
            other = self.holding["t2" if me == "t1" else "t1"]
            with self.engine.connect() as c:
                poll_until(lambda: other.is_set() or c.execute(WAITING_ON_ADVISORY).scalar(),
                           timeout=30, what="the other completion holding or waiting for a scope lock")
        return answer


def test_two_completions_with_scopes_in_opposite_orders_do_not_deadlock(engine, settings):
    policy = _PausingQuota(engine, limit=100)
    orch = Orchestrator(engine, settings, policy=policy)
    for scope in ("scope-a", "scope-b"):
        orch.ensure_scope(scope)

    def job(scope):
        return {"id": uuid.uuid4(), "scope_id": scope, "image_id": uuid.uuid4()}

    orders = {"t1": [job("scope-a"), job("scope-b")], "t2": [job("scope-b"), job("scope-a")]}
    errors: dict[str, BaseException] = {}
    answers: dict[str, list] = {}

    def complete(name):
        try:
            with engine.begin() as conn:
                answers[name] = grants.agent_grants_txn(orch, conn, [(j, "fp") for j in orders[name]])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors[name] = exc

    threads = [threading.Thread(target=complete, args=(n,), name=n, daemon=True) for n in orders]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert errors == {}
    assert all(isinstance(a, uuid.UUID) for n in answers for a in answers[n]) and len(answers) == 2
    assert rows(engine, "SELECT scope_id, count(*) FROM operation_grants GROUP BY 1 ORDER BY 1") == [
        ("scope-a", 2), ("scope-b", 2)]
