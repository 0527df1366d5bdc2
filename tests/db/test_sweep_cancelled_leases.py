"""A task cancelled while it ran whose worker then died (SPEC §4.4, §4.9).

A claim refuses a cancel-requested task, so once its worker is gone nothing can run it again: it
stayed ``running`` forever, active for dedupe (a later job for the image linked to it and waited
forever), and re-hinted at every grace period, filling the lease-expired step's LIMIT so that
genuinely dead workers' tasks were no longer re-hinted. The sweep now ends such a task (cancelled,
its open paid attempt recorded ``unknown_execution``, slot freed) when no job waits on it, and
withdraws the cancel request — claimable again, §4.5 recovery on claim — when one does.
"""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import text

from app.orchestrator import Orchestrator, RecordingPublisher
from app.stages.errors import RetryableError
from app.stages.providers import Providers
from app.worker.run import handle_hint, run_task
from tests.support.agents import BlindAgent, Clock, CountingPolicy, providers_with, rows, step
from tests.support.clock import FakeClock
from tests.support.pipeline import png_bytes, store_and_ingest, visual_task

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)


def _drive(orch, pub, providers, clock, rounds=12):
    """Workers that handle every hint, plus the sweep, with time passing between rounds."""
    for _ in range(rounds):
        for hint in pub.drain():
            handle_hint(orch, hint.lane, hint.task_id, "live-worker", providers, pub)
        clock.advance(orch.settings.lease_s + orch.settings.rehint_grace_s + 1)
        pub.publish(orch.sweep().hints)


def _task(engine, task_id):
    return rows(engine, "SELECT status, cancel_requested FROM tasks WHERE id = :t", t=task_id)[0]


def test_a_job_deduplicated_onto_a_cancelled_task_of_a_dead_worker_completes(engine, settings):
    clock = FakeClock()
    orch = Orchestrator(engine, settings, clock=clock)
    pub, providers = RecordingPublisher(), Providers(settings)
    res = store_and_ingest(orch, "local", png_bytes(11))
    zombie = visual_task(res).task_id
    pub.drain()
    # a worker claims the visual task, the job is cancelled (running task: cancel requested) and
    # the worker is SIGKILLed; then the user processes the image again
    assert orch.claim_task(zombie, "worker-that-will-die") is not None
    orch.cancel_job("local", res.job["id"])
    assert _task(engine, zombie) == ("running", True)
    clock.advance(5)
    again = orch.request_processing("local", res.image["id"])
    pub.publish(again.hints)
    # the new job waits on the same execution (dedupe): the cancel request no longer speaks for anyone
    assert again.job["stages"][0]["task_id"] == str(zombie)
    assert _task(engine, zombie) == ("running", False)

    _drive(orch, pub, providers, clock)

    job = orch.get_job("local", again.job["id"])
    assert job["status"] == "succeeded", (job, _task(engine, zombie))
    assert _task(engine, zombie)[0] == "succeeded"  # re-claimed once its lease expired, and finished


def test_the_sweep_withdraws_the_cancel_request_of_a_task_a_job_still_waits_on(engine, settings):
    """A stage linked to a cancel-requested task (rows from before the dedupe withdrew requests,
    or by hand here) is not abandoned: the request is withdrawn and the task re-hinted."""
    clock = FakeClock()
    orch = Orchestrator(engine, settings, clock=clock)
    pub, providers = RecordingPublisher(), Providers(settings)
    res = store_and_ingest(orch, "local", png_bytes(12))
    task_id = visual_task(res).task_id
    assert orch.claim_task(task_id, "dead") is not None
    with engine.begin() as conn:
        conn.execute(text("UPDATE tasks SET cancel_requested = true WHERE id = :t"), {"t": task_id})
    clock.advance(settings.lease_s + settings.rehint_grace_s + 1)
    report = orch.sweep()
    assert report.counts["cancelled_abandoned"] == 0 and report.counts["lease_expired"] == 1
    assert task_id in {h.task_id for h in report.hints}
    assert _task(engine, task_id) == ("running", False)
    pub.publish(report.hints)
    _drive(orch, pub, providers, clock, rounds=4)
    assert orch.get_job("local", res.job["id"])["status"] == "succeeded"


