"""A task whose job ended while it ran, and whose run then failed with a retryable error (SPEC §4.4).

The retry requeued it with its cancel request still set: queued, so the lease-expired step never
looked at it again, and never claimable (a claim skips cancel-requested tasks) — yet active for
dedupe, so the next job of its image (a user's "process" again, a batch) linked its stage to it and
waited forever, re-hinted at every sweep for nothing. Such a retry now ends the task cancelled,
as a worker's stop is recorded; a request some open stage still waits past is withdrawn instead.
"""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import text

from app.orchestrator import Orchestrator, RecordingPublisher
from app.stages.errors import RetryableError
from app.stages.providers import Providers
from tests.support.agents import Clock, CountingAgent, CountingPolicy, providers_with, rows, step
from tests.support.clock import FakeClock
from tests.support.pipeline import drive, png_bytes, store_and_ingest, visual_task

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)


def _task(engine, task_id):
    return rows(engine, "SELECT status, cancel_requested FROM tasks WHERE id = :t", t=task_id)[0]


def _claimed_visual_task(engine, settings, seed: int):
    """An uploaded image's visual task, claimed by "worker" (the clock is a FakeClock)."""
    clock = FakeClock()
    orch = Orchestrator(engine, settings, clock=clock)
    pub, providers = RecordingPublisher(), Providers(settings)
    res = store_and_ingest(orch, "local", png_bytes(seed))
    task_id = visual_task(res).task_id
    pub.drain()
    claim = orch.claim_task(task_id, "worker")
    assert claim is not None
    return orch, clock, pub, providers, res, task_id, claim


def test_a_retryable_failure_of_a_cancelled_task_ends_it_and_the_next_job_completes(engine, settings):
    orch, clock, pub, providers, res, task_id, claim = _claimed_visual_task(engine, settings, 31)
    orch.cancel_job("local", res.job["id"])  # running: cancel requested
    assert _task(engine, task_id) == ("running", True)
    # the handler was already failing: the worker records its retryable error
    orch.fail_task(claim, RetryableError("provider timed out", code="timeout"))

    clock.advance(5)
    again = orch.request_processing("local", res.image["id"])
    pub.publish(again.hints)
    drive(orch, pub, providers, clock, rounds=4)
    job = orch.get_job("local", again.job["id"])
    assert job["status"] == "succeeded", (job, _task(engine, task_id))
    assert again.job["stages"][0]["task_id"] != str(task_id)  # a fresh task, not the dead one
    assert rows(engine, "SELECT status, error->>'code', completed_at IS NOT NULL FROM tasks WHERE id = :t",
                t=task_id) == [("cancelled", "cancelled", True)]


def test_a_retryable_failure_of_a_task_a_job_still_waits_on_is_requeued_without_the_request(engine, settings):
    """A cancel request an open stage waits past (set by hand here, as the sweep test does) is
    withdrawn by the requeue: the task stays claimable and its job completes."""
    orch, clock, pub, providers, res, task_id, claim = _claimed_visual_task(engine, settings, 32)
    with engine.begin() as conn:
        conn.execute(text("UPDATE tasks SET cancel_requested = true WHERE id = :t"), {"t": task_id})
    orch.fail_task(claim, RetryableError("provider timed out", code="timeout"))
    assert _task(engine, task_id) == ("queued", False)
    drive(orch, pub, providers, clock, rounds=4)
    assert orch.get_job("local", res.job["id"])["status"] == "succeeded"
    assert _task(engine, task_id)[0] == "succeeded"


