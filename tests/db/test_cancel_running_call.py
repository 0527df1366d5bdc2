"""What a user sees after cancelling a job whose agent call is running (docs/architecture.md, "A
cancelled task whose worker died", first paragraph): the job reads ``cancelled`` at once; the call
is not interrupted, keeps its lease and its lane slot while it runs (the request is in flight);
when it returns its fenced completion lands — the answer kept on the image, the attempt closed,
the grant committed — the job is not revived, and the slot goes to the task that waited for it."""

from __future__ import annotations

import dataclasses
import threading
import time

from app.orchestrator import Orchestrator, RecordingPublisher
from app.worker.run import handle_hint
from tests.support.agents import CountingAgent, providers_with, rows, step
from tests.support.pipeline import png_bytes, store_and_ingest


class GatedAgent(CountingAgent):
    """Parks inside its call until released (a long paid call)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.entered, self.release = threading.Event(), threading.Event()

    def describe(self, image, *, attempt_id: str, reverse_image_policy: str):
        self.entered.set()
        assert self.release.wait(60)
        return super().describe(image, attempt_id=attempt_id, reverse_image_policy=reverse_image_policy)


def _poll(fn, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if fn():
            return
        time.sleep(0.02)
    raise AssertionError("condition not reached before the deadline")


def test_cancelling_a_job_mid_call_reads_cancelled_at_once_and_the_call_lands_without_reviving_it(engine, settings):
    s = dataclasses.replace(settings, agent_lane_limit=1, heartbeat_s=0.05, agent_batch_size=1)
    orch = Orchestrator(engine, s)
    agent = GatedAgent(results_dir=str(s.agent_results_path))
    providers, pub = providers_with(s, agent), RecordingPublisher()
    a = store_and_ingest(orch, "tenant-a", png_bytes(9100))
    pub.publish(a.hints)
    hint_a = step(orch, providers, pub, stop_lane="agent")
    b = store_and_ingest(orch, "tenant-b", png_bytes(9101))
    pub.publish(b.hints)
    hint_b = step(orch, providers, pub, stop_lane="agent")
    runner = threading.Thread(target=handle_hint, args=(orch, "agent", hint_a.task_id, "w1", providers, pub))
    runner.start()
    try:
        assert agent.entered.wait(30)
        assert orch.claim_agent_batch(hint_b.task_id, 1, "w2") == []  # the one slot is A's
        pub.drain()
        orch.cancel_job("tenant-a", a.job["id"])
        assert orch.get_job("tenant-a", a.job["id"])["status"] == "cancelled"  # at once
        before = rows(engine, "SELECT lease_expires_at FROM tasks WHERE id = :t", t=hint_a.task_id)[0][0]
        # the call goes on: its heartbeat still extends the lease, its slot is still held
        _poll(lambda: rows(engine, "SELECT lease_expires_at FROM tasks WHERE id = :t", t=hint_a.task_id)[0][0] > before)
        assert rows(engine, "SELECT status, cancel_requested FROM tasks WHERE id = :t", t=hint_a.task_id) == [
            ("running", True)]
        assert rows(engine, "SELECT count(*) FROM lane_slots WHERE task_id = :t", t=hint_a.task_id) == [(1,)]
    finally:
        agent.release.set()
        runner.join(60)
    assert not runner.is_alive()
    assert rows(engine, "SELECT status FROM tasks WHERE id = :t", t=hint_a.task_id) == [("succeeded",)]
    assert orch.get_job("tenant-a", a.job["id"])["status"] == "cancelled"  # not revived
    assert rows(engine, "SELECT state FROM task_attempts WHERE task_id = :t", t=hint_a.task_id) == [("completed",)]
    assert rows(engine, "SELECT g.state FROM operation_grants g JOIN tasks t ON t.grant_id = g.id WHERE t.id = :t",
                t=hint_a.task_id) == [("committed",)]
    assert orch.get_image("tenant-a", a.image["id"])["context_status"] == "ready"  # the answer is kept
    assert rows(engine, "SELECT count(*) FROM lane_slots WHERE task_id = :t", t=hint_a.task_id) == [(0,)]
    # the freed slot went to B's waiting task: hinted by that completion
    assert hint_b.task_id in [h.task_id for h in pub.drain() if h.lane == "agent"]
