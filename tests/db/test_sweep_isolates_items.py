"""One item a sweep step cannot repair must not keep the step from repairing the others.

The stuck-jobs step advanced its jobs one after the other and a job whose advance raised (a
custom operation policy that raises for one tenant, a row a planner bug cannot plan) ended the
step: every job behind it waited for the next sweep — where the same job came first again — and
once their tasks' completion fell out of the look-back window no sweep found them any more, so
they stayed queued for ever. The expired-leases step ends exhausted tasks the same way, one
raising end leaving the tasks behind it running (and their slots held) at every sweep."""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import text

from app.orchestrator import Orchestrator
from app.orchestrator import sweep as sweep_module
from tests.support.agents import rows
from tests.support.clock import FakeClock
from tests.support.pipeline import png_bytes, store_and_ingest, visual_task


def test_a_job_whose_advance_raises_does_not_keep_the_other_stuck_jobs_waiting(engine, settings, monkeypatch):
    clock = FakeClock(datetime.now(timezone.utc))
    orch = Orchestrator(engine, settings, clock=clock)
    orch.sweep()
    jobs = []
    for seed in range(4):
        res = store_and_ingest(orch, "local", png_bytes(9300 + seed))
        jobs.append(res.job["id"])
        with engine.begin() as conn:  # its task ends behind the orchestrator's back: a stuck job
            conn.execute(text("UPDATE tasks SET status = 'cancelled', completed_at = :t WHERE id = :id"),
                         {"t": clock(), "id": visual_task(res).task_id})
    real_advance = sweep_module.advance_job_txn
    poisoned: list = []

    def advance(orch_, conn, job_id):
        if not poisoned:
            poisoned.append(job_id)  # the first job the step advances can never be advanced
        if job_id == poisoned[0]:
            raise RuntimeError("the operation policy raised for this tenant")
        return real_advance(orch_, conn, job_id)

    monkeypatch.setattr(sweep_module, "advance_job_txn", advance)
    clock.advance(settings.rehint_grace_s + 1)
    report = orch.sweep()
    assert [f["step"] for f in report.failed_steps] == ["stuck_jobs"]  # still told (sweep_state, /readyz)
    others = [j for j in jobs if str(j) != str(poisoned[0])]
    waiting = rows(engine, "SELECT count(*) FROM job_stages s JOIN tasks t ON t.id = s.task_id"
                           " WHERE s.job_id = ANY(:j) AND s.stage = 'visual' AND t.status = 'cancelled'", j=others)
    assert waiting == [(0,)]  # every other job now waits on a live task


def test_an_exhausted_task_whose_end_raises_does_not_keep_the_others_running(engine, settings, monkeypatch):
    clock = FakeClock()
    orch = Orchestrator(engine, settings.replace(max_attempts=1), clock=clock)
    claims = []
    for seed in range(3):
        res = store_and_ingest(orch, "local", png_bytes(9400 + seed))
        claims.append(orch.claim_task(visual_task(res).task_id, "dead-worker"))
    real_fail = sweep_module.fail_task
    poisoned: list = []

    def fail_task(orch_, claim, error, **kw):
        if not poisoned:
            poisoned.append(claim.task_id)
        if claim.task_id == poisoned[0]:
            raise RuntimeError("a custom policy raised")
        return real_fail(orch_, claim, error, **kw)

    monkeypatch.setattr(sweep_module, "fail_task", fail_task)
    clock.advance(settings.lease_s + settings.rehint_grace_s + 1)
    report = orch.sweep()
    assert [f["step"] for f in report.failed_steps] == ["expired_leases"]
    others = [c.task_id for c in claims if c.task_id != poisoned[0]]
    assert rows(engine, "SELECT status, count(*) FROM tasks WHERE id = ANY(:t) GROUP BY status", t=others) == [
        ("failed", 2)]