def test_a_cancelled_agent_task_whose_call_provably_did_not_happen_frees_its_slot(engine, settings):
    """The agent lane: the slot goes back (the next waiting task is hinted), the attempt is closed
    failed, and a later job of the image gets a task of its own and completes."""
    clock = Clock(T0)
    orch = Orchestrator(engine, settings.replace(agent_lane_limit=1), clock=clock, policy=CountingPolicy())
    agent = CountingAgent(results_dir=str(settings.agent_results_path))
    providers, pub = providers_with(orch.settings, agent), RecordingPublisher()
    res = store_and_ingest(orch, "local", png_bytes(33))
    pub.publish(res.hints)
    hint = step(orch, providers, pub, stop_lane="agent")
    assert hint is not None
    claim = orch.claim_task(hint.task_id, "worker")
    assert claim is not None and claim.attempt_id
    orch.cancel_job("local", res.job["id"])
    other = store_and_ingest(orch, "local", png_bytes(34))
    pub.publish(other.hints)
    waiting = step(orch, providers, pub, stop_lane="agent")
    assert waiting is not None and orch.claim_task(waiting.task_id, "w") is None  # refused: no free slot

    hints = orch.fail_task(claim, RetryableError("connection refused", code="connect", not_executed=True))
    assert _task(engine, claim.task_id) == ("cancelled", True)
    assert rows(engine, "SELECT state FROM task_attempts WHERE task_id = :t", t=claim.task_id) == [("failed",)]
    assert rows(engine, "SELECT count(*) FROM lane_slots WHERE task_id = :t", t=claim.task_id) == [(0,)]
    assert waiting.task_id in {h.task_id for h in hints}  # the freed slot goes to the waiting task
    pub.publish(hints)
    step(orch, providers, pub)
    assert orch.get_job("local", other.job["id"])["status"] == "succeeded"

    clock.advance(seconds=5)
    again = orch.request_processing("local", res.image["id"])
    pub.publish(again.hints)
    step(orch, providers, pub)
    assert orch.get_job("local", again.job["id"])["status"] == "succeeded"


def test_0026_repairs_tasks_the_old_retry_left_queued_with_a_cancel_request(engine, db_url, settings):
    """Two tasks stranded as the old retry left them (queued, cancel requested): one a later job of
    its image waits on, one nothing waits on. The migration withdraws the first's request (it runs
    and the waiting job completes) and ends the second cancelled (the image's next job gets a task
    of its own)."""
    from alembic import command

    from app.db.engine import alembic_config

    orch, clock, pub, providers, waited, waited_task, _ = _claimed_visual_task(engine, settings, 35)
    alone = store_and_ingest(orch, "local", png_bytes(36))
    alone_task = visual_task(alone).task_id
    assert orch.claim_task(alone_task, "worker") is not None
    orch.cancel_job("local", waited.job["id"])
    orch.cancel_job("local", alone.job["id"])
    stranded = ("UPDATE tasks SET status = 'queued', lease_owner = NULL, lease_expires_at = NULL"
                " WHERE id = ANY(:t) AND cancel_requested")  # the old requeue: the request stayed
    with engine.begin() as conn:
        assert conn.execute(text(stranded), {"t": [waited_task, alone_task]}).rowcount == 2
    clock.advance(5)
    again = orch.request_processing("local", waited.image["id"])  # links its stage to the stranded task
    assert again.job["stages"][0]["task_id"] == str(waited_task)

    cfg = alembic_config(db_url)
    command.downgrade(cfg, "0025")
    command.upgrade(cfg, "0026")

    assert _task(engine, waited_task) == ("queued", False)
    assert _task(engine, alone_task) == ("cancelled", True)
    command.upgrade(cfg, "head")  # the code below is today's: it needs the later migrations too
    pub.publish(again.hints)
    clock.advance(settings.rehint_grace_s + 1)
    pub.publish(orch.sweep().hints)  # the request is gone: the re-hint wakes a worker for it
    drive(orch, pub, providers, clock, rounds=4)
    assert orch.get_job("local", again.job["id"])["status"] == "succeeded"
    later = orch.request_processing("local", alone.image["id"])
    assert later.job["stages"][0]["task_id"] != str(alone_task)  # a fresh task, not the dead one
    pub.publish(later.hints)
    drive(orch, pub, providers, clock, rounds=4)
    assert orch.get_job("local", later.job["id"])["status"] == "succeeded"
