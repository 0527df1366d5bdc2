"""Fencing rejections are counted per scope (migration 0030: one ``ops_counters`` row per bucket,
name and scope), so a completion whose batch mixes scopes — the batched lanes' fair fill does —
and has several claims fenced out takes several counter rows. It takes them in one global order
(by scope), never in its claims' image order: two such completions never deadlock on them.
Real threads against the real PostgreSQL."""

from __future__ import annotations

import threading
import uuid

from sqlalchemy import text

from app.orchestrator import Orchestrator
from app.orchestrator.store import counters
from app.orchestrator.types import Claim, VisualArtifact
from tests.conftest import poll_until
from tests.support.clock import FakeClock

# an insert into a unique index waits for the transaction that inserted the same key uncommitted
WAITING_ON_A_LOCK = text("SELECT EXISTS (SELECT 1 FROM pg_locks WHERE NOT granted AND locktype = 'transactionid')")


def _gone_claim(scope_id: str, image_int: int) -> Claim:
    """A visual claim whose task is gone (its image deleted while it ran): its completion is a
    fencing rejection counted for ``scope_id``."""
    return Claim(
        task_id=uuid.uuid4(), scope_id=scope_id, job_id=uuid.uuid4(), image_id=uuid.UUID(int=image_int),
        image_sha256="0" * 64, stage="visual", lane="visual", owner="zombie", generation=1, attempt_count=1,
        max_attempts=3, payload={}, storage_key="",
    )


def test_a_completion_counts_its_fenced_claims_in_scope_order(engine, settings):
    clock = FakeClock()
    orch = Orchestrator(engine, settings, clock=clock)
    for scope in ("scope-a", "scope-b"):
        orch.ensure_scope(scope)
    artifact = VisualArtifact([1.0] + [0.0] * 63, "deterministic-v1", "1", 64)
    # image order puts scope-b's claim first: a completion counting in image order takes scope-b's
    # counter row, then waits for scope-a's
    results = [(_gone_claim("scope-b", 1), artifact), (_gone_claim("scope-a", 2), artifact)]

    errors: dict[str, BaseException] = {}
    with engine.connect() as other:
        other_txn = other.begin()
        # another completion counting in scope order (a, then b) holds scope-a's row
        counters.bump_txn(other, "fencing_rejection", "scope-a", clock())

        def complete():
            try:
                assert orch.complete_tasks(results) == []
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors["complete"] = exc

        t = threading.Thread(target=complete, daemon=True)
        t.start()
        with engine.connect() as probe:
            poll_until(lambda: probe.execute(WAITING_ON_A_LOCK).scalar(), timeout=30,
                       what="the completion waiting for a counter row")
        try:
            counters.bump_txn(other, "fencing_rejection", "scope-b", clock())
            other_txn.commit()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors["other"] = exc
            other_txn.rollback()
        t.join(timeout=60)
    assert not t.is_alive()
    assert errors == {}
    with engine.connect() as c:
        counts = c.execute(text("SELECT scope_id, count FROM ops_counters WHERE name = 'fencing_rejection'"
                                " ORDER BY scope_id")).all()
    assert [tuple(r) for r in counts] == [("scope-a", 2), ("scope-b", 2)]
