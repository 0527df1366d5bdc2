"""The sweep fails an exhausted task for its dead worker only while the lease is still expired.

Between the sweep's read of expired leases and the transaction that fails an exhausted one, a
worker that was only slow (a long pause, a database restart) may renew its lease. Failing it then
threw away a live execution (for the agent: a paid call whose answer was coming) and ended the
job ``max_attempts_exceeded``."""

from __future__ import annotations

from sqlalchemy import text

from app.orchestrator import Orchestrator
from app.orchestrator import sweep as sweep_module
from tests.support.clock import FakeClock
from tests.support.pipeline import png_bytes, store_and_ingest, visual_task


def _task(engine, task_id):
    with engine.connect() as conn:
        return conn.execute(text("SELECT status, error FROM tasks WHERE id = :t"), {"t": task_id}).one()


def test_a_lease_renewed_after_the_sweeps_read_is_not_failed(engine, settings, monkeypatch):
    clock = FakeClock()
    orch = Orchestrator(engine, settings.replace(max_attempts=1), clock=clock)
    res = store_and_ingest(orch, "local", png_bytes(71))
    claim = orch.claim_task(visual_task(res).task_id, "slow-worker")
    assert claim is not None and claim.attempt_count == claim.max_attempts == 1
    clock.advance(settings.lease_s + settings.rehint_grace_s + 1)

    real_fail_task = sweep_module.fail_task
    renewed = []

    def heartbeat_first(orch_, claim_, error, **kw):
        renewed.append(orch.heartbeat(claim))  # the worker wakes up between the read and the end
        return real_fail_task(orch_, claim_, error, **kw)

    monkeypatch.setattr(sweep_module, "fail_task", heartbeat_first)
    orch.sweep()
    assert renewed == [True]
    assert _task(engine, claim.task_id).status == "running"
    assert orch.get_job("local", res.job["id"])["status"] == "running"


def test_a_lease_still_expired_is_failed(engine, settings):
    clock = FakeClock()
    orch = Orchestrator(engine, settings.replace(max_attempts=1), clock=clock)
    res = store_and_ingest(orch, "local", png_bytes(72))
    claim = orch.claim_task(visual_task(res).task_id, "dead-worker")
    clock.advance(settings.lease_s + settings.rehint_grace_s + 1)
    report = orch.sweep()
    assert report.counts["exhausted"] == 1
    task = _task(engine, claim.task_id)
    assert task.status == "failed" and task.error["code"] == "max_attempts_exceeded"
    assert not orch.heartbeat(claim)  # the dead worker's execution is fenced out
    job = orch.get_job("local", res.job["id"])
    assert job["status"] == "failed" and job["error"]["code"] == "max_attempts_exceeded"