def test_a_cancelled_task_of_a_dead_worker_that_nobody_waits_for_is_ended_by_the_sweep(engine, settings):
    clock = FakeClock()
    orch = Orchestrator(engine, settings, clock=clock)
    res = store_and_ingest(orch, "local", png_bytes(13))
    task_id = visual_task(res).task_id
    claim = orch.claim_task(task_id, "dead")
    assert claim is not None
    orch.cancel_job("local", res.job["id"])
    clock.advance(settings.lease_s - 1)
    assert orch.sweep().counts["cancelled_abandoned"] == 0  # the lease still runs: the worker may be alive
    clock.advance(settings.rehint_grace_s + 2)
    report = orch.sweep()
    assert report.counts["cancelled_abandoned"] == 1 and report.counts["lease_expired"] == 0
    assert task_id not in {h.task_id for h in report.hints}  # nothing to claim: not re-hinted
    assert rows(engine, "SELECT status, error->>'code', completed_at IS NOT NULL, lease_expires_at FROM tasks"
                        " WHERE id = :t", t=task_id) == [("cancelled", "cancelled", True, None)]
    assert orch.get_job("local", res.job["id"])["status"] == "cancelled"
    # a late write of that execution is fenced out
    assert orch.heartbeat(claim) is False
    assert orch.fail_task(claim, RetryableError("late", code="late")) == []
    assert rows(engine, "SELECT status FROM tasks WHERE id = :t", t=task_id) == [("cancelled",)]
    clock.advance(settings.lease_s + settings.rehint_grace_s + 1)
    assert orch.sweep().counts["cancelled_abandoned"] == 0  # ended once


def test_cancelled_tasks_of_dead_workers_no_longer_crowd_real_expired_leases_out_of_the_sweep(engine, settings):
    """Six zombies (3x the step's LIMIT of 2, at the documented 15 s interval / 30 s grace) used to
    be re-hinted forever, oldest lease first, so a genuinely dead worker's task never was."""
    s = settings.replace(sweep_batch_limit=2, sweep_interval_s=15.0, rehint_grace_s=30.0, lease_s=60.0,
                         heartbeat_s=20.0)
    clock = FakeClock()
    orch = Orchestrator(engine, s, clock=clock)
    for i in range(6):  # six cancelled-while-running tasks whose workers died
        res = store_and_ingest(orch, "local", png_bytes(100 + i))
        assert orch.claim_task(visual_task(res).task_id, f"dead-{i}") is not None
        orch.cancel_job("local", res.job["id"])
    clock.advance(1)
    real = store_and_ingest(orch, "local", png_bytes(200))  # a live job whose worker then died
    real_task = visual_task(real).task_id
    assert orch.claim_task(real_task, "dead-real") is not None
    clock.advance(s.lease_s + 1)
    rehinted_real = False
    for _ in range(40):  # 10 minutes of sweeps at the documented cadence
        report = orch.sweep()
        rehinted_real |= any(h.task_id == real_task for h in report.hints)
        clock.advance(s.sweep_interval_s)
    assert rehinted_real, "the dead worker's live task was never re-hinted: zombies took every slot of the step"
    assert rows(engine, "SELECT count(*) FROM tasks WHERE status = 'running' AND cancel_requested") == [(0,)]


def test_a_cancelled_agent_task_whose_worker_died_mid_call_is_recorded_honestly(engine, settings):
    """The paid call's outcome is unknown: the attempt ends unknown_execution and the grant stays
    counted (unknown, never released); nothing is called again, and the slot is free for others."""
    clock = Clock(T0)
    policy = CountingPolicy()
    orch = Orchestrator(engine, settings.replace(agent_lane_limit=1), clock=clock, policy=policy)
    agent = BlindAgent(results_dir=str(settings.agent_results_path))
    providers, pub = providers_with(orch.settings, agent), RecordingPublisher()
    res = store_and_ingest(orch, "local", png_bytes(14))
    pub.publish(res.hints)
    hint = step(orch, providers, pub, stop_lane="agent")
    assert hint is not None
    claim = orch.claim_task(hint.task_id, "doomed-worker")  # commits an external_started attempt
    assert claim is not None and claim.attempt_id
    orch.cancel_job("local", res.job["id"])
    # another image's agent task waits for the lane's only slot
    other = store_and_ingest(orch, "local", png_bytes(15))
    pub.publish(other.hints)
    waiting = step(orch, providers, pub, stop_lane="agent")
    assert waiting is not None and orch.claim_task(waiting.task_id, "w") is None  # refused: no free slot

    clock.advance(seconds=settings.lease_s + settings.rehint_grace_s + 1)
    report = orch.sweep()
    assert report.counts["cancelled_abandoned"] == 1
    assert rows(engine, "SELECT status FROM tasks WHERE id = :t", t=claim.task_id) == [("cancelled",)]
    assert rows(engine, "SELECT state FROM task_attempts WHERE task_id = :t",
                t=claim.task_id) == [("unknown_execution",)]
    assert rows(engine, "SELECT state FROM operation_grants WHERE task_id = :t", t=claim.task_id) == [("unknown",)]
    assert rows(engine, "SELECT count(*) FROM lane_slots WHERE task_id = :t", t=claim.task_id) == [(0,)]
    assert waiting.task_id in {h.task_id for h in report.hints}  # the freed slot goes to the waiting task
    assert agent.calls == {}  # the sweep never calls a provider
    assert run_task(orch, claim.task_id, "late", providers, pub) == "dropped"
    pub.publish(report.hints)
    step(orch, providers, pub)
    assert orch.get_job("local", other.job["id"])["status"] == "succeeded"
