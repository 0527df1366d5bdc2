"""A job left waiting on a finished task, found by the sweep after beat was down (SPEC §4.9, §10).

A new job deduplicated onto a running task links its stage to it; when that task fails (or is
ended) between the dedupe's read and the link's commit — ``fail_task`` takes no image lock, so
nothing orders them — the failure ends no stage of the new job, which then waits on a finished
task. Only the sweep's stuck-jobs step moves such a job on, and it looked at tasks finished
within ``sweep_lookback_s`` of now: with beat down longer than that (a stopped container, a
broken schedule), the job was never found again and stayed queued forever. The window now also
reaches back from the last completed sweep, so whatever finished while no sweep ran is seen.
"""

from __future__ import annotations

import threading
from datetime import datetime, timezone

from app.orchestrator import Orchestrator, RecordingPublisher
from app.orchestrator.store import tasks as tasks_q
from app.stages.errors import PermanentError
from app.stages.providers import Providers
from tests.support.agents import rows
from tests.support.clock import FakeClock
from tests.support.pipeline import drive, png_bytes, store_and_ingest, visual_task


def test_a_job_linked_to_a_task_that_failed_meanwhile_is_advanced_after_beat_was_down(engine, settings, monkeypatch):
    # the clock starts at the database's (the sweep records its completion on the database's clock)
    clock = FakeClock(datetime.now(timezone.utc))
    orch = Orchestrator(engine, settings, clock=clock)
    pub, providers = RecordingPublisher(), Providers(settings)
    orch.sweep()  # beat ran until now
    res = store_and_ingest(orch, "local", png_bytes(41))
    task_id = visual_task(res).task_id
    pub.drain()
    claim = orch.claim_task(task_id, "worker")
    assert claim is not None
    orch.cancel_job("local", res.job["id"])  # the running task now serves no job

    # the user processes the image again: the new job's dedupe finds the task running, and the
    # worker's permanent failure commits (in another thread, a connection of its own) before the
    # new job links its stage to the task
    original = tasks_q.insert_task_txn
    failed = []

    def insert_then_fail(conn, values, now):
        inserted = original(conn, values, now)
        if not failed and not inserted.matched and inserted.row[0] == task_id:
            worker = threading.Thread(target=lambda: failed.append(
                orch.fail_task(claim, PermanentError("the decoder gave up", code="decode_failed"))))
            worker.start()
            worker.join(timeout=30)
            assert failed, "the worker's failure did not commit"
        return inserted

    monkeypatch.setattr(tasks_q, "insert_task_txn", insert_then_fail)
    again = orch.request_processing("local", res.image["id"])
    monkeypatch.setattr(tasks_q, "insert_task_txn", original)
    pub.publish(again.hints)
    assert again.job["stages"][0]["task_id"] == str(task_id)
    assert rows(engine, "SELECT status FROM tasks WHERE id = :t", t=task_id) == [("failed",)]

    # beat is down for longer than the look-back; the workers keep running
    clock.advance(settings.sweep_lookback_s + 600)
    report = orch.sweep()
    assert report.counts["jobs_advanced"] == 1, report.counts
    pub.publish(report.hints)
    drive(orch, pub, providers, clock, rounds=4)
    job = orch.get_job("local", again.job["id"])
    assert job["status"] == "succeeded", job


def test_more_stuck_jobs_than_one_batch_after_beat_was_down_are_all_advanced(engine, settings):
    """The first sweep after the outage found one batch (``sweep_batch_limit``); the next one's
    window reaches back only from that sweep, so the rest were never found again."""
    from sqlalchemy import text

    clock = FakeClock(datetime.now(timezone.utc))
    orch = Orchestrator(engine, settings.replace(sweep_batch_limit=2), clock=clock)
    orch.sweep()  # beat ran until now
    jobs = []
    for seed in range(5):
        res = store_and_ingest(orch, "local", png_bytes(50 + seed))
        jobs.append(res.job["id"])
        with engine.begin() as conn:  # its task ends behind the orchestrator's back
            conn.execute(text("UPDATE tasks SET status = 'cancelled', completed_at = :t WHERE id = :id"),
                         {"t": clock(), "id": visual_task(res).task_id})
    clock.advance(settings.sweep_lookback_s + 600)  # beat is down for longer than the look-back
    orch.sweep()
    clock.advance(settings.rehint_grace_s + 1)
    orch.sweep()
    stuck = rows(engine, "SELECT count(*) FROM job_stages s JOIN tasks t ON t.id = s.task_id"
                 " WHERE s.job_id = ANY(:j) AND s.stage = 'visual' AND t.status = 'cancelled'", j=jobs)
    assert stuck == [(0,)]  # every job's stage now waits on a live task
