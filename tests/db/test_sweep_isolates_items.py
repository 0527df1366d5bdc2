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


def test_a_batch_whose_seeding_raises_does_not_keep_other_batches_from_completing_or_seeding(
        engine, settings, monkeypatch):
    """The batch step seeded its heads one after the other, then completed the finished batches: a
    head whose page raised at every sweep (a custom policy raising for its tenant) ended the step
    first, so no batch of any tenant was seeded behind it or ever completed."""
    from app.orchestrator import batches as batches_module
    from tests.db.test_sweep_batches import _processed_image

    clock = FakeClock()
    orch = Orchestrator(engine, settings.replace(batch_page_size=1), clock=clock)
    _processed_image(orch, "small", 9500)
    [small_image] = rows(engine, "SELECT id FROM images WHERE scope_id = 'small'")
    for seed in (9501, 9502):
        store_and_ingest(orch, "stuck", png_bytes(seed), process=False)
        store_and_ingest(orch, "other", png_bytes(seed + 10), process=False)
    stuck, _ = orch.create_batch("stuck", all=True)
    clock.advance(0.01)
    other, _ = orch.create_batch("other", all=True)
    assert orch.get_batch("stuck", stuck["id"])["status"] == orch.get_batch("other", other["id"])["status"] == "seeding"
    done, _ = orch.create_batch("small", image_ids=[str(small_image[0])])  # processed: nothing to run
    assert orch.get_batch("small", done["id"])["status"] == "running"
    real_seed = batches_module._seed_page

    def seed_page(orch_, batch_id, page_size):
        if str(batch_id) == str(stuck["id"]):
            raise RuntimeError("the operation policy raised for this tenant")
        return real_seed(orch_, batch_id, page_size)

    monkeypatch.setattr(batches_module, "_seed_page", seed_page)
    clock.advance(settings.sweep_interval_s)
    report = orch.sweep()
    assert [f["step"] for f in report.failed_steps] == ["batches"]
    assert orch.get_batch("small", done["id"])["status"] == "completed"
    assert orch.get_batch("other", other["id"])["total"] == 2  # its last page was seeded
