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
